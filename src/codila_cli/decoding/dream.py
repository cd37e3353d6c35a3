"""Dream's ``diffusion_generate`` (Ye et al., Dream 7B, arXiv 2508.15487; the model's ``generation_utils.py``).

Canvas ``x`` [1, P+L]: prompt then L masks. Each iteration runs one DLM forward (shifted logits [M, V]
for the span from the first to the last masked slot: nothing else is read), processes the marginals of
the masked slots, and reveals ``n`` of them:

* ``steps`` schedule (Dream): t_k = linspace(1, eps, S+1); n = floor(#masked · (1 − t_{k+1}/t_k)), all
  remaining at the last step (float32 arithmetic, as upstream).
* ``tokens_per_step`` schedule (codila): n = min(K, #masked): exactly K per forward but the last.
* ``alg = origin``: one uniform per masked slot first; a slot is revealed when its uniform is below
  1 − s/t, and only the revealed slots are then sampled (the official order of random draws).
* confidence algs: the n most confident slots, or n drawn without replacement from softmax(c / alg_temp).
  As in the official loop, the ranking runs on a row as long as the whole sequence, [P + L], with −inf
  outside the masked slots: ties (top-p makes many exact 1.0s) and the draws depend on that layout.

A step that reveals nothing leaves the canvas unchanged, so the next step reuses the same logits
instead of a new forward, unless ``exact_steps`` (one forward per step, the official count; the tokens
are the same either way). Intended differences from the official code (docs/decoders.md, "Parity"):
the mask token is never emitted; confidences are ranked in fp32 whatever the model's dtype; early stop
(once a stop token is committed with nothing masked before it, the tail is filled with end-of-text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from codila_cli.decoding.base import Canvas, DecodeResult
from codila_cli.decoding.config import DreamConfig
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.decoding.freedave_rules import Decision, OnCanvas, View, filters_clear, lead, token_lead
from codila_cli.decoding.marginals import process_logits, sample_scored


def _on_sequence_row(c: Canvas, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[P + L] fp32: ``values`` at the masked slots ``idx`` (canvas offsets), −inf elsewhere."""
    row = torch.full((c.x.shape[1],), float("-inf"), device=values.device)
    row[c.prompt_len + idx] = values.float()
    return row


class Schedule:
    """How many masked slots Dream's step i reveals (the ``steps`` schedule or K a step), shared by the loop
    and its FreeDave rule (:class:`DreamRule`). ``length``: the loop's iterations."""

    def __init__(self, config: DreamConfig) -> None:
        L, self.K = config.max_new_tokens, config.tokens_per_step
        self.steps = config.steps if config.steps is not None else (-(-L // self.K) if self.K else L)
        self.grid = torch.linspace(1, config.eps, self.steps + 1, dtype=torch.float32)
        self.length = self.steps if self.K is None else L

    def last(self, i: int) -> bool:
        return self.K is None and i >= self.steps - 1

    def times(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(t, s): the schedule's time at step i and at the next."""
        return self.grid[min(i, self.steps - 1)], self.grid[min(i + 1, self.steps)]

    def count(self, i: int, n_masked: int) -> int:
        if self.K is not None:
            return min(self.K, n_masked)
        if self.last(i):
            return n_masked
        t, s = self.times(i)
        return int(torch.tensor(float(n_masked), dtype=torch.float32) * (1 - s / t))


def decode_dream(dlm, prompt_ids: list[int], *, config: DreamConfig, generator: torch.Generator | None = None,
                 on_step: OnStep = no_op) -> DecodeResult:
    c = Canvas.start(prompt_ids=prompt_ids, config=config, dlm=dlm, on_step=on_step)
    sched = Schedule(config)
    logits, stale = None, True
    for i in range(sched.length):
        masked = c.masked()
        n_masked = int(masked.sum())
        if n_masked == 0:
            break
        idx = masked.nonzero().flatten()
        if stale or config.exact_steps:  # only the span of masked slots is projected onto the vocabulary
            lo = int(idx[0])
            logits = dlm.logits(c.x, rows=(c.prompt_len + lo, c.prompt_len + int(idx[-1]) + 1))[0]  # row j: slot lo + j
        n = sched.count(i, n_masked)
        rows = logits if len(idx) == len(logits) else logits[idx - lo]  # no copy when the span is all masked
        if config.alg == "origin":
            t, s = sched.times(i)
            p = 1.0 if sched.last(i) else float(1 - s / t)
            chosen = (torch.rand(len(idx), generator=generator, device=idx.device) < p).nonzero().flatten()
            x0 = torch.full_like(idx, c.mask_id)
            if len(chosen):
                x0[chosen] = sample_scored(rows[chosen], config.sampling, generator, None)[1]
        else:
            _, x0, conf = sample_scored(rows, config.sampling, generator, config.alg if n > 0 else None)
            if n == 0:
                chosen = idx[:0]
            else:
                row = _on_sequence_row(c, idx, conf)
                if config.alg_temp:
                    picked = torch.multinomial(torch.softmax(row / config.alg_temp, dim=-1), n, replacement=False,
                                               generator=generator)
                else:
                    picked = torch.topk(row, n).indices
                chosen = torch.searchsorted(idx, picked - c.prompt_len)  # sequence position -> masked slot
        stale = len(chosen) > 0
        if c.wants_proposals:
            c.propose(idx, torch.where(x0 == c.mask_id, rows.argmax(-1), x0))
        c.commit(idx[chosen], x0[chosen], source="dlm")
        if c.done():
            break
    if config.exact_steps and sched.K is None and not c.stopped_early:  # the official loop runs every step's forward
        for _ in range(sched.steps - c.dlm_forwards):
            dlm.logits(c.x, rows=(c.prompt_len, c.prompt_len + 1))
    return c.result()


@dataclass
class DreamRule(OnCanvas):
    """decoding/dream.py's loop at T 0 with a confidence ``alg``: step i reveals n_i slots (:class:`Schedule`:
    the ``steps`` schedule's floor counts, some 0, all left at the last; or K a step), the n_i most confident
    of the masked slots, ranked on a row as long as the sequence."""

    config: Any
    prompt_len: int
    mask_id: int
    schedule: Schedule = field(init=False)

    def __post_init__(self) -> None:
        self.schedule = Schedule(self.config)

    def rows(self, x: torch.Tensor, step: int) -> tuple[int, int] | None:
        idx = (x[self.prompt_len :] == self.mask_id).nonzero().flatten()
        if len(idx) == 0 or step >= self.schedule.length:
            return None
        return self.prompt_len + int(idx[0]), self.prompt_len + int(idx[-1]) + 1

    def decide(self, x: torch.Tensor, view: View, step: int, tol: float) -> Decision | None:
        P, sched = self.prompt_len, self.schedule
        idx = (x[P:] == self.mask_id).nonzero().flatten()
        i = step
        while i < sched.length and len(idx) and (n := sched.count(i, len(idx))) == 0:
            i += 1
        if i >= sched.length or len(idx) == 0 or not view.covers(P + int(idx[0]), P + int(idx[-1]) + 1):
            return None
        rows = view.logits[P + idx - view.lo]
        _, x0, conf = sample_scored(rows, self.config.sampling, None, self.config.alg)
        row = torch.full((x.shape[0],), float("-inf"), device=conf.device)
        row[P + idx] = conf.float()
        chosen = torch.searchsorted(idx, torch.topk(row, n).indices - P)
        robust = (lead(conf.float(), n) > tol and filters_clear(rows, self.config.sampling, tol)
                  and token_lead(process_logits(rows[chosen], self.config.sampling)) > tol)
        return Decision(i, P + idx[chosen], x0[chosen], robust)
