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
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from codila_cli.decoding.codila import dynamic_span
from codila_cli.decoding.config import InfillConfig
from codila_cli.decoding.events import OnStep, StepEvent, no_op
from codila_cli.decoding.marginals import entropy, sample_scored


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


def decode_dreamon(dlm, *, prefix_ids: list[int], suffix_ids: list[int], config: InfillConfig, writer=None,
                   generator: torch.Generator | None = None, on_step: OnStep = no_op) -> InfillResult:
    sp = dlm.specials
    mask, delete, expand = sp.mask, sp.eos, sp.expand
    if delete in prefix_ids:  # the official loop reads any end-of-text as the middle's end: it empties the middle
        raise ValueError(f"prefix_ids hold the end-of-text id {delete}: DreamOn's loop would end the middle at it "
                         "and delete every slot (encode text with models/tokens.py::encode_text, which keeps "
                         "such strings as text)")
    head = ([sp.bos] if sp.bos is not None else []) + list(prefix_ids)
    tail = list(suffix_ids) + [sp.eos]
    if len(head) + config.initial_masks + len(tail) > dlm.context_length:
        raise ValueError(f"prefix, initial middle and suffix ({len(head) + config.initial_masks + len(tail)} tokens) "
                         f"exceed the model's {dlm.context_length}-token context")
    middle = [mask] * config.initial_masks
    budget = config.budget
    cap = config.steps or 4 * config.max_middle_tokens
    f0, a0, t0 = dlm.forwards, (writer.ar.forwards if writer else 0), time.perf_counter()
    expansions = deletions = step = 0
    while mask in middle and dlm.forwards - f0 < cap:
        x = torch.tensor([head + middle + tail], device=dlm.device)
        logits = dlm.logits(x, rows=(len(head), len(head) + len(middle)))[0].clone()  # [M, V]
        logits[:, mask] = float("-inf")
        full = len(middle) >= config.max_middle_tokens or len(head) + len(middle) + len(tail) >= dlm.context_length
        if expand is not None and (full or budget <= 0):  # the official cap: max_gen_len, or 2048 in all
            logits[:, expand] = float("-inf")
        was_masked = [t == mask for t in middle]
        slots = [i for i, m in enumerate(was_masked) if m]
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
            _, x0, conf = sample_scored(logits[slots], config.sampling, generator, config.alg)
            picks = torch.topk(conf, min(config.tokens_per_step, len(slots))).indices.tolist()
            chosen = [slots[j] for j in picks]
            tokens = [int(x0[j]) for j in picks]
        for i, tok in zip(chosen, tokens):
            middle[i] = tok
        committed = dict(zip(chosen, tokens))
        # expand before delete (DreamOn's evaluation generator)
        new_middle, new_masked = [], []
        for i, tok in enumerate(middle):
            if expand is not None and committed.get(i) == expand and budget > 0:
                new_middle += [mask, mask]
                new_masked += [True, True]
                budget -= 1
                expansions += 1
            else:
                new_middle.append(tok if tok != expand else mask)
                new_masked.append(was_masked[i])
        middle, was_masked = new_middle, new_masked
        dels = [i for i, t in enumerate(middle) if t == delete and was_masked[i]]
        if dels and config.broadcast_delete:
            first = dels[0]
            dels = sorted(set(dels) | {i for i in range(first, len(middle)) if middle[i] == mask})
        deletions += len(dels)
        drop = set(dels)
        middle = [t for i, t in enumerate(middle) if i not in drop]
        on_step(StepEvent(step=step, positions=tuple(chosen), tokens=tuple(tokens), source=source, block=span,
                          dlm_forwards=dlm.forwards - f0, ar_forwards=(writer.ar.forwards - a0) if writer else 0,
                          elapsed=time.perf_counter() - t0, canvas=tuple(middle)))
        step += 1
    truncated = mask in middle
    middle = [t for t in middle if t not in (mask, delete, expand)]
    return InfillResult(middle, dlm.forwards - f0, (writer.ar.forwards - a0) if writer else 0, step,
                        time.perf_counter() - t0, expansions, deletions, truncated)


def _ar_span(logits: torch.Tensor, was_masked: list[bool], config: InfillConfig) -> tuple[int, int] | None:
    """CoDiLA's dynamic choice (decoding/codila.py::dynamic_span) over a block grid of the middle."""
    B = config.block_size
    grid = ((s, [i for i in range(s, min(s + B, len(was_masked))) if was_masked[i]])
            for s in range(0, len(was_masked), B))
    return dynamic_span(entropy(torch.softmax(logits, -1), logits), grid, config)
