"""Lossless parallel decoding: FreeDave (Wu and Zhang, "Free Draft-and-Verification: Toward Lossless Parallel
Decoding for Diffusion Large Language Models", arXiv 2510.00294).

A deterministic sampler (T 0, confidence remasking) is a function: canvas ``x`` [N] and the logits of one
forward on it decide the next step's commit. The one-token-per-step decode runs one forward per step. Here,
from the logits of ``x``:

1. the step they decide is committed (it is the reference's step: ``c1``);
2. the next steps are *drafted* from the same (now stale) logits, each on the canvas the previous draft
   left: ``c2 … cd`` (d ≤ :data:`MAX_DEPTH`, grown while drafts hold, cut back when they fail);
3. ``c1 … cd`` run as one batched forward ([d, N]: d rows of compute, one sequential forward);
4. ``c(j+1)`` is accepted when the step the logits of ``cj`` decide is exactly what the draft added; the
   first mismatch ends the round, and the logits of the last accepted canvas decide the next round's
   ``c1``. Every accepted step is one the reference takes, so the text is the reference's (the paper's
   Theorem: the fewest sequential forwards of any draft-and-verify scheme with these drafts).

codila's differences: the draft depth adapts per round (doubling while every draft is accepted, else the
accepted count + 1); each candidate's rows are projected on their own, as its lone forward projects them
(``logits_many``). A batched forward is not always bit-identical to a lone one (a [d, N] product may round
the last bit; a 16-bit batch rounds rows by their place in it, by up to 0.16 in a logit on this CPU). So in
fp32 each verification forward carries a *check row*, the last canvas whose logits are the reference's own
arithmetic, compared bit for bit: equal, the batch's rows are taken as lone rows; else (and always in 16
bits) a decision read from the batch counts only when every comparison it makes (the top token's lead, the
quota boundary's lead, the distance to a threshold) clears :data:`TOLERANCE` for the model's dtype, and
otherwise its canvas is forwarded alone (a *guarded* forward) and decided as the reference would; after
guarded forwards in a row the driver drafts nothing for 1, 3, 7, … rounds (:class:`Pace`), so a flat or 16-bit
model costs about the reference's forwards, not twice them. Sampling
(T > 0, random remasking, Dream's ``alg_temp``/``origin``, LLaDA's guidance) is refused: its draws would
have to be replayed per candidate (docs/decoders.md, "Exact").

The step rules (decoding/dream.py::DreamRule, llada.py::LladaRule, block.py::BlockRule) mirror their
samplers step for step; tests/test_freedave.py holds each to its reference on the goldens and on random
tiny models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from codila_cli.decoding.config import exact_problem
from codila_cli.decoding.freedave_rules import Decision, View

MAX_DEPTH = 8  # candidates per verification forward
BACKOFF = 5  # at most 2**5 − 1 rounds without drafts after near ties in a row
NO_GUARD = float("-inf")  # the lead a decision read from the reference's own arithmetic needs
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}  # lead a decision read from a batch must have


@dataclass
class Stats:
    """What the driver did: ``rows`` canvases evaluated (compute), ``guarded`` lone forwards a near tie
    asked for, ``drafted``/``accepted`` draft steps proposed and verified."""

    rows: int = 0
    calls: int = 0  # the driver's forwards (``rows`` of them in all)
    guarded: int = 0
    drafted: int = 0
    accepted: int = 0

    def to_dict(self) -> dict:
        return {"rows": self.rows, "forwards": self.calls, "guarded": self.guarded, "drafted": self.drafted,
                "accepted": self.accepted}


@dataclass
class Pace:
    """How far the driver drafts: ``depth`` candidates a round; ``misses`` batches in a row whose next decision
    was a near tie, ``hold`` rounds left that draft nothing. One pace runs on across a block decoder's blocks."""

    depth: int = 2
    misses: int = 0
    hold: int = 0


def freedave(x: Any, rule: Any, forward: Callable[[torch.Tensor, list], list], *, commit: Callable[[Decision], Any],
             tol: float, stats: Stats, done: Callable[[], bool], start: int = 0, trust: bool = True,
             pace: Pace | None = None) -> None:
    """Decode from the state ``x`` under ``rule`` until its schedule ends or ``done()``. A state is what the rule
    reads: the canvas [N] (decoding/freedave_rules.py::OnCanvas), or DreamOn's middle (decoding/dreamon.py::Fill);
    ``rule.tokens(state)`` is the sequence a forward reads, ``rule.after(state, d)`` a draft's next state.
    ``commit(d)`` takes a verified step and returns the new state. ``forward(xs [d, N], spans)`` runs one forward
    and gives, per canvas, the logits [hi − lo, V] of its rows ``spans[i]`` = (lo, hi), each projected as a lone
    forward of that canvas projects them (a call with d = 1 is the reference's own forward); ``start``: the
    schedule step to begin at; ``trust``: a batch whose check row equals its lone logits bit for bit has lone
    rows (fp32; a 16-bit batch rounds rows by their place)."""
    def counted(states: list, spans: list) -> list:
        stats.calls, stats.rows = stats.calls + 1, stats.rows + len(states)
        return forward(torch.stack([rule.tokens(s) for s in states]), spans)

    def alone(s: Any, step: int) -> View:
        return View(*(span := rule.rows(s, step)), counted([s], [span])[0])

    if rule.rows(x, start) is None:
        return
    # ``loose``: the view came from a batch whose rows may round otherwise than lone forwards, so a decision
    # read from it must clear ``tol``; a lone forward, or a batch whose check row matched its lone logits bit
    # for bit, is the reference's own arithmetic. ``seen``: the state the view's logits are of
    pace = pace or Pace()
    view, seen, loose, step = alone(x, start), x, False, start
    while True:
        d = rule.decide(x, view, step, tol if loose else NO_GUARD)
        if d is None:
            return
        if not d.robust:  # a near tie read from a batch: decide it from the canvas's own forward
            view, seen, loose = alone(x, step), x, False
            stats.guarded += 1
            d = rule.decide(x, view, step, NO_GUARD)
            # that batch bought nothing for this step and cost a forward: back off, drafting nothing (the
            # reference's own forwards) for 1, 3, 7, … rounds while batches keep ending in near ties
            pace.misses = min(pace.misses + 1, BACKOFF)
            pace.hold = 2**pace.misses - 1
        elif loose:
            pace.misses = 0
        x, step = commit(d), d.step + 1
        if done():
            return
        drafts = _drafts(x, rule, view, step, 1 if pace.hold else pace.depth)  # [(state after a draft, its decision)]
        pace.hold = max(0, pace.hold - 1)
        stats.drafted += len(drafts)
        cands = [x, *(cand for cand, _ in drafts)]
        nexts = [step, *(dd.step + 1 for _, dd in drafts)]  # the step each candidate's logits would decide
        size = rule.size(x)  # one forward stacks canvases of one length (a draft that resized one ends them)
        need = [(i, s) for i, s in enumerate(rule.rows(cand, n) for cand, n in zip(cands, nexts))
                if s is not None and rule.size(cands[i]) == size]
        if not need:  # x itself always has the batch's length: only its schedule's end leaves nothing
            return
        # the last view's canvas again, as a check row: are the batch's rows lone rows?
        check = len(need) > 1 and not loose and trust and rule.size(seen) == size
        spans = [s for _, s in need] + ([(view.lo, view.hi)] if check else [])
        out = counted([cands[i] for i, _ in need] + ([seen] if check else []), spans)
        loose = len(need) > 1 and not (check and torch.equal(out.pop(), view.logits))
        views = {i: View(*s, out[k]) for k, (i, s) in enumerate(need)}
        view, seen, accepted = views.get(0), cands[0], 0
        for j, (cand, want) in enumerate(drafts):
            got = rule.decide(x, view, step, tol if loose else NO_GUARD) if view is not None else None
            if got is None or not got.robust or not _same(got, want):
                break
            x, step = commit(got), got.step + 1
            accepted += 1
            if done():
                return
            view, seen = views.get(j + 1), cand
        stats.accepted += accepted
        if view is None:  # the drafts left the batch's rows (LLaDA's next block, a resized DreamOn middle)
            if rule.rows(x, step) is None:
                return
            view, seen, loose = alone(x, step), x, False
        if drafts:
            pace.depth = min(MAX_DEPTH, pace.depth * 2) if accepted == len(drafts) else max(2, accepted + 1)


def _drafts(x: Any, rule: Any, view: View, step: int, depth: int) -> list[tuple[Any, Decision]]:
    """Up to ``depth`` − 1 steps after ``x``, each decided from the stale ``view`` on the previous draft; the
    drafts end after one that resizes the canvas (the view's rows no longer line up with it)."""
    out, cur, size = [], x, rule.size(x)
    while len(out) < depth - 1:
        d = rule.decide(cur, view, step, NO_GUARD)  # a draft is only a guess: verification decides
        if d is None:
            break
        cur = rule.after(cur, d)
        out.append((cur, d))
        step = d.step + 1
        if rule.size(cur) != size:
            break
    return out


def _same(a: Decision, b: Decision) -> bool:
    if a.step != b.step or a.positions.numel() != b.positions.numel():
        return False
    oa, ob = torch.argsort(a.positions), torch.argsort(b.positions)
    return bool(torch.equal(a.positions[oa], b.positions[ob]) and torch.equal(a.tokens[oa].cpu(), b.tokens[ob].cpu()))


def on_canvas(c: Any, rule: Any, forward: Callable, *, done: Callable[[], bool] | None = None, **kw: Any) -> None:
    """:func:`freedave` on a decoder's canvas (decoding/base.py::Canvas), which emits each committed step;
    ``done``: when to stop early (default the canvas's own rule; a block decoder's block runs to its end)."""
    def commit(d: Decision) -> torch.Tensor:
        c.commit(d.positions - c.prompt_len, d.tokens, source="dlm", block=d.block)
        return c.x[0].clone()

    freedave(c.x[0].clone(), rule, forward, commit=commit, done=done or c.done, **kw)


def tolerance(logits_dtype: Any) -> float:
    """The lead a decision read from a batched forward must have, for a model computing in ``logits_dtype``."""
    return TOLERANCE.get(logits_dtype, TOLERANCE[torch.bfloat16])


def decode_exact(dlm: Any, prompt_ids: list[int], *, decoder: str, config: Any, generator: Any = None,
                 on_step: Any = None) -> Any:
    """The reference decode of ``decoder`` (dream, llada, block) with ``config``, in fewer sequential
    forwards; the result also says the canvases evaluated (``dlm_rows``) and the driver's counts."""
    from dataclasses import replace as with_

    from codila_cli.decoding.base import Canvas
    from codila_cli.decoding.dream import DreamRule
    from codila_cli.decoding.events import no_op
    from codila_cli.decoding.llada import LladaRule
    from codila_cli.errors import UsageError

    on_step = on_step or no_op
    problem = exact_problem(config)
    if problem is not None:
        raise UsageError(problem, hint="drop --exact (or use --no-exact) to decode with these settings")
    dtype = dlm.ckpt.dtype  # what the model computes in (engine/generate.py::exact_pays reads the same)
    tol, trust = tolerance(dtype), dtype == torch.float32
    stats, pace = Stats(), Pace()
    if decoder == "block":
        from codila_cli.decoding.block import decode_block

        res = decode_block(dlm, prompt_ids, config=config, generator=generator, on_step=on_step,
                           fill=lambda c, rule, forward: on_canvas(c, rule, forward, tol=tol, stats=stats,
                                                                   done=lambda: False, trust=trust, pace=pace))
        return with_(res, dlm_rows=res.dlm_forwards - stats.calls + stats.rows, freedave=stats.to_dict())
    if decoder == "llada":
        from codila_cli.decoding.llada import check_llada

        check_llada(dlm, prompt_ids, config)
    c = Canvas.start(prompt_ids=prompt_ids, config=config, dlm=dlm, on_step=on_step)
    rule = (DreamRule if decoder == "dream" else LladaRule)(config, c.prompt_len, c.mask_id)
    on_canvas(c, rule, dlm.logits_many, tol=tol, stats=stats, trust=trust)
    return with_(c.result(), dlm_rows=stats.rows, freedave=stats.to_dict())


def fill_exact(dlm: Any, *, prefix_ids: list[int], suffix_ids: list[int], config: Any, on_step: Any = None) -> Any:
    """DreamOn's fill (decoding/dreamon.py::decode_dreamon without a helper) with ``config``, in fewer sequential
    forwards: the same steps, each emitted as the reference emits it; the result also says the canvases
    evaluated (``dlm_rows``) and the driver's counts. A step that expands or deletes resizes the middle, so
    the drafts of a round end at one (decoding/dreamon.py::DreamOnRule)."""
    import time

    from codila_cli.decoding.dreamon import DreamOnRule, Fill, finished, sequence
    from codila_cli.decoding.events import StepEvent, no_op
    from codila_cli.errors import UsageError

    on_step = on_step or no_op
    if (problem := exact_problem(config)) or config.needs_helper:
        raise UsageError(problem or "--exact runs DreamOn's own steps, not CoDiLA's helper writes",
                         hint="drop --exact (or use --no-exact) to fill with these settings")
    sp, head_tail = dlm.specials, sequence(dlm, prefix_ids, suffix_ids, config)
    rule = DreamOnRule(config, *head_tail, sp, dlm.context_length - sum(map(len, head_tail)), dlm.device)
    state, counts = rule.start(), {"steps": 0, "expansions": 0, "deletions": 0}
    stats, f0, t0 = Stats(), dlm.forwards, time.perf_counter()

    def commit(d: Decision) -> Fill:
        nonlocal state
        committed, before, state = rule.committed(d), state, rule.after(state, d)
        grown = before.budget - state.budget  # each expand spends one of the budget
        counts["expansions"] += grown
        counts["deletions"] += len(before.middle) + grown - len(state.middle)
        on_step(StepEvent(step=d.step, positions=tuple(committed), tokens=tuple(committed.values()), source="dlm",
                          block=None, dlm_forwards=dlm.forwards - f0, ar_forwards=0, elapsed=time.perf_counter() - t0,
                          canvas=state.middle))
        counts["steps"] = d.step + 1
        return state

    dtype = dlm.ckpt.dtype
    freedave(state, rule, dlm.logits_many, commit=commit, tol=tolerance(dtype), stats=stats, done=lambda: False,
             trust=dtype == torch.float32)
    return finished(state.middle, sp, dlm_forwards=dlm.forwards - f0, ar_forwards=0, seconds=time.perf_counter() - t0,
                    dlm_rows=stats.rows, freedave=stats.to_dict(), **counts)
