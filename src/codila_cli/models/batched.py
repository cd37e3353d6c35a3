"""One forward for several sequences that each bring their own cached keys/values.

A row's call is a :class:`KVCall`: ``n`` new tokens (ids, or embeddings for the AR helper) at their
true positions, the per-layer K/V of ``T`` earlier tokens it attends to (a Fast-dLLM block cache, the
helper's context cache, or nothing), and the new rows it reads (``keep``). Rows are stacked into one
[R, n_max] forward, every part left-padded:

    keys   = [ past K/V, left-padded to T_max | new K/V, left-padded to n_max ]   [R, H, T_max + n_max, d]

The projections, norms and MLP run on the stacked tokens (a token's result does not depend on the other
rows); attention runs row by row on each row's own unpadded keys (models/native.py::Ragged), with the mask
it has alone (none for the bidirectional DLM, causal for the helper), at the positions it has alone (RoPE
from the explicit positions); each call's kept rows are projected onto the vocabulary on their own. The
stacked matrix products may still round fp32's last bit otherwise than a lone row's; in bf16, where the
padded, masked attention used to round a row otherwise, the bundled DLM's rows now decode as alone
(tests/test_batch.py). A call made by one row alone never comes here (decoding/batch.py runs it as the
row's own forward).

The native engine (models/native.py) runs it; other engines run their rows one by one
(:func:`supports`).
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
    """Stacked forward of ``calls`` on a native ``model``; per call: (raw logits [1, k, V] in the
    model's dtype, the new tokens' per-layer (keys, values) [1, H, n, d] when ``want_kv``, else None)."""
    from codila_cli.models.native import NativeCache

    emb = model.get_input_embeddings().weight
    device = emb.device
    n = max(c.new for c in calls)
    T = max(c.cached for c in calls)
    R = len(calls)
    x = torch.zeros((R, n, emb.shape[1]), dtype=emb.dtype, device=device)
    pos = torch.zeros((R, n), dtype=torch.long, device=device)
    for i, c in enumerate(calls):
        rows = emb[c.tokens.to(device)] if c.tokens.dim() == 1 else c.tokens.to(device=device, dtype=emb.dtype)
        x[i, n - c.new :] = rows
        pos[i, n - c.new :] = c.positions.to(device)
    cache = NativeCache()
    if T:
        layers = len(next(c.past for c in calls if c.past))
        for layer in range(layers):
            k0, v0 = next(c.past for c in calls if c.past)[layer]
            keys = k0.new_zeros((R, k0.shape[1], T, k0.shape[3]))
            values = v0.new_zeros((R, v0.shape[1], T, v0.shape[3]))
            for i, c in enumerate(calls):
                if c.past:
                    k, v = c.past[layer]
                    keys[i, :, T - k.shape[2] :] = k[0]
                    values[i, :, T - v.shape[2] :] = v[0]
            cache.update(keys, values, layer)
    from codila_cli.models.native import Ragged

    # each row attends to its own unpadded keys, as alone (native.Ragged): its result is its lone one
    mask = Ragged(tuple((T - c.cached, n - c.new) for c in calls), T, causal)
    with torch.inference_mode():
        h, cache = model.hidden_states(inputs_embeds=x, attention_mask={"full_attention": mask}, position_ids=pos,
                                       cache=cache, use_cache=True)
        # the kept rows only, each call's projected on its own (the shape it has alone)
        logits = torch.cat([F.linear(h[i, (n - c.new) + c.keep.to(device)], model.lm_head.weight)
                            for i, c in enumerate(calls)])  # [Σk, V]
    out = []
    start = 0
    for i, c in enumerate(calls):
        k = len(c.keep)
        kv = None
        if c.want_kv:
            kv = [(layer.keys[i : i + 1, :, T + n - c.new :], layer.values[i : i + 1, :, T + n - c.new :])
                  for layer in cache.layers]
        out.append((logits[start : start + k].unsqueeze(0), kv))
        start += k
    return out
