"""Confidence-threshold parallel decoding (Fast-dLLM, Wu et al., arXiv 2505.22618).

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
    if config.convention == "fast-dllm" and not dlm.shifted:  # a LLaDA model: its own path
        from codila_cli.decoding.llada_fast import decode_fast_dllm_llada

        return decode_fast_dllm_llada(dlm, prompt_ids, config=config, generator=generator, on_step=on_step)
    if config.convention == "fast-dllm":
        return decode_fast_dllm(dlm, prompt_ids, config=config, generator=generator, on_step=on_step)
    c = Canvas.start(prompt_ids=prompt_ids, config=config, dlm=dlm, on_step=on_step)
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
            chosen = confident(conf, config.threshold)
            if c.wants_proposals:
                c.propose(start + idx, x0)
            c.commit(start + idx[chosen], x0[chosen], source="dlm", block=(start, end))
            if c.done():
                return c.result()
    return c.result()


def confident(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """[M] bool: every slot at ≥ ``threshold``, and the most confident one in any case (progress)."""
    chosen = conf >= threshold
    chosen[conf.argmax()] = True
    return chosen


def decode_fast_dllm(dlm, prompt_ids: list[int], *, config: ThresholdConfig, generator: torch.Generator | None = None,
                     on_step: OnStep = no_op) -> DecodeResult:
    """Fast-dLLM's own rules for Dream (its ``dream/model`` decoding; ``--threshold-convention
    fast-dllm``), to reproduce the reference code token for token (docs/decoders.md, "Parity").

    No cache: the whole canvas at once, a quota of ``block_length`` (= L / steps) slots per step plus the
    slots the previous step carried; the quota's most confident slots (p(x0), ranked on a [P + L] row
    with −inf outside the masked slots) are taken, the first always and the others only at confidence ≥
    ``threshold`` (the rest are carried). At the last step each slot under the threshold adds one more
    step. With a cache, block by block: the block's first forward is a full one (K/V kept) that samples
    every position and writes only the block's first slot; each later forward runs the cached slice,
    which starts at the block and is shifted inside it (BlockCache.logits ``fast_dllm``), ranks the
    slice's masked slots (prefix: the rest of the canvas too, for the random draws) and reveals the
    block's top slot plus every other block slot at ≥ ``threshold``. The mask ban stays (codila's one
    intended difference).
    """
    c = Canvas.start(prompt_ids=prompt_ids, config=config, dlm=dlm, on_step=on_step)
    L, B, P, s = config.max_new_tokens, config.block_length, c.prompt_len, config.sampling
    if config.cache == "none":
        steps, carried, i = L // B, 0, 0
        while i < steps and bool(c.masked().any()):
            idx = c.masked().nonzero().flatten()
            logits = dlm.logits(c.x, rows=(P, P + L))[0][idx]
            _, x0, conf = sample_scored(logits, s, generator, "maskgit_plus")
            row = torch.full((c.x.shape[1],), float("-inf"))
            row[P + idx] = conf.float()
            quota = B + carried
            carried = 0
            top, where = torch.topk(row, min(quota, row.numel()))
            take = [0] + [k for k in range(1, len(top)) if top[k] >= config.threshold]
            carried = quota - len(take)
            if i == steps - 1:
                steps += carried  # the reference adds one step per slot left under the threshold
            slots = torch.searchsorted(idx, where[take] - P)
            c.commit(idx[slots], x0[slots], source="dlm", block=(0, L))
            i += 1
            if c.done():
                break
        return c.result()
    from codila_cli.models.dream import BlockCache

    cache = BlockCache(dlm, config.cache)
    for start in range(0, L, B):
        end = min(start + B, L)
        full = cache.refresh(c.x, P, P + L, rows=(0, P + L))[0]  # every position is sampled
        _, x0, _ = sample_scored(full, s, generator, "maskgit_plus")
        c.commit(torch.tensor([start]), x0[P + start : P + start + 1], source="dlm", block=(start, end))
        if config.entropy_steps is not None:
            _entropy_block(c, cache, config, start, end, generator)
            if c.done():
                return c.result()
            continue
        while bool(c.masked()[start:end].any()):
            if c.done():
                return c.result()
            hi = L if config.cache == "prefix" and s.temperature > 0 else end  # draws for the whole slice
            idx = c.masked()[start:hi].nonzero().flatten()
            logits = cache.logits(c.x, P + start, P + end, rows=(P + start, P + hi), fast_dllm=True)[0][idx]
            _, x0, conf = sample_scored(logits, s, generator, "maskgit_plus")
            inside = idx < end - start
            idx, x0, conf = idx[inside], x0[inside], conf[inside]
            chosen = confident(conf, config.threshold)
            c.commit(start + idx[chosen], x0[chosen], source="dlm", block=(start, end))
        if c.done():
            return c.result()
    return c.result()


def _entropy_block(c, cache, config: ThresholdConfig, start: int, end: int, generator) -> None:
    """Fast-dLLM's cached entropy mode for one block, after its first full forward: forwards i = 1, 2, …
    over the cached slice (shifted inside it); each ranks the block's masked slots by −H and reveals
    n = ⌊masked·(1 − t_{i+1}/t_i)⌋ of them (all at i = S − 1), with t = linspace(1, 10⁻³, S + 1) in fp32
    and S = entropy_steps / blocks; the ranking row spans the slice with −inf outside the block's masked
    slots (the reference's layout, so ties fall the same way). At i = S the forward runs and the block ends."""
    L, P, s = config.max_new_tokens, c.prompt_len, config.sampling
    per = config.entropy_steps // -(-L // config.block_length)
    ts = torch.linspace(1, 1e-3, per + 1)
    hi = L if config.cache == "prefix" else end
    i = 1
    while True:
        logits = cache.logits(c.x, P + start, P + end, rows=(P + start, P + hi), fast_dllm=True)[0]
        if i == per:
            return
        idx = c.masked()[start:end].nonzero().flatten()
        _, x0, conf = sample_scored(logits[idx], s, generator, "entropy")
        n = int(torch.tensor(float(len(idx))) * (1 - ts[i + 1] / ts[i])) if i < per - 1 else len(idx)
        if n > 0:
            row = torch.full((hi - start,), float("-inf"))
            row[idx] = conf.float()
            where = torch.topk(row, n).indices
            slots = torch.searchsorted(idx, where)
            c.commit(start + idx[slots], x0[slots], source="dlm", block=(start, end))
        i += 1
        if not bool(c.masked()[start:end].any()):
            return
