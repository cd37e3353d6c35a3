"""Special tokens read from a checkpoint, and the DLM -> AR vocabulary bridge used by CoDiLA.

Token ids are never literals: they come from the tokenizer and the model config. The bridge decides
which DLM ids the AR helper may see and write (the *shared* ids) by comparing token strings id by id,
so Dream's `<|mask|>`/`<|expand|>` (151666/151667) never leak into Qwen3's `<tool_response>`/`<think>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codila_cli.errors import IncompatibleModelsError, ModelLoadError

if TYPE_CHECKING:  # pragma: no cover
    import torch

MASK_STRINGS = ("<|mask|>", "<|mdm_mask|>", "<|MASK|>", "<mask>", "[MASK]")  # Dream, LLaDA, SDAR, …
EXPAND_STRINGS = ("<|expand|>",)
END_OF_TURN_STRINGS = ("<|im_end|>", "<|eot_id|>")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the control tokens of one checkpoint (None where the checkpoint has no such token)."""

    mask: int | None
    eos: int
    pad: int
    bos: int | None
    end_of_turn: int | None
    expand: int | None
    think_open: int | None
    think_close: int | None

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a generation (eos, end of chat turn)."""
        return tuple(i for i in (self.eos, self.end_of_turn) if i is not None)


def _first_id(tokenizer: Any, strings: tuple[str, ...]) -> int | None:
    vocab = tokenizer.get_vocab()
    for s in strings:
        if s in vocab:
            return int(vocab[s])
    return None


def _cfg_id(config: dict, key: str) -> int | None:
    value = config.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) else None


def resolve_special_tokens(tokenizer: Any, config: dict, *, require_mask: bool, name: str,
                           mask_strings: tuple[str, ...] = ()) -> SpecialTokens:
    """Read special ids from tokenizer + config; refuse a DLM without a mask token. ``mask_strings``: the
    family's own mask token (models/families.py), tried before the common ones."""
    mask = _cfg_id(config, "mask_token_id")
    tok_mask = tokenizer.mask_token_id if getattr(tokenizer, "mask_token", None) else None
    tok_mask = tok_mask if tok_mask is not None else _first_id(tokenizer, (*mask_strings, *MASK_STRINGS))
    if mask is not None and tok_mask is not None and mask != tok_mask:
        raise ModelLoadError(
            f"'{name}': config mask_token_id {mask} differs from the tokenizer's mask token {tok_mask}",
            hint="fix config.json or tokenizer_config.json so both name the same mask token",
        )
    mask = mask if mask is not None else tok_mask
    if require_mask and mask is None:
        raise ModelLoadError(
            f"'{name}' has no mask token, so it cannot be used as a diffusion model",
            hint="a DLM needs mask_token_id in config.json or a <|mask|> token in its tokenizer",
        )
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else _cfg_id(config, "eos_token_id")
    if eos is None:
        raise ModelLoadError(f"'{name}' defines no end-of-text token", hint="set eos_token in tokenizer_config.json")
    pad = _cfg_id(config, "pad_token_id")
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else None
    return SpecialTokens(
        mask=mask,
        eos=int(eos),
        pad=int(pad),
        bos=bos,
        end_of_turn=_first_id(tokenizer, END_OF_TURN_STRINGS),
        expand=_first_id(tokenizer, EXPAND_STRINGS),
        think_open=_first_id(tokenizer, (THINK_OPEN,)),
        think_close=_first_id(tokenizer, (THINK_CLOSE,)),
    )


def load_tokenizer(path: Path, *, name: str, native: bool = False) -> Any:
    """A fast tokenizer from tokenizer.json + tokenizer_config.json; never custom (remote) classes.

    ``native`` (the checkpoint runs on models/native.py): without a chat template, the ``tokenizers``-only
    stand-in of models/native.py is returned, so transformers is never imported."""
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ModelLoadError(f"'{name}' has no tokenizer.json ({path})", hint="codila needs a fast tokenizer file")
    cfg: dict = {}
    if (path / "tokenizer_config.json").is_file():
        try:
            cfg = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"'{name}': unreadable tokenizer_config.json: {exc}",
                                 hint="the checkpoint is damaged: copy it again") from exc
    kwargs: dict[str, Any] = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token"):
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            kwargs[key] = value
    template = cfg.get("chat_template")
    if (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    has_template = isinstance(template, str) and bool(template.strip())
    try:
        if native and not has_template:
            from codila_cli.models.native_tokenizer import NativeTokenizer

            return NativeTokenizer(file, kwargs)
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast(tokenizer_file=str(file), **kwargs)
    except Exception as exc:  # tokenizers raises plain Exceptions on bad files
        raise ModelLoadError(f"'{name}': cannot read tokenizer.json: {exc}",
                             hint="the checkpoint is damaged: copy it again") from exc
    if has_template:
        tok.chat_template = template
    return tok


class VocabBridge:
    """Maps DLM marginals onto the AR helper's vocabulary (CoDiLA soft conditioning, §3.3).

    ``shared`` = ids whose token string is identical in both tokenizers, minus the DLM's control
    tokens (mask, expand, bos) and the AR's ``<think>``/``</think>``. π is cut to those ids and
    renormalised; the AR's outputs are restricted to the same ids (identity id map).
    """

    def __init__(self, *, dlm_tokenizer: Any, ar_tokenizer: Any, dlm_specials: SpecialTokens,
                 ar_specials: SpecialTokens, dlm_vocab_rows: int, ar_vocab_rows: int,
                 dlm_name: str = "dlm", ar_name: str = "ar") -> None:
        import torch

        d_tokens = dlm_tokenizer.convert_ids_to_tokens(list(range(len(dlm_tokenizer))))
        a_tokens = ar_tokenizer.convert_ids_to_tokens(list(range(len(ar_tokenizer))))
        n = min(len(d_tokens), len(a_tokens), dlm_vocab_rows, ar_vocab_rows)
        same = [d_tokens[i] is not None and d_tokens[i] == a_tokens[i] for i in range(n)]
        specials = set(dlm_tokenizer.all_special_tokens) | {t.content for t in dlm_tokenizer.added_tokens_decoder.values()}
        regular = [i for i in range(n) if d_tokens[i] not in specials]
        uncovered = sum(1 for i in range(n, len(d_tokens)) if d_tokens[i] not in specials)
        agree = sum(same[i] for i in regular) / max(1, len(regular) + uncovered)
        if n == 0 or agree < 0.99:
            raise IncompatibleModelsError(
                f"the AR helper '{ar_name}' does not share a vocabulary with the DLM '{dlm_name}' "
                f"({agree:.1%} of the DLM's {len(regular) + uncovered} ordinary tokens exist with the same id in the AR)",
                hint="CoDiLA needs an AR helper with the DLM's tokenizer (e.g. Dream-Coder with Qwen3)",
            )
        for label, dlm_id, ar_id in (("end-of-text", dlm_specials.eos, ar_specials.eos),):
            if dlm_id >= n or not same[dlm_id] or d_tokens[dlm_id] != a_tokens[ar_id]:
                raise IncompatibleModelsError(
                    f"the {label} token differs between '{dlm_name}' and '{ar_name}'",
                    hint="CoDiLA needs both models to end text with the same token",
                )
        cut = {dlm_specials.mask, dlm_specials.expand, dlm_specials.bos,
               ar_specials.think_open, ar_specials.think_close, dlm_specials.think_open, dlm_specials.think_close}
        shared = [i for i in range(n) if same[i] and i not in cut]
        self.shared_ids = torch.tensor(shared, dtype=torch.long)
        self.contiguous = shared == list(range(len(shared)))
        self.dlm_vocab_rows = dlm_vocab_rows
        self.ar_vocab_rows = ar_vocab_rows
        allowed = torch.zeros(ar_vocab_rows, dtype=torch.bool)
        allowed[self.shared_ids] = True
        self.ar_allowed = allowed  # [V_ar] bool: which AR outputs are legal
        self.by, self.coverage = "ids", agree  # how the pair was made (TokenMap: "strings"), and its share

    def restrict(self, pi: torch.Tensor) -> torch.Tensor:
        """π over the DLM vocab [k, V_dlm] -> renormalised π over shared ids [k, |shared|] (fp32)."""
        ids = self.shared_ids.to(pi.device)
        sub = pi[:, : len(ids)] if self.contiguous else pi.index_select(1, ids)
        sub = sub.float()
        return sub / sub.sum(dim=1, keepdim=True).clamp_min(1e-12)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of user text (a prompt, a file's prefix and suffix) in which special-token strings are
    text: a file that contains the characters ``<|endoftext|>`` must not end the model's input there."""
    if hasattr(tokenizer, "encode_text"):  # models/native.py's stand-in
        return tokenizer.encode_text(text)
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])



PIECE_CHARS = 1 << 16  # a training document longer than this is encoded a piece at a time


def encode_long(tokenizer: Any, text: str, *, piece: int = PIECE_CHARS) -> list[int]:
    """:func:`encode_text` of a text of any length in bounded memory (issue 60: one 12 MiB JSON line drove
    ``train align`` to 4.5 GB). A text up to ``piece`` characters is encoded whole (the same ids); a longer
    one in pieces cut after a line break that a non-space character follows (where the pre-tokenizers of
    codila's families end a token anyway), else, in one line longer than ``piece``, at ``piece``."""
    if len(text) <= piece:
        return encode_text(tokenizer, text)
    ids: list[int] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + piece)
        if end < len(text):
            cut = end
            while cut > start and not (text[cut - 1] == "\n" and not text[cut].isspace()):
                cut -= 1
            end = cut if cut > start else end
        ids += encode_text(tokenizer, text[start:end])
        start = end
    return ids
