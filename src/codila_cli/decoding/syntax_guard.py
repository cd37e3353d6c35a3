"""A lexical guard on the AR helper's choices (codila's own; docs/codila.md, "Syntax guard").

Two mistakes make Python source invalid whatever follows them (the tokenizer rejects them on the spot):
a closing bracket that does not match the innermost open one (or closes nothing), and a line break in a
one-line string. The guard follows brackets, strings and comments through the text left of a block and
through each token the helper chooses, and bans the tokens that would make either happen; it changes
nothing else (a token whose text breaks neither rule keeps its logit). The state is lexical only:

    stack    open brackets, innermost last          quote    "", ', ", ''' or \"\"\"
    escape   the last character in a string was \\    comment  after # up to the line break
    pending  an empty string '' / "" just closed: the same quote next opens a triple-quoted string
    run      in a triple-quoted string, how many of its quote characters came in a row

String prefixes (r, b, f) need no case: the tokenizer ends a string at the same quote either way, and an
f-string's braces are inside the string. Text with holes to its left, or that already breaks a rule, has
no state: the guard is then off for that block (``initial`` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass

_PAIRS = {")": "(", "]": "[", "}": "{"}


@dataclass(frozen=True)
class LexState:
    stack: tuple[str, ...] = ()
    quote: str = ""
    escape: bool = False
    comment: bool = False
    pending: str = ""
    run: int = 0


def feed(state: LexState, text: str) -> LexState | None:
    """The state after ``text``, or None when ``text`` breaks a rule from ``state``."""
    stack, quote, escape, comment, pending, run = (list(state.stack), state.quote, state.escape, state.comment,
                                                   state.pending, state.run)
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif len(quote) == 1:  # a one-line string; pending = quote while it is still empty
            if escape or ch == "\\":
                escape, pending = not escape, ""
            elif ch == "\n":
                return None  # a line break in a one-line string
            elif ch == quote:
                quote = ""
            else:
                pending = ""
        elif quote:  # a triple-quoted string
            if escape or ch == "\\":
                escape, run = not escape, 0
            elif ch == quote[0]:
                run += 1
                if run == 3:
                    quote, run = "", 0
            else:
                run = 0
        elif ch in "'\"":
            if pending == ch:  # '' then ': a triple-quoted string opens
                quote, pending = ch * 3, ""
            else:
                quote, pending = ch, ch
        else:
            pending = ""
            if ch == "#":
                comment = True
            elif ch in "([{":
                stack.append(ch)
            elif ch in _PAIRS:
                if not stack or stack[-1] != _PAIRS[ch]:
                    return None  # closes nothing, or not the innermost bracket
                stack.pop()
    return LexState(tuple(stack), quote, escape, comment, pending, run)


class SyntaxGuard:
    """The token texts of one tokenizer and the rules above; ``allowed`` is cached per (state, token).

    ``risky`` are the ids whose text holds a closing bracket or a line break: only they can break a rule,
    so a full-vocabulary ban (``banned``) looks at them alone."""

    def __init__(self, tokenizer, vocab_rows: int) -> None:
        n = min(vocab_rows, len(tokenizer))  # special tokens decode to "": they change no state
        self.texts = [tokenizer.decode([i], skip_special_tokens=True) for i in range(n)] + [""] * (vocab_rows - n)
        self.risky = [i for i, t in enumerate(self.texts) if any(c in t for c in ")]}\n")]
        self.tokenizer = tokenizer
        self._cache: dict[tuple[LexState, int], LexState | None] = {}
        self._banned: dict[LexState, list[int]] = {}

    def initial(self, ids: list[int]) -> LexState | None:
        """The state after the text of ``ids`` (prompt and committed tokens left of a block)."""
        return feed(LexState(), self.tokenizer.decode(ids, skip_special_tokens=True))

    def feed_ids(self, state: LexState, ids: list[int]) -> LexState | None:
        """The state after ``ids`` more of text (decoded together; a character split over two ids has no
        bracket or quote in it)."""
        return feed(state, self.tokenizer.decode(ids, skip_special_tokens=True)) if ids else state

    def step(self, state: LexState, tok: int) -> LexState | None:
        key = (state, tok)
        if key not in self._cache:
            if len(self._cache) > 200_000:
                self._cache.clear()
            self._cache[key] = feed(state, self.texts[tok]) if tok < len(self.texts) else state
        return self._cache[key]

    def allowed(self, state: LexState, tok: int) -> bool:
        return self.step(state, tok) is not None

    def banned(self, state: LexState) -> list[int]:
        """The ids a choice from ``state`` may not take."""
        if state not in self._banned:
            if len(self._banned) > 10_000:
                self._banned.clear()
            self._banned[state] = [i for i in self.risky if self.step(state, i) is None]
        return self._banned[state]


