"""Dream-family diffusion LMs on transformers' Qwen2 modules, with bidirectional attention.

Dream keeps the autoregressive convention: the raw output at position i predicts token i+1. Every
consumer in codila gets *shifted* logits from :func:`shift_logits`, the one place the shift happens, so
that ``logits[:, i]`` predicts token ``i`` (Dream's ``generation_utils.py``). Position 0 has no predictor and keeps
its own row (it is never masked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codila_cli.models.loading import LoadedCheckpoint, build_model, engine_for
from codila_cli.models.tokens import load_tokenizer, resolve_special_tokens


def shift_index(start: int, end: int) -> Any:
    """Raw output rows that predict tokens [start, end): row i − 1 predicts token i; token 0 has no
    predictor and takes row 0. A [end − start] index tensor."""
    import torch

    return torch.arange(start - 1, end - 1).clamp_min(0)


def shift_logits(raw: Any) -> Any:
    """[B, N, V] raw Dream logits -> [B, N, V] where row i predicts token i (row 0 copied)."""
    return raw[:, shift_index(0, raw.shape[1]).to(raw.device)]


class DreamDenoiser:
    """A bidirectional diffusion network (Dream's Qwen2, LLaDA's, …) whose :meth:`logits` give row i the
    distribution of token i: shifted here when its family's row says the network predicts the next token
    (``Family.shifted``: Dream), returned as they are otherwise (LLaDA).

    Forward count is kept in ``forwards`` so decoders and tests can account NFEs.
    """

    def __init__(self, ckpt: LoadedCheckpoint, family: Any) -> None:
        self.family = family  # its models/families.py row: what it is and what runs it
        self.ckpt = ckpt
        self.model = ckpt.model
        self.tokenizer = ckpt.tokenizer
        self.specials = ckpt.specials
        self.device = ckpt.device
        self.name = ckpt.name
        self.forwards = 0

    @property
    def block_diffusion(self) -> bool:
        """Whether its family writes block by block against an exact cache (the row says)."""
        return self.family.block_diffusion

    @property
    def shifted(self) -> bool:
        """Whether the raw output at i predicts token i + 1 (the row says: Dream's does, LLaDA's does not)."""
        return self.family.shifted

    @property
    def context_length(self) -> int:
        return self.ckpt.context_length

    @property
    def vocab_rows(self) -> int:
        return self.ckpt.vocab_rows

    def raw_rows(self, start: int, end: int) -> Any:
        """The raw output rows that give tokens [start, end) (an index tensor): moved back by one on a
        shifted network (:func:`shift_index`), the same rows otherwise."""
        import torch

        return shift_index(start, end) if self.shifted else torch.arange(start, end)

    def raw_logits(self, x: Any, *, attention_mask: Any | None = None, keep: Any = 0) -> Any:
        """One full bidirectional forward. x: [B, N] ids; attention_mask: [B, N] (1 = real, 0 = pad);
        ``keep``: raw rows to project onto the vocabulary (an index tensor; 0 = all)."""
        import torch

        self.forwards += 1
        with torch.inference_mode():
            if attention_mask is None or bool(attention_mask.all()):
                out = self.model(input_ids=x, attention_mask={"full_attention": None}, use_cache=False,
                                 logits_to_keep=keep)
            else:
                # Dream's padding convention: positions count real tokens only; pads get position 1.
                position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
                keys = attention_mask.bool()[:, None, None, :].expand(-1, 1, x.shape[1], -1)  # [B, 1, N, N]
                out = self.model(input_ids=x, attention_mask={"full_attention": keys}, position_ids=position_ids,
                                 use_cache=False, logits_to_keep=keep)
        return out.logits

    def logits(self, x: Any, *, attention_mask: Any | None = None, pair_mask: Any | None = None,
               position_ids: Any | None = None, rows: tuple[int, int] | None = None) -> Any:
        """Logits [B, N, V] in fp32 where row i is the distribution of token i (a shifted network's raw rows
        moved by one: :func:`shift_logits`, the one place the shift happens).

        ``rows`` = (start, end): only tokens [start, end) → [B, end − start, V]; the vocabulary
        projection (a third of a small model's forward) then runs on those rows only.
        ``pair_mask`` [N, N] bool (query row may attend to key column) and ``position_ids`` [B, N] let
        SDDC isolate canvases; they replace ``attention_mask``.
        """
        import torch

        keep = self.raw_rows(*rows).to(x.device) if rows is not None else 0
        if pair_mask is None:
            out = self.raw_logits(x, attention_mask=attention_mask, keep=keep)
        else:
            self.forwards += 1
            with torch.inference_mode():
                out = self.model(input_ids=x, attention_mask={"full_attention": pair_mask[None, None]},
                                 position_ids=position_ids, use_cache=False, logits_to_keep=keep).logits
        return self.emittable(shift_logits(out) if self.shifted and rows is None else out)

    def logits_many(self, xs: Any, spans: list[tuple[int, int]]) -> list:
        """One forward of the canvases ``xs`` [d, N] (FreeDave's candidates: decoding/freedave.py) and, for each,
        the logits of its tokens [lo, hi) [hi − lo, V], projected on their own as :meth:`logits` projects a lone
        canvas's rows (the same product shape, so the same rounding as the lone call for the same hidden
        states). One forward counted."""
        import torch
        import torch.nn.functional as F

        self.forwards += 1
        with torch.inference_mode():
            if hasattr(self.model, "hidden_states"):  # models/native.py
                h = self.model.hidden_states(input_ids=xs, attention_mask={"full_attention": None})[0]
            else:  # transformers: the base model's last hidden state
                h = self.model.model(input_ids=xs, attention_mask={"full_attention": None}, use_cache=False).last_hidden_state
            head = self.model.lm_head.weight
            return [self.emittable(F.linear(h[i : i + 1, self.raw_rows(*span).to(h.device)], head)[0])
                    for i, span in enumerate(spans)]

    def kv_call(self, ids: Any, *, positions: Any | None, past: list | None, keep: Any,
                want_kv: bool = False) -> tuple[Any, list | None]:
        """One bidirectional forward of ``ids`` [1, n] at ``positions`` [1, n] (None: 0 … n − 1) that also
        attends to ``past`` (per-layer (keys, values), RoPE applied; None: nothing); returns (emittable
        logits [1, k, V] of the raw rows ``keep``, the per-layer K/V of every token the forward saw when
        ``want_kv``). The one model call of :class:`BlockCache` (a batch row's view stacks it with other
        rows' calls: decoding/batch.py)."""
        import torch

        from codila_cli.models.native import new_cache

        self.forwards += 1
        cache = new_cache(self.model)
        for i, (k, v) in enumerate(past or ()):
            cache.update(k, v, i)  # shared, never written: an update concatenates into new tensors
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask={"full_attention": None}, position_ids=positions,
                             cache=cache, use_cache=True, logits_to_keep=keep)
        kv = [(layer.keys, layer.values) for layer in out.cache.layers] if want_kv else None
        return self.emittable(out.logits), kv

    def emittable(self, logits: Any) -> Any:
        """fp32 logits with the mask token's column at the fp32 minimum: its probability is exactly 0, so
        a decoder can never commit ``<mask>`` (a small model sometimes ranks it first, and a committed
        mask would stay masked forever). The minimum rather than −inf keeps Σ p·z finite, so the
        sampler's entropy needs no clamping pass (decoding/marginals.py)."""
        import torch

        out = logits.float()  # a fresh model output (or its fp32 copy): filled in place, no [N, V] copy
        with torch.inference_mode():
            out[..., self.specials.mask] = torch.finfo(out.dtype).min
        return out


def load_dream(path: Path, cfg: dict, *, name: str, device: Any, dtype: Any, quantize: str = "none") -> DreamDenoiser:
    """A Dream-family checkpoint (``cfg`` its config.json); models/families.py::load_dlm picks the family."""
    tokenizer = load_tokenizer(path, name=name, native=engine_for(path, cfg) == "native")
    specials = resolve_special_tokens(tokenizer, cfg, require_mask=True, name=name)
    model = build_model(cfg, name=name, path=path, device=device, dtype=dtype, causal=False, quantize=quantize)
    return DreamDenoiser(LoadedCheckpoint(name, path, cfg, model, tokenizer, specials, device, dtype, quantize), FAMILY)


def _family() -> Any:
    from codila_cli.models.families import Family

    return Family("dream", ("dream",), ("dream", "threshold", "codila"), infill="expand/delete (DreamOn)", plan=True,
                  codila=True, cache="approximate (prefix, dual)", licence="Apache-2.0 (Dream-Coder, DreamOn)",
                  note="Dream-Coder, DreamOn (infill), DiffuCoder; Qwen2.5 vocabulary: Qwen3 helpers need no bridge",
                  aligns=True, context=2048, helper_cache=True, network="qwen2", shifted=True,  # context: Dream's README
                  load=load_dream)


FAMILY = _family()  # models/families.py reads this row


class BlockCache:
    """Fast-dLLM-style approximate KV cache for a Dream-family DLM (arXiv 2505.22618).

    :meth:`refresh` runs one full forward, keeps every layer's keys/values (RoPE already applied, so
    they are tied to their positions) and returns the exact shifted logits. Until the next refresh,
    :meth:`logits` runs only a slice of the sequence and attends to the cached (stale) K/V of the rest:

    * ``prefix``: the slice is ``[start − 1, N)``: everything from the token before the block on;
    * ``dual``: the slice is ``[start − 1, end)``: the block and the token before it; the suffix after
      the block comes from the cache too.

    The slice starts one token early because of Dream's shift: the first block slot is predicted by the
    raw output of the token before it (§1.3, §7 item 8). Attention is order-free over keys, so the cached
    context is simply the kept positions; the slice gets its true position ids.
    """

    def __init__(self, dlm: DreamDenoiser, mode: str) -> None:
        if not dlm.shifted:
            from codila_cli.errors import UsageError

            raise UsageError(f"codila's approximate KV cache runs Dream-family models; {dlm.name} is not one",
                             hint="for LLaDA: --decoder threshold --threshold-convention fast-dllm --cache prefix|dual "
                                  "(Fast-dLLM's own LLaDA caches), or drop --cache")
        if mode not in ("prefix", "dual"):
            raise ValueError(f"cache mode must be 'prefix' or 'dual', got {mode!r}")
        self.dlm, self.mode = dlm, mode
        self.keys: list = []
        self.values: list = []
        self.full_forwards = 0
        self._kept: tuple | None = None  # ((lo, hi, n), per-layer K/V outside the slice): one gather per window

    def refresh(self, x: Any, start: int, end: int, *, rows: tuple[int, int] | None = None) -> Any:
        """One full forward: keeps every layer's K/V; shifted logits [B, end − start, V] of tokens [start, end),
        or of tokens ``rows`` = [a, b) when given (a caller projects only the rows it reads)."""
        self.full_forwards += 1
        logits, kv = self.dlm.kv_call(x, positions=None, past=None, want_kv=True,
                                      keep=shift_index(*(rows or (start, end))).to(x.device))
        self.keys = [k for k, _ in kv]
        self.values = [v for _, v in kv]
        self._kept = None
        return logits

    def logits(self, x: Any, start: int, end: int, *, rows: tuple[int, int] | None = None,
               fast_dllm: bool = False) -> Any:
        """Shifted logits [B, end − start, V] for sequence positions [start, end), from the cache; with
        ``rows`` = [a, b) inside [start, end), the block [start, end) is still recomputed, but only those
        tokens' logits are projected: [B, b − a, V].

        ``fast_dllm``: Fast-dLLM's convention instead (decoding/threshold.py::decode_fast_dllm): the
        slice starts at the block itself and is shifted inside the slice, so the block's first token gets
        its own raw output row, not the previous token's; ``rows`` may then reach to the slice's end."""
        import torch

        dlm = self.dlm
        n = x.shape[1]
        lo = start if fast_dllm else max(1, start) - 1
        hi = n if self.mode == "prefix" else end
        if self._kept is None or self._kept[0] != (lo, hi, n):  # the same slice until the next refresh
            keep = torch.cat([torch.arange(0, lo), torch.arange(hi, n)]).to(x.device)
            self._kept = ((lo, hi, n), [(k.index_select(2, keep), v.index_select(2, keep))
                                        for k, v in zip(self.keys, self.values)])
        pos = torch.arange(lo, hi, device=x.device).unsqueeze(0)
        a, b = rows or (start, end)
        if not start <= a <= b <= (hi if fast_dllm else end):
            raise ValueError(f"rows [{a}, {b}) must lie inside the block [{start}, {end})")
        keep = (shift_index(a, b) - lo).clamp_min(0).to(x.device)  # raw row j predicts token lo + j + 1
        return dlm.kv_call(x[:, lo:hi], positions=pos, past=self._kept[1], keep=keep)[0]
