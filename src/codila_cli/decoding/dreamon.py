"""DreamOn variable-length infilling (Wu et al., DreamOn, arXiv 2602.01326; its ``generation_utils.py``).

Sequence: ``[bos] + prefix + [mask]×n0 + suffix + [eos]``; only the middle changes. Per DLM forward
(shifted logits for the middle [M, V]): the mask is never predicted (codila's one intended difference
from the official loop, where a committed mask is a wasted step); ``<|expand|>`` is forbidden when
the middle is full or the budget is spent. K slots are committed by confidence (entropy by default),
then, as in DreamOn's evaluation generator, **expand before delete**:

* expand: a committed ``<|expand|>`` becomes two masks (middle +1, budget −1);
* delete: a committed end-of-text (the delete state) removes its slot; with broadcast deletion every
  slot that was masked at the step's start and lies right of the first delete is removed too.

With an AR helper and ``tau`` (CoDiLA dynamic mode, the paper's Table 2), the longest low-entropy
prefix (k ≥ 2) of a block of the middle is written by the AR instead (its end-of-text outputs are
deletes); k ≤ 1 falls back to DreamOn's own step.

A step is three functions, read by the loop and by :class:`DreamOnRule` (``--exact``: decoding/freedave.py
runs the same steps at T 0 in fewer sequential forwards): :func:`allowed` (what may be committed),
:func:`pick` (which slots, which tokens), :func:`resize` (the expands and deletes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from codila_cli.decoding.codila import dynamic_span
from codila_cli.decoding.config import InfillConfig
from codila_cli.decoding.events import OnStep, StepEvent, no_op
from codila_cli.decoding.freedave_rules import Decision, View, filters_clear, lead, token_lead
from codila_cli.decoding.marginals import entropy, process_logits, sample_scored


@dataclass
class InfillResult:
    middle: list[int]
    dlm_forwards: int
    ar_forwards: int
    steps: int
    seconds: float
    expansions: int
    deletions: int
    truncated: bool  # step cap reached with masks left (they were dropped)
    dlm_rows: int | None = None  # canvases the DLM evaluated (decoding/freedave.py); None: one a forward
    freedave: dict | None = None  # decoding/freedave.py's counts

    def __post_init__(self) -> None:
        if self.dlm_rows is None:
            self.dlm_rows = self.dlm_forwards


def sequence(dlm, prefix_ids: list[int], suffix_ids: list[int], config: InfillConfig) -> tuple[list[int], list[int]]:
    """(head, tail): ``[bos] + prefix`` and ``suffix + [eos]``, around the middle; refused (ValueError) when an
    end-of-text is in the prefix or the initial middle does not fit the context."""
    sp = dlm.specials
    if sp.eos in prefix_ids:  # the official loop reads any end-of-text as the middle's end: it empties the middle
        raise ValueError(f"prefix_ids hold the end-of-text id {sp.eos}: DreamOn's loop would end the middle at it "
                         "and delete every slot (encode text with models/tokens.py::encode_text, which keeps "
                         "such strings as text)")
    head = ([sp.bos] if sp.bos is not None else []) + list(prefix_ids)
    tail = list(suffix_ids) + [sp.eos]
    if len(head) + config.initial_masks + len(tail) > dlm.context_length:
        raise ValueError(f"prefix, initial middle and suffix ({len(head) + config.initial_masks + len(tail)} tokens) "
                         f"exceed the model's {dlm.context_length}-token context")
    return head, tail


def decode_dreamon(dlm, *, prefix_ids: list[int], suffix_ids: list[int], config: InfillConfig, writer=None,
                   generator: torch.Generator | None = None, on_step: OnStep = no_op) -> InfillResult:
    sp = dlm.specials
    mask = sp.mask
    head, tail = sequence(dlm, prefix_ids, suffix_ids, config)
    middle = [mask] * config.initial_masks
    budget = config.budget
    cap = step_cap(config)
    f0, a0, t0 = dlm.forwards, (writer.ar.forwards if writer else 0), time.perf_counter()
    expansions = deletions = step = 0
    while mask in middle and dlm.forwards - f0 < cap:
        x = torch.tensor([head + middle + tail], device=dlm.device)
        logits = allowed(dlm.logits(x, rows=(len(head), len(head) + len(middle)))[0].clone(), len(middle), budget,
                         config=config, room=dlm.context_length - len(head) - len(tail), specials=sp)  # [M, V]
        was_masked = [t == mask for t in middle]
        source, span = "dlm", None
        if writer is not None and config.needs_helper:
            span = _ar_span(logits, was_masked, config)
        if span is not None:
            start, end = span
            forced = [None if was_masked[i] else middle[i] for i in range(start, end)]
            out = writer.write(torch.softmax(logits[start:end], -1), forced, generator=generator)
            chosen = [i for i in range(start, end) if was_masked[i]]
            tokens = [int(out[i - start]) for i in chosen]
            source = "ar"
        else:
            slots = [i for i, m in enumerate(was_masked) if m]
            picks, x0, _ = pick(logits, slots, config=config, generator=generator)
            chosen, tokens = [slots[j] for j in picks.tolist()], x0[picks].tolist()
        middle, budget, grown, dropped = resize(middle, dict(zip(chosen, tokens)), budget, config=config, specials=sp)
        expansions, deletions = expansions + grown, deletions + dropped
        on_step(StepEvent(step=step, positions=tuple(chosen), tokens=tuple(tokens), source=source, block=span,
                          dlm_forwards=dlm.forwards - f0, ar_forwards=(writer.ar.forwards - a0) if writer else 0,
                          elapsed=time.perf_counter() - t0, canvas=tuple(middle)))
        step += 1
    return finished(middle, sp, dlm_forwards=dlm.forwards - f0, ar_forwards=(writer.ar.forwards - a0) if writer else 0,
                    steps=step, seconds=time.perf_counter() - t0, expansions=expansions, deletions=deletions)


def finished(middle: list[int] | tuple[int, ...], specials, **counts: Any) -> InfillResult:
    """The fill's result: the middle without masks left by the step cap (``truncated``), deletes or expands."""
    drop = (specials.mask, specials.eos, specials.expand)
    return InfillResult([t for t in middle if t not in drop], truncated=specials.mask in middle, **counts)


def step_cap(config: InfillConfig) -> int:
    """The most DLM forwards (steps) a fill runs: ``steps``, else 4 · max_middle_tokens."""
    return config.steps or 4 * config.max_middle_tokens


def allowed(logits: torch.Tensor, size: int, budget: int, *, config: InfillConfig, room: int, specials) -> torch.Tensor:
    """The middle's logits [M, V] with what a step may not commit at −inf, in place: the mask, and ``<|expand|>``
    when the middle is full (``max_middle_tokens``, or ``room`` = the context left by prefix and suffix) or the
    budget is spent (the official caps: max_gen_len, and 2048 tokens in all)."""
    logits[:, specials.mask] = float("-inf")
    if specials.expand is not None and (size >= min(config.max_middle_tokens, room) or budget <= 0):
        logits[:, specials.expand] = float("-inf")
    return logits


def pick(logits: torch.Tensor, slots: list[int], *, config: InfillConfig,
         generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DreamOn's own step over the masked ``slots``: (which of them it commits [k] (by confidence), the
    tokens of every slot [len(slots)], the confidences [len(slots)])."""
    _, x0, conf = sample_scored(logits[slots], config.sampling, generator, config.alg)
    return torch.topk(conf, min(config.tokens_per_step, len(slots))).indices, x0, conf


def resize(middle: list[int], committed: dict[int, int], budget: int, *, config: InfillConfig,
           specials) -> tuple[list[int], int, int, int]:
    """Write ``committed`` (slot -> token) into ``middle`` and apply its expands, then its deletes (expand before
    delete, DreamOn's evaluation generator); returns (the new middle, the budget left, expansions, deletions)."""
    mask, delete, expand = specials.mask, specials.eos, specials.expand
    new_middle, new_masked, expansions = [], [], 0
    for i, tok in enumerate(middle):
        tok = committed.get(i, tok)
        if expand is not None and tok == expand and i in committed and budget > 0:
            new_middle += [mask, mask]
            new_masked += [True, True]
            budget -= 1
            expansions += 1
        else:
            new_middle.append(tok if tok != expand else mask)
            new_masked.append(middle[i] == mask)
    dels = [i for i, t in enumerate(new_middle) if t == delete and new_masked[i]]
    if dels and config.broadcast_delete:
        first = dels[0]
        dels = sorted(set(dels) | {i for i in range(first, len(new_middle)) if new_middle[i] == mask})
    drop = set(dels)
    return [t for i, t in enumerate(new_middle) if i not in drop], budget, expansions, len(dels)


@dataclass(frozen=True)
class Fill:
    """DreamOn's state between two steps: the middle and the expansions left (:class:`DreamOnRule`'s canvas)."""

    middle: tuple[int, ...]
    budget: int


@dataclass
class DreamOnRule:
    """:func:`decode_dreamon`'s loop at T 0 without a helper, as decoding/freedave.py's step rule: a state is a
    :class:`Fill`; step i commits the K most confident masked slots of the middle (:func:`pick`), then its
    expands and deletes resize the middle (:func:`resize`), so a draft's canvas may be longer or shorter."""

    config: InfillConfig
    head: list[int]
    tail: list[int]
    specials: Any
    room: int  # the context left by the prefix and suffix
    device: Any

    def start(self) -> Fill:
        """The state before the first step: ``initial_masks`` masks, the whole expand budget."""
        return Fill((self.specials.mask,) * self.config.initial_masks, self.config.budget)

    def tokens(self, s: Fill) -> torch.Tensor:
        return torch.tensor(self.head + list(s.middle) + self.tail, device=self.device)

    def size(self, s: Fill) -> int:
        return len(s.middle)

    def rows(self, s: Fill, step: int) -> tuple[int, int] | None:
        if self.specials.mask not in s.middle or step >= step_cap(self.config):
            return None
        return len(self.head), len(self.head) + len(s.middle)

    def decide(self, s: Fill, view: View, step: int, tol: float) -> Decision | None:
        if (span := self.rows(s, step)) is None or (view.lo, view.hi) != span:
            return None
        logits = allowed(view.logits.clone(), len(s.middle), s.budget, config=self.config, room=self.room,
                         specials=self.specials)
        slots = [i for i, t in enumerate(s.middle) if t == self.specials.mask]
        picks, x0, conf = pick(logits, slots, config=self.config, generator=None)
        robust = (lead(conf.float(), len(picks)) > tol and filters_clear(logits[slots], self.config.sampling, tol)
                  and token_lead(process_logits(logits[slots][picks], self.config.sampling)) > tol)
        return Decision(step, torch.tensor(slots, device=picks.device)[picks] + len(self.head), x0[picks], robust)

    def after(self, s: Fill, d: Decision) -> Fill:
        middle, budget, _, _ = resize(list(s.middle), self.committed(d), s.budget, config=self.config,
                                      specials=self.specials)
        return Fill(tuple(middle), budget)

    def committed(self, d: Decision) -> dict[int, int]:
        """The decision's slot -> token, in the middle's offsets."""
        return dict(zip((d.positions - len(self.head)).tolist(), d.tokens.tolist()))


def _ar_span(logits: torch.Tensor, was_masked: list[bool], config: InfillConfig) -> tuple[int, int] | None:
    """CoDiLA's dynamic choice (decoding/codila.py::dynamic_span) over a block grid of the middle."""
    B = config.block_size
    grid = ((s, [i for i in range(s, min(s + B, len(was_masked))) if was_masked[i]])
            for s in range(0, len(was_masked), B))
    return dynamic_span(entropy(torch.softmax(logits, -1), logits), grid, config)
