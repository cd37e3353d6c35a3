"""Dream's ``diffusion_generate`` (Ye et al., Dream 7B, arXiv 2508.15487; algorithms.md §1.4).

Canvas ``x`` [1, P+L]: prompt then L masks. Each iteration runs one DLM forward (shifted logits [M, V]
for the span from the first to the last masked slot: nothing else is read), processes the marginals of
the masked slots, and reveals ``n`` of them:

* ``steps`` schedule (Dream): t_k = linspace(1, eps, S+1); n = floor(#masked · (1 − t_{k+1}/t_k)), all
  remaining at the last step (float32 arithmetic, as upstream).
* ``tokens_per_step`` schedule (codila): n = min(K, #masked): exactly K per forward but the last.
* ``alg = origin``: each masked slot revealed independently with probability 1 − s/t.
* confidence algs: the n most confident slots (or n drawn from softmax(c / alg_temp)).

A step that reveals nothing leaves the canvas unchanged, so the next step reuses the same logits
instead of a new forward. Early stop (codila deviation, documented): once a stop token is committed
with nothing masked before it, the tail is filled with end-of-text and the loop ends.
"""

from __future__ import annotations

import torch

from codila_cli.decoding.base import Canvas, DecodeResult
from codila_cli.decoding.config import DreamConfig
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.decoding.marginals import sample_scored


def decode_dream(dlm, prompt_ids: list[int], *, config: DreamConfig, generator: torch.Generator | None = None,
                 on_step: OnStep = no_op) -> DecodeResult:
    c = Canvas.start(prompt_ids=prompt_ids, length=config.max_new_tokens, dlm=dlm, on_step=on_step,
                     stop_lines=config.stop)
    L, K = config.max_new_tokens, config.tokens_per_step
    steps = config.steps if config.steps is not None else (-(-L // K) if K else L)
    grid = torch.linspace(1, config.eps, steps + 1, dtype=torch.float32)
    logits, stale = None, True
    for i in range(steps if K is None else L):
        masked = c.masked()
        n_masked = int(masked.sum())
        if n_masked == 0:
            break
        idx = masked.nonzero().flatten()
        if stale:  # only the span of masked slots is projected onto the vocabulary
            lo = int(idx[0])
            logits = dlm.logits(c.x, rows=(c.prompt_len + lo, c.prompt_len + int(idx[-1]) + 1))[0]  # row j: slot lo + j
        if K is not None:
            n = min(K, n_masked)
        else:
            t, s = grid[min(i, steps - 1)], grid[min(i + 1, steps)]
            last = i >= steps - 1
            n = n_masked if last else int(torch.tensor(float(n_masked), dtype=torch.float32) * (1 - s / t))
        scored = config.alg != "origin" and n > 0
        rows = logits if len(idx) == len(logits) else logits[idx - lo]  # no copy when the span is all masked
        _, x0, conf = sample_scored(rows, config.sampling, generator, config.alg if scored else None)
        if config.alg == "origin":
            t, s = grid[min(i, steps - 1)], grid[min(i + 1, steps)]
            p = 1.0 if (K is None and i >= steps - 1) else float(1 - s / t)
            pick = torch.rand(len(idx), generator=generator, device=idx.device) < p
            chosen = pick.nonzero().flatten()
        elif n == 0:
            chosen = idx[:0]
        elif config.alg_temp:
            weights = torch.softmax(conf / config.alg_temp, dim=-1)
            chosen = torch.multinomial(weights, n, replacement=False, generator=generator)
        else:
            chosen = torch.topk(conf, n).indices
        stale = len(chosen) > 0
        c.commit(idx[chosen], x0[chosen], source="dlm")
        if c.done(early_stop=config.early_stop):
            break
    return c.result()
