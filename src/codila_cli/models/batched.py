"""One forward for several sequences that each bring their own cached keys/values.

A row's call is a :class:`KVCall`: ``n`` new tokens (ids, or embeddings for the AR helper) at their
true positions, the per-layer K/V of ``T`` earlier tokens it attends to (a Fast-dLLM block cache, the
helper's context cache, or nothing), and the new rows it reads (``keep``). The rows' new tokens are
packed back to back into one [1, Σn] sequence:

    tokens = [ row 0's n_0 | row 1's n_1 | … ]      (no padding: a row costs its own tokens only)

The projections, norms and MLP run on the packed tokens (a token's result does not depend on the other
rows); attention runs row by row on the row's own cached and new keys (models/native.py::Packed), with
the mask it has alone (none for the bidirectional DLM, causal for the helper), at the positions it has
alone (RoPE from the explicit positions); each call's kept rows are projected onto the vocabulary on
their own. The packed matrix products may still round fp32's last bit otherwise than a lone row's; in
bf16, where a padded, masked attention used to round a row otherwise, the bundled DLM's rows decode as
alone (tests/test_batch.py). Packing replaced left-padding every row to the longest (session 29): the
padding was a fifth of a stacked forward's tokens in the server's default setting, and the per-layer
padded copies of every row's cache went with it. A call made by one row alone never comes here
(decoding/batch.py runs it as the row's own forward).

The native engine (models/native.py) runs it; on other engines (:func:`supports`) plain DLM forwards
are padded into one (:func:`padded`, Dream's padding convention; in a 16-bit dtype only rows of one
length share one, :func:`stackable`) and the others run row by row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class KVCall:
    """One row's forward: ``tokens`` [n] ids or [n, d] embeddings; ``positions`` [n]; ``past`` per-layer
    (keys, values) [1, H, T, d] or None; ``keep`` [k] indices into the n new rows; ``want_kv``: return
    the new tokens' K/V."""

    tokens: torch.Tensor
    positions: torch.Tensor
    past: list | None
    keep: torch.Tensor
    want_kv: bool = False

    @property
    def new(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def cached(self) -> int:
        return int(self.past[0][0].shape[2]) if self.past else 0


def supports(model: Any) -> bool:
    """Whether ``model`` can run a stacked call (the native engine: hidden states and head apart)."""
    from codila_cli.models.native import NativeLM

    return isinstance(model, NativeLM)


def run(model: Any, calls: list[KVCall], *, causal: bool) -> list[tuple[torch.Tensor, list | None]]:
    """Packed forward of ``calls`` on a native ``model``; per call: (raw logits [1, k, V] in the
    model's dtype, the new tokens' per-layer (keys, values) [1, H, n, d] when ``want_kv``, else None)."""
    from codila_cli.models.native import NativeCache, Packed

    emb = model.get_input_embeddings().weight
    device = emb.device
    starts, total = [], 0
    for c in calls:
        starts.append(total)
        total += c.new
    x = torch.cat([emb[c.tokens.to(device)] if c.tokens.dim() == 1 else c.tokens.to(device=device, dtype=emb.dtype)
                   for c in calls])[None]  # [1, Σn, d]
    pos = torch.cat([c.positions.to(device) for c in calls])[None]
    mask = Packed(tuple((s, c.new) for s, c in zip(starts, calls)), tuple(c.past or None for c in calls), causal)
    new_kv = NativeCache()  # collects the packed tokens' own keys/values, layer by layer
    with torch.inference_mode():
        h, new_kv = model.hidden_states(inputs_embeds=x, attention_mask={"full_attention": mask}, position_ids=pos,
                                        cache=new_kv, use_cache=True)
        # the kept rows only, each call's projected on its own (the shape it has alone)
        logits = [F.linear(h[0, s + c.keep.to(device)], model.lm_head.weight) for s, c in zip(starts, calls)]
    out = []
    for s, c, lg in zip(starts, calls, logits):
        kv = None
        if c.want_kv:
            kv = [(layer.keys[:, :, s : s + c.new], layer.values[:, :, s : s + c.new]) for layer in new_kv.layers]
        out.append((lg.unsqueeze(0), kv))
    return out


def stackable(dlm: Any, calls: list[KVCall]) -> list[list[int]]:
    """Which calls share one padded forward on an engine without packed rows: all of them in fp32 (a
    padded row equals its own forward up to float rounding), only calls of one length in a 16-bit dtype,
    where the padded, masked attention rounds a row otherwise and greedy text then depends on the batch
    (issue 52): rows of one length stack without padding, as they are alone."""
    if next(dlm.model.parameters()).dtype == torch.float32:
        return [list(range(len(calls)))]
    groups: dict[int, list[int]] = {}
    for i, c in enumerate(calls):
        groups.setdefault(c.new, []).append(i)
    return list(groups.values())


def padded(dlm: Any, calls: list[KVCall]) -> list[tuple[torch.Tensor, None]]:
    """Plain DLM forwards of several rows as one, on any engine: rows left-padded (positions count real
    tokens only, pads masked out of attention: DreamDenoiser.raw_logits), and only the union of the kept
    rows projected onto the vocabulary."""
    n = max(c.new for c in calls)
    device = calls[0].tokens.device
    batch = torch.full((len(calls), n), dlm.specials.eos, dtype=torch.long, device=device)
    mask = torch.zeros((len(calls), n), dtype=torch.long, device=device)
    for i, c in enumerate(calls):
        batch[i, n - c.new :] = c.tokens
        mask[i, n - c.new :] = 1
    wanted = [(n - c.new) + c.keep.to(device) for c in calls]
    union = torch.unique(torch.cat(wanted))
    logits = dlm.raw_logits(batch, attention_mask=None if bool(mask.all()) else mask, keep=union)
    dlm.forwards -= 1  # raw_logits counts it; the rows' own views count their share
    return [(logits[i : i + 1, torch.searchsorted(union, w)], None) for i, w in enumerate(wanted)]
