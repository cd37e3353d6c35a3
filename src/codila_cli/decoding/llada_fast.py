"""Fast-dLLM's decoding of LLaDA models (Wu et al., "Fast-dLLM", arXiv 2505.22618; NVlabs/Fast-dLLM
``llada/generate.py``): confidence-threshold parallel decoding in semi-autoregressive blocks, without a
cache or with its prefix or dual approximate KV cache. ``--decoder threshold --threshold-convention
fast-dllm`` on a LLaDA checkpoint (decoding/threshold.py dispatches here).

Canvas [1, P + L] cut into L / block_length blocks, left to right; each block loops until it has no mask
(with a cache, after at least one cached forward: the official loop runs one even when the block's first
forward committed all of it, drawing its noise and committing nothing):

* the forward: ``none``, the whole canvas; ``prefix``/``dual``, the whole canvas at the block's first
  forward (its keys and values kept: the prefix before the block, or everything), then only the canvas
  from the block on against the prefix's cache (``prefix``), or only the block against the prefix's and
  the suffix's (``dual``). No shift: row i is token i.
* x0 = argmax of the logits, with Gumbel noise in float64 at T > 0 (exp(l) / (−log U)^T, U of the
  forward's logits shape; the prefix loop draws it twice, the first unused, as the official loop does);
  confidence p(x0) under a float64 softmax, −inf outside the block's masked slots; the top-k over the
  forward's row, k = the masked slots: the first always committed, every other one at ≥ ``threshold``.

Intended differences: the mask is never chosen; early stop after a block; the dual cache's block keys are
attended after the suffix's (order-free over keys, so the same maths; the last bits of the fp32 sum may
differ from the official code, which keeps them in place).
"""

from __future__ import annotations

from typing import Any

import torch

from codila_cli.decoding.base import Canvas, DecodeResult
from codila_cli.decoding.events import OnStep, no_op


def _choose(logits: torch.Tensor, masked: torch.Tensor, temp: float, threshold: float, generator: Any,
            draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x0 [n], the row positions [k] to commit) for one forward's ``logits`` [n, V] and ``masked`` [n]."""
    z = logits
    for _ in range(draws if temp > 0 else 0):  # the official prefix loop draws a noise it never reads
        noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator, device=logits.device)
        z = logits.double().exp() / (-torch.log(noise)) ** temp
    x0 = z.argmax(-1)
    p = torch.softmax(logits.double(), dim=-1).gather(-1, x0[:, None]).squeeze(-1)
    row = torch.where(masked, p, float("-inf"))
    picked = torch.topk(row, int(masked.sum())).indices
    keep = torch.cat([picked[:1], picked[1:][row[picked[1:]] >= threshold]])
    return x0, keep


def decode_fast_dllm_llada(dlm: Any, prompt_ids: list[int], *, config: Any, generator: Any = None,
                           on_step: OnStep = no_op) -> DecodeResult:
    c = Canvas.start(prompt_ids=prompt_ids, config=config, dlm=dlm, on_step=on_step)
    P, B, n = c.prompt_len, config.block_length, c.x.shape[1]
    temp, mode = config.sampling.temperature, config.cache
    if config.max_new_tokens % B:
        raise ValueError(f"Fast-dLLM's blocks must tile the canvas: {B} does not divide {config.max_new_tokens}")
    for lo in range(P, n, B):
        hi, first, past, cached = lo + B, True, None, 0
        # the official cached loops run a cached forward after the block's first one even when that one
        # finished the block (its noise drawn, nothing committed): so does this one, or at T > 0 every later
        # block's draws would differ (issue 60), and at any T the forward count
        while first or bool((c.x[0, lo:hi] == c.mask_id).any()) or (mode != "none" and cached == 0):
            if mode == "none" or first:
                start, end, draws = 0, n, 1
                if mode == "none":
                    logits = dlm.logits(c.x)[0]
                else:
                    out, kv = dlm.kv_call(c.x, positions=None, past=None, keep=0, want_kv=True)
                    logits = out[0]
                    past = [(k[:, :, :lo], v[:, :, :lo]) if mode == "prefix" else
                            (torch.cat([k[:, :, :lo], k[:, :, hi:]], 2), torch.cat([v[:, :, :lo], v[:, :, hi:]], 2))
                            for k, v in kv]
            else:
                start, end, draws = lo, (n if mode == "prefix" else hi), (2 if mode == "prefix" else 1)
                pos = torch.arange(start, end, device=c.x.device)[None]
                logits = dlm.kv_call(c.x[:, start:end], positions=pos, past=past, keep=0)[0][0]
                cached += 1
            first = False
            span = c.x[0, start:end]
            masked = span == c.mask_id
            masked[hi - start :] = False  # only the block's slots
            x0, keep = _choose(logits, masked, temp, config.threshold, generator, draws)
            if c.wants_proposals:
                c.propose(masked.nonzero().flatten() + start - P, x0[masked])
            c.commit(keep + start - P, x0[keep], source="dlm", block=(lo - P, hi - P))
        if c.done():
            break
    return c.result()
