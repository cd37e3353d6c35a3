"""Choice rules: the token-level heuristics on the AR helper's choices (decoding/soft_ar.py), behind one
interface. **Invariant: a rule may only lower a logit** (penalise it or ban it to −inf), never raise
one. The writer relies on it: a greedy row's winner is then among its top n raw logits whenever the
best of them after every rule is still above the row's n-th raw logit, so it scores a handful of
candidates instead of the vocabulary (``SoftBlockWriter._choose``). tests/test_knobs.py checks the
invariant for each rule.

A rule's *state* is what it knows of the text before the slot being chosen; it is immutable, so the
writer can step one state through each row's guesses. ``start`` gives the state before a block (None:
the rule is off for it), ``step`` the state after one more token (None: off from there on).

* :class:`RepetitionPenalty` (CTRL, Keskar et al. 2019; the Hugging Face ``repetition_penalty``): the
  logit z_v of every id v already in the text (prompt and committed canvas left of the block, plus the
  block's own tokens so far) becomes z_v / ρ if z_v > 0 else z_v · ρ.
* :class:`NoRepeatNGram` (the Hugging Face ``no_repeat_ngram_size``, over the completion only): an id
  that would repeat an n-gram of ids the completion already holds is banned. A loop repeats some
  n-gram; the prompt is left out, so a body may still quote its docstring; end-of-text ids (also the
  padding after the text) are never banned.
* :class:`GuardRule`: decoding/syntax_guard.py's rules: an id that makes the text invalid Python
  whatever follows is banned (raw completion prompts only; a text with a hole turns it off).

What each was measured to do on the bundled pair is in docs/results.md (the heuristics table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


class BlockText(Protocol):
    """What a rule may read of the text before a block (decoding/codila.py::_BlockText)."""

    @property
    def seen(self) -> list[int]: ...  # prompt and committed canvas left of the block, holes left out

    @property
    def left(self) -> list[int] | None: ...  # the whole text before the block; None when it has a hole

    @property
    def done(self) -> list[int] | None: ...  # the completion before the block; None when it has a hole


@dataclass(frozen=True)
class Text:
    """A BlockText from lists, for callers that have them (tests, tools)."""

    seen: list[int]
    left: list[int] | None = None
    done: list[int] | None = None


class ChoiceRule(Protocol):
    lazy: bool  # sampling checks a drawn id (``lower`` on one column) instead of lowering the whole row

    def start(self, text: BlockText) -> Any | None: ...

    def step(self, state: Any, tok: int) -> Any | None: ...

    def lower(self, state: Any, cols: list[int], vals: torch.Tensor) -> torch.Tensor:
        """``vals`` [n] (fp32) of columns ``cols`` after the rule: each at or below its input."""
        ...

    def lower_row(self, state: Any, z: torch.Tensor) -> None:
        """A whole row of logits [V] lowered in place."""
        ...


@dataclass(frozen=True)
class RepetitionPenalty:
    rho: float
    vocab_rows: int  # ids at or above it are not the AR's (never penalised)
    lazy = False

    def start(self, text: BlockText) -> tuple[frozenset[int], tuple[int, ...]] | None:
        if self.rho == 1.0:
            return None
        return frozenset(t for t in text.seen if t < self.vocab_rows), ()

    def step(self, state, tok: int):
        base, more = state
        return state if tok in base or tok in more or tok >= self.vocab_rows else (base, (*more, tok))

    def _penalise(self, v: torch.Tensor) -> torch.Tensor:
        return torch.where(v > 0, v / self.rho, v * self.rho)

    def lower(self, state, cols: list[int], vals: torch.Tensor) -> torch.Tensor:
        base, more = state
        hit = torch.tensor([c in base or c in more for c in cols], device=vals.device)
        return torch.where(hit, self._penalise(vals), vals)

    def lower_row(self, state, z: torch.Tensor) -> None:
        base, more = state
        cols = torch.tensor(sorted(base.union(more)), dtype=torch.long, device=z.device)
        z[cols] = self._penalise(z[cols])


class _NGrams:
    """The n-grams of one completion: ``repeats(tail)`` names the ids that would repeat one after the
    ids so far and then ``tail``."""

    def __init__(self, n: int, ids: list[int], free: frozenset[int] = frozenset()) -> None:
        self.n, self.ids, self.next, self.free = n, list(ids), {}, free
        for i in range(n - 1, len(ids)):
            self.next.setdefault(tuple(ids[i - n + 1 : i]), set()).add(ids[i])

    def repeats(self, tail: tuple[int, ...]) -> frozenset[int]:
        seq = self.ids + list(tail)
        if len(seq) < self.n - 1:
            return frozenset()
        key = tuple(seq[len(seq) - self.n + 1 :])
        out = set(self.next.get(key, ()))
        for i in range(max(len(self.ids), self.n - 1), len(seq)):  # the n-grams that end inside the tail
            if tuple(seq[i - self.n + 1 : i]) == key:
                out.add(seq[i])
        return frozenset(out - self.free)


@dataclass(frozen=True)
class NoRepeatNGram:
    n: int
    end_ids: frozenset[int]
    lazy = False

    def start(self, text: BlockText):
        done = text.done
        return None if self.n <= 0 or done is None else (_NGrams(self.n, done, self.end_ids), ())

    def step(self, state, tok: int):
        return state[0], (*state[1], tok)

    def _banned(self, state) -> frozenset[int]:
        return state[0].repeats(state[1])

    def lower(self, state, cols: list[int], vals: torch.Tensor) -> torch.Tensor:
        ban = self._banned(state)
        if not ban:
            return vals
        hit = torch.tensor([c in ban for c in cols], device=vals.device)
        return vals.masked_fill(hit, float("-inf"))

    def lower_row(self, state, z: torch.Tensor) -> None:
        ban = self._banned(state)
        if ban:
            z[sorted(ban)] = float("-inf")


class GuardRule:
    """The syntax guard as a rule; one per decode: it keeps the state of the last text it read, so the
    next block's start reads only the new ids (decoded together: a character split over two ids is
    whole there)."""

    lazy = True  # a full ban may scan the vocabulary: sampling checks its draws instead

    def __init__(self, guard: Any) -> None:
        self.guard = guard  # decoding/syntax_guard.py::SyntaxGuard
        self._last: tuple[list[int], Any] = ([], None)

    def start(self, text: BlockText):
        left = text.left
        if left is None:
            return None
        prev, state = self._last
        if state is not None and left[: len(prev)] == prev:
            state = self.guard.feed_ids(state, left[len(prev) :])
        else:
            state = self.guard.initial(left)
        self._last = (list(left), state)
        return state

    def step(self, state, tok: int):
        return self.guard.step(state, tok)

    def lower(self, state, cols: list[int], vals: torch.Tensor) -> torch.Tensor:
        hit = torch.tensor([not self.guard.allowed(state, c) for c in cols], device=vals.device)
        return vals.masked_fill(hit, float("-inf"))

    def lower_row(self, state, z: torch.Tensor) -> None:
        ban = self.guard.banned(state)
        if ban:
            z[ban] = float("-inf")


def build_rules(config: Any, *, ar: Any, end_ids: tuple[int, ...], raw: bool) -> list[ChoiceRule]:
    """The rules a CoDiLA config turns on, in the order they apply (decoding/config.py's knobs)."""
    rules: list[ChoiceRule] = []
    if config.ar_repetition_penalty != 1.0:
        rules.append(RepetitionPenalty(config.ar_repetition_penalty, ar.vocab_rows))
    if config.ar_no_repeat_ngram:
        rules.append(NoRepeatNGram(config.ar_no_repeat_ngram, frozenset(end_ids)))
    if config.ar_syntax_guard and raw:  # a chat answer is not code from its first token
        rules.append(GuardRule(syntax_guard(ar, end_ids=end_ids, stops=tuple(config.stop or ()))))
    return rules


_GUARDS: dict[tuple, Any] = {}


def syntax_guard(ar: Any, *, end_ids: tuple[int, ...] = (), stops: tuple[str, ...] = ()) -> Any:
    """The SyntaxGuard of a helper's tokenizer, end-of-text ids and stop lines, built once (its token
    texts take a pass over the vocabulary) and kept for a few such keys."""
    from codila_cli.decoding.syntax_guard import SyntaxGuard

    base = getattr(ar, "_ar", ar)  # a batch row's view (decoding/batch.py::RowAR) shares its helper's
    key = (id(base.tokenizer), base.vocab_rows, tuple(end_ids), tuple(stops))
    if key not in _GUARDS:
        if len(_GUARDS) > 8:  # a user's own --stop lines make new guards; keep a few
            _GUARDS.clear()
        _GUARDS[key] = (base.tokenizer, SyntaxGuard(base.tokenizer, base.vocab_rows, end_ids=tuple(end_ids),
                                                    stops=tuple(stops)))
    return _GUARDS[key][1]
