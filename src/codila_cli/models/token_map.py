"""A vocabulary bridge by token strings, for a DLM and an AR helper whose tokenizers give the same pieces
other ids (LLaDA's 126k vocabulary against a Qwen3 helper's; CoDiLA's soft conditioning, §3.3).

models/tokens.py::VocabBridge pairs equal ids and refuses a helper whose ids differ. :class:`TokenMap`
pairs the ids whose token strings are equal (byte-level BPE pieces such as ``Ġreturn``), minus control
tokens, and decoding/bridged.py::BridgedWriter runs the helper in its own vocabulary: π over the DLM's ids
is carried onto the paired AR ids, the committed text and forced tokens are mapped across, and the AR's
choices (restricted to paired ids) come back as DLM ids. A helper is accepted when end-of-text pairs and at
least ``MIN_COVERAGE`` of the DLM's ordinary tokens have a partner; ``coverage`` says how much of π
survives the crossing.
"""

from __future__ import annotations

from typing import Any

MIN_COVERAGE = 0.25


def bridge_between(**pair: Any) -> Any:
    """The bridge for a DLM / helper pair (models/tokens.py::VocabBridge's keyword arguments): equal ids,
    else equal token strings (:class:`TokenMap`); IncompatibleModelsError with both measures when neither."""
    from codila_cli.errors import IncompatibleModelsError
    from codila_cli.models.tokens import VocabBridge

    try:
        return VocabBridge(**pair)
    except IncompatibleModelsError as same_ids:
        try:
            return TokenMap(**pair)
        except IncompatibleModelsError as by_strings:
            raise IncompatibleModelsError(f"{same_ids.message}; by token strings: {by_strings.message}",
                                          hint=by_strings.hint) from None


class TokenMap:
    """DLM id <-> AR id for equal token strings. ``dlm_ids`` / ``ar_ids`` [|S|] are the pairs;
    ``to_ar`` [V_dlm] and ``to_dlm`` [V_ar] hold the partner or −1."""

    def __init__(self, *, dlm_tokenizer: Any, ar_tokenizer: Any, dlm_specials: Any, ar_specials: Any,
                 dlm_vocab_rows: int, ar_vocab_rows: int, dlm_name: str = "dlm", ar_name: str = "ar") -> None:
        import torch

        from codila_cli.errors import IncompatibleModelsError

        d_tokens = dlm_tokenizer.convert_ids_to_tokens(list(range(min(len(dlm_tokenizer), dlm_vocab_rows))))
        a_tokens = ar_tokenizer.convert_ids_to_tokens(list(range(min(len(ar_tokenizer), ar_vocab_rows))))
        d_special = _specials(dlm_tokenizer)
        a_special = _specials(ar_tokenizer)
        cut_d = {dlm_specials.mask, dlm_specials.expand, dlm_specials.bos, dlm_specials.think_open, dlm_specials.think_close}
        cut_a = {ar_specials.think_open, ar_specials.think_close}
        a_index = {t: i for i, t in enumerate(a_tokens) if t is not None and i not in cut_a}
        pairs = [(i, a_index[t]) for i, t in enumerate(d_tokens)
                 if t is not None and i not in cut_d and t in a_index and (t not in d_special) == (t not in a_special)]
        regular = [t for t in d_tokens if t is not None and t not in d_special]
        self.coverage = sum(1 for t in regular if t in a_index) / max(1, len(regular))
        eos = d_tokens[dlm_specials.eos] if dlm_specials.eos < len(d_tokens) else None
        if eos is None or a_index.get(eos) is None:
            raise IncompatibleModelsError(f"the end-of-text token of '{dlm_name}' ({eos}) has no counterpart in '{ar_name}'",
                                          hint="CoDiLA needs both models to end text with the same token string")
        if self.coverage < MIN_COVERAGE:
            raise IncompatibleModelsError(
                f"the AR helper '{ar_name}' shares {self.coverage:.1%} of the DLM '{dlm_name}''s tokens (by their strings); "
                f"CoDiLA needs {MIN_COVERAGE:.0%}", hint="use a helper whose tokenizer is close to the DLM's")
        self.dlm_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)
        self.ar_ids = torch.tensor([a for _, a in pairs], dtype=torch.long)
        self.to_ar = torch.full((dlm_vocab_rows,), -1, dtype=torch.long)
        self.to_ar[self.dlm_ids] = self.ar_ids
        self.to_dlm = torch.full((ar_vocab_rows,), -1, dtype=torch.long)
        self.to_dlm[self.ar_ids] = self.dlm_ids
        self.dlm_vocab_rows, self.ar_vocab_rows = dlm_vocab_rows, ar_vocab_rows
        self.ar_eos = a_index[eos]
        self.inner = _ArSpace(self.ar_ids, ar_vocab_rows)
        self.shared_ids, self.contiguous = self.dlm_ids, False  # the DLM's side, as VocabBridge names it
        self.by = "strings"  # how the pair was made (VocabBridge: "ids")

    def pi_to_ar(self, pi: Any) -> Any:
        """π over the DLM's ids [..., V_dlm] -> π over the AR's ids [..., V_ar] (unpaired mass dropped)."""
        import torch

        out = torch.zeros((*pi.shape[:-1], self.ar_vocab_rows), dtype=pi.dtype, device=pi.device)
        out[..., self.ar_ids.to(pi.device)] = pi[..., self.dlm_ids.to(pi.device)]
        return out

    def ids_to_ar(self, ids: list[int]) -> list[int]:
        """DLM ids -> AR ids, the unpaired left out."""
        return [int(self.to_ar[t]) for t in ids if 0 <= t < len(self.to_ar) and int(self.to_ar[t]) >= 0]


def _specials(tokenizer: Any) -> set[str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(getattr(tokenizer, "all_special_tokens", ())) | {t.content for t in decoder.values()}


class _ArSpace:
    """The bridge the helper's writer runs with inside a TokenMap: the AR's own ids on both sides, outputs
    restricted to the paired ones (decoding/soft_ar.py reads these attributes)."""

    def __init__(self, ar_ids: Any, rows: int) -> None:
        import torch

        self.shared_ids = torch.sort(ar_ids).values
        self.contiguous = False
        self.dlm_vocab_rows = self.ar_vocab_rows = rows
        self.ar_allowed = torch.zeros(rows, dtype=torch.bool)
        self.ar_allowed[self.shared_ids] = True

    def restrict(self, pi: Any) -> Any:
        sub = pi.index_select(1, self.shared_ids.to(pi.device)).float()
        return sub / sub.sum(dim=1, keepdim=True).clamp_min(1e-12)
