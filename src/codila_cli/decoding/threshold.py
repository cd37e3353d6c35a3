"""Confidence-threshold parallel decoding (Fast-dLLM, Wu et al., arXiv 2505.22618; algorithms.md §5.2).

The canvas [L] is cut into blocks of ``block_length`` decoded left to right. Per DLM forward, inside
the current block: the most confident masked slot is always committed, plus every other masked slot of
the block whose confidence p(x0) ≥ ``threshold``. A block is finished when it holds no mask.
"""

from __future__ import annotations

import torch

from codila_cli.decoding.base import Canvas, DecodeResult
from codila_cli.decoding.config import ThresholdConfig
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.decoding.marginals import sample_scored


def decode_threshold(dlm, prompt_ids: list[int], *, config: ThresholdConfig, generator: torch.Generator | None = None,
                     on_step: OnStep = no_op) -> DecodeResult:
    c = Canvas.start(prompt_ids=prompt_ids, length=config.max_new_tokens, dlm=dlm, on_step=on_step,
                     stop_lines=config.stop)
    L, B, P = config.max_new_tokens, config.block_length, c.prompt_len
    cache = None
    if config.cache != "none":
        from codila_cli.models.dream import BlockCache

        cache = BlockCache(dlm, config.cache)
    for start in range(0, L, B):
        end = min(start + B, L)
        fresh = True
        while bool(c.masked()[start:end].any()):
            if cache is None:
                logits = dlm.logits(c.x, rows=(P + start, P + end))[0]  # [B, V]
            elif fresh:
                logits = cache.refresh(c.x, P + start, P + end)[0]
            else:
                logits = cache.logits(c.x, P + start, P + end)[0]
            fresh = False
            idx = c.masked()[start:end].nonzero().flatten()
            _, x0, conf = sample_scored(logits[idx], config.sampling, generator, "maskgit_plus")
            chosen = conf >= config.threshold
            chosen[conf.argmax()] = True
            c.commit(start + idx[chosen], x0[chosen], source="dlm", block=(start, end))
            if c.done(early_stop=config.early_stop):
                return c.result()
    return c.result()
