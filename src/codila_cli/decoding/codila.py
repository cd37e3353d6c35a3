"""CoDiLA decoding: the DLM plans, a small AR model writes each block coherently.

Hersche, Menet, Tanios, Rahimi, "Locally coherent parallel decoding in diffusion language models"
(arXiv 2603.20216, ICML 2026); docs/codila.md for every choice made here.

Per DLM forward: shifted logits [L, V] → raw marginals π (temperature 1) and entropies H [L] (nats).
The canvas is a fixed grid of blocks of B slots; the candidates are the first W blocks holding masks.

* static (tau None): the candidate block(s) with the lowest mean H over masked slots; the AR writes all
  of it (K = B tokens per forward; ``parallel_blocks`` = 2 writes two blocks, K = 2B).
* dynamic (tau τ): for each candidate, the longest prefix of its masked slots with mean H ≤ τ; the block
  with the longest prefix (ties: lower mean) is written by the AR up to that slot. When no block admits
  k ≥ 2, one slot is revealed by the DLM's own confidence step (a single token needs no coherence).
* verify (ar_verify): K = B slots per forward by DLM confidence, where a slot whose DLM top-1 differs
  from the AR's top-1 (teacher-forced on the DLM proposal) has its confidence scaled by the penalty.

Slots already committed inside a written span are fed one-hot and forced in the AR's output.

Static mode computes π and H only over the candidate window (nothing outside it is read).

``cache`` = prefix / dual (models/dream.py::BlockCache): the cache's block is the candidate window
[first candidate, last candidate) as it stands at a refresh (Fast-dLLM's block: W·B slots), or
``cache_blocks``·B slots from the first candidate when that is set. The window
then stays put until all its slots are committed; each step in it recomputes only the window (dual) or
the window and what follows (prefix), and block choice and fallback look only inside it. So a canvas of
L slots costs about L / (W·B) full forwards instead of one per block. In static mode only the
candidates' rows are projected onto the vocabulary (the window's other slots are recomputed, not read).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property

import torch

from codila_cli.decoding.base import Canvas, DecodeResult
from codila_cli.decoding.config import CodilaConfig, InfillConfig
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.decoding.marginals import entropy, sample_scored


def _candidates(masked: torch.Tensor, B: int, W: int) -> list[tuple[int, int]]:
    """The first W blocks of the grid (B slots each; the last may be shorter) that hold a mask."""
    L = len(masked)
    grid = torch.nn.functional.pad(masked, (0, -L % B)).view(-1, B).any(1)
    return [(s, min(s + B, L)) for s in (grid.nonzero().flatten()[:W] * B).tolist()]


def _block_means(H: torch.Tensor, masked: torch.Tensor, B: int) -> list[float]:
    """Mean entropy over the masked slots of each B-slot block of a grid-aligned view (nan if none)."""
    pad = -len(H) % B
    h = torch.nn.functional.pad(torch.where(masked, H, 0.0), (0, pad)).view(-1, B).sum(1)
    n = torch.nn.functional.pad(masked, (0, pad)).view(-1, B).sum(1)
    return (h / n).tolist()  # 0 / 0 = nan for a block with no mask; such a block is never a candidate


def _context(c: Canvas, start: int, n: int) -> list[int]:
    """The AR's left context for a block at ``start``: the committed tokens from the last multiple of
    n/2 (in sequence positions) that leaves at most n of them, back to the nearest hole. So it holds
    between n/2 + 1 and n tokens, and its first token stays put for n/2 tokens: the writer reuses the
    context's K/V from the previous block (decoding/soft_ar.py) instead of recomputing n tokens a block."""
    if n <= 0:
        return []
    end = c.prompt_len + start
    half = max(1, n // 2)
    begin = max(0, -(-(end - n) // half) * half)  # the first multiple of n/2 at or after end − n
    left = c.x[0, begin:end]
    holes = (left == c.mask_id).nonzero().flatten()
    return left[int(holes[-1]) + 1 :].tolist() if len(holes) else left.tolist()


class _BlockText:
    """What the choice rules read of the text before a block (decoding/rules.py::BlockText), computed
    only when a rule asks."""

    def __init__(self, c: Canvas, start: int) -> None:
        self._c, self._end = c, c.prompt_len + start

    @cached_property
    def _left(self) -> torch.Tensor:
        return self._c.x[0, : self._end]  # prompt and committed slots left of the block

    @cached_property
    def seen(self) -> list[int]:
        return self._left[self._left != self._c.mask_id].tolist()

    @cached_property
    def left(self) -> list[int] | None:
        return None if bool((self._left == self._c.mask_id).any()) else self._left.tolist()

    @cached_property
    def done(self) -> list[int] | None:
        body = self._c.x[0, self._c.completion_start : self._end]
        return None if bool((body == self._c.mask_id).any()) else body.tolist()


def _write(c: Canvas, writer, probs: torch.Tensor, span: tuple[int, int], cfg: CodilaConfig, gen) -> None:
    start, end = span
    seg = c.gen[start:end]
    forced = [None if t == c.mask_id else t for t in seg.tolist()]
    out = writer.write(probs[start:end], forced, context=_context(c, start, cfg.ar_context),
                       text=_BlockText(c, start), generator=gen)
    new = (seg == c.mask_id).nonzero().flatten()
    c.commit(start + new, out[new.cpu()], source="ar", block=span)


def decode_codila(dlm, prompt_ids: list[int], *, config: CodilaConfig, writer, generator: torch.Generator | None = None,
                  on_step: OnStep = no_op) -> DecodeResult:
    c = Canvas.start(prompt_ids=prompt_ids, config=config, dlm=dlm, ar=writer.ar, on_step=on_step)
    B, W, L, P = config.block_size, config.candidate_blocks, config.max_new_tokens, c.prompt_len
    cache, window = None, None
    if config.cache != "none":
        from codila_cli.models.dream import BlockCache

        cache = BlockCache(dlm, config.cache)
    while not c.done():
        masked_all = c.masked()
        cands = _candidates(masked_all, B, W)
        # the canvas view [lo, hi): the candidate window with a cache, and in static mode (which reads
        # nothing outside the window: same result, softmax/entropy over W blocks instead of the canvas)
        static = config.tau is None and not config.ar_verify
        lo, hi = (cands[0][0], cands[-1][1]) if cache is not None or static else (0, L)
        if cache is None:
            logits = dlm.logits(c.x, rows=(P + lo, P + hi))[0]  # [hi - lo, V], row j predicts slot lo + j
        else:
            fresh = window is None or not bool(masked_all[window[0] : window[1]].any())
            if fresh:
                if config.cache_blocks is not None:  # a window of its own size, from the first candidate on
                    hi = min(L, lo + config.cache_blocks * B)
                window = (lo, hi)
            cands = [(s, e) for s, e in cands if window[0] <= s and e <= window[1]]
            # the rows projected onto the vocabulary: the candidates in static mode, else the whole window
            lo, hi = (cands[0][0], cands[-1][1]) if static else window
            step = cache.refresh if fresh else cache.logits  # else: stale K/V outside the window, exact inside
            logits = step(c.x, P + window[0], P + window[1], rows=(P + lo, P + hi))[0]
        probs = torch.softmax(logits, dim=-1)  # raw marginals π for the AR and the block choice
        if c.wants_proposals:  # the live view shows the DLM's plan beside what the helper writes
            c.propose(torch.arange(lo, hi, device=logits.device), logits.argmax(-1))
        view = _View(c, lo)
        masked = masked_all[lo:hi]
        rel = [(s - lo, e - lo) for s, e in cands]
        if config.tau is not None or len(rel) > config.parallel_blocks:  # else there is nothing to choose
            H = entropy(probs, logits)  # [hi - lo] nats
            block_mean = _block_means(H, masked, B)  # lo is on the grid: view block i = canvas block lo/B + i
            means = [block_mean[s // B] for s, _ in rel]
        else:
            means = [0.0] * len(rel)
        if config.ar_verify:
            _verify_step(c, writer, logits, probs, cands, config, generator)
        elif config.tau is None:
            order = sorted(range(len(rel)), key=lambda i: means[i])[: config.parallel_blocks]
            for i in sorted(order):
                _write(view, writer, probs, rel[i], config, generator)
        else:
            best = dynamic_span(H, ((s, s + masked[s:e].nonzero().flatten()) for s, e in rel), config)
            if best is not None:
                _write(view, writer, probs, best, config, generator)
            else:  # k <= 1: the DLM's own one-token confidence step over the masked slots in view
                idx = masked.nonzero().flatten()
                _, x0, conf = sample_scored(logits[idx], config.sampling, generator, config.alg)
                j = int(conf.argmax())
                c.commit(lo + idx[j : j + 1], x0[j : j + 1], source="dlm")
    return c.result()


def dynamic_span(H: torch.Tensor, blocks: Iterable[tuple[int, Sequence[int] | torch.Tensor]],
                 config: CodilaConfig | InfillConfig) -> tuple[int, int] | None:
    """CoDiLA's dynamic choice (τ = ``config.tau``; CoDiLA-on-DreamOn uses it too): for each block
    (start, its masked slots ascending), the longest prefix of the masked slots whose mean entropy H
    [slots] (nats) is ≤ τ. The block with the longest prefix wins (ties: the lower mean, then the first);
    returns (its start, its last chosen slot + 1), or None when no block admits k ≥ 2."""
    best, best_k, best_mean = None, 1, float("inf")
    for start, slots in blocks:
        if len(slots) == 0:
            continue
        prefix = torch.cumsum(H[slots], 0) / torch.arange(1, len(slots) + 1, device=H.device)
        ok = (prefix <= config.tau).nonzero().flatten()
        k = int(ok[-1]) + 1 if len(ok) else 0
        if k > best_k or (k == best_k and k >= 2 and float(prefix[k - 1]) < best_mean):
            best, best_k, best_mean = (start, int(slots[k - 1]) + 1), k, float(prefix[k - 1])
    return best


class _View:
    """The canvas seen from offset ``lo`` (the cache window): relative spans, absolute commits."""

    def __init__(self, c: Canvas, lo: int) -> None:
        self.c, self.lo = c, lo
        self.mask_id, self.x, self.prompt_len = c.mask_id, c.x, c.prompt_len + lo
        self.completion_start = c.prompt_len  # where the completion begins in x

    @property
    def gen(self) -> torch.Tensor:
        return self.c.gen[self.lo :]

    def commit(self, positions, tokens, *, source, block=None) -> None:
        span = (block[0] + self.lo, block[1] + self.lo) if block else None
        self.c.commit(positions + self.lo, tokens, source=source, block=span)


def _verify_step(c: Canvas, writer, logits, probs, cands, cfg: CodilaConfig, gen) -> None:
    """Commit K = B slots by DLM confidence, penalising slots where the AR's top-1 disagrees."""
    B = cfg.block_size
    full = [(s, e) for s, e in cands if e - s == B]
    masked = c.masked()
    idx = masked.nonzero().flatten()
    # maskgit_plus: a probability, so a multiplicative penalty is meaningful
    _, x0, conf = sample_scored(logits[idx], cfg.sampling, gen, "maskgit_plus")
    if full:
        starts = torch.tensor([s for s, _ in full], device=idx.device)
        cols = starts[:, None] + torch.arange(B, device=idx.device)  # [W, B]
        committed = ~masked[cols]
        proposal = torch.where(committed, c.gen[cols], probs[cols].argmax(-1))
        ar_top = writer.verify(probs[cols], proposal, committed)
        disagree = torch.zeros(len(c.gen), dtype=torch.bool, device=idx.device)
        disagree[cols[(ar_top.to(proposal.device) != proposal) & ~committed]] = True
        conf = torch.where(disagree[idx], conf * cfg.verify_penalty, conf)
    n = min(B, len(idx))
    chosen = torch.topk(conf, n).indices
    c.commit(idx[chosen], x0[chosen], source="dlm")
