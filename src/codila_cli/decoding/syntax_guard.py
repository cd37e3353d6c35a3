"""A lexical guard on the AR helper's choices (codila's own; docs/codila.md, "Syntax guard").

Each of these mistakes makes Python source invalid whatever follows it, and each shows in the text as
it is written, so the guard can ban the token that makes it (every other token keeps its logit):

1. a closing bracket that does not match the innermost open one, or closes nothing;
2. a line break in a one-line string;
3. a wrong indent: a code line deeper than its block after a line that did not end in ``:``; a code
   line that is not deeper after one that did; a dedent to a depth no enclosing block has (comment and
   blank lines do not count, as for Python);
4. an assignment ``=`` in a statement led by a keyword (``return x = y``, ``if a = b:``), outside
   brackets and before any lambda; or an ``=`` right after an operator that ends in one (``===``,
   ``<==``, ``:==``);
5. outside strings and comments, a character no Python token holds: ``$``, ``?``, a backtick, or a
   non-ASCII character that cannot be part of a name (U+FFFD, the text of a token that is only part of
   a character; an emoji; a non-ASCII space);
6. a line break that ends a compound statement's header (``if``, ``for``, ``def`` …) before its ``:``;
7. a statement that begins with ``>``, ``<``, ``=``, ``,``, ``;``, ``!``, ``%``, ``&``, ``|``, ``^``,
   ``/`` or ``:`` (a doctest's ``>>> f(x)`` outside its docstring);
8. a ``:`` inside parentheses, other than a lambda's, a ``def``'s annotations or ``:=`` (``if f(x:``,
   the parenthesis left open before a header's colon);
9. the end of the text (an end-of-text id) where a bracket or string is open, after a backslash or a
   keyword-led ``=``, inside a header, or where a block has no body yet;
10. ``->`` anywhere but outside brackets in a ``def``'s header (``if f(x) -> y:``);
11. a ``:`` outside brackets in a statement led by a simple statement's keyword, before any lambda
    (``return f(x):``, ``raise E:``, ``not x: int``; none of them is a header or an annotation);
12. with stop lines (decoding/stops.py: the output ends before a generated line that starts with one
    of them, as at an end-of-text id), a line that starts with one where the text may not end (rule
    9's test, at the line break before it): a ``#`` at column 0 inside open brackets ends the output
    with them open. Lines that start in the prompt do not count, as for the stop itself.

The state follows brackets, strings (one-line, triple-quoted, escapes, a closing quote right after an
empty string) and comments, and, outside brackets, the logical line: its indentation, whether it ends
in ``:``, and its first word. String prefixes (r, b, f) need no case: the tokenizer ends a string at
the same quote either way. A tab or form feed in an indentation turns rule 3 off for the rest of the
text. A text that already breaks a rule has no state, and the guard is then off for that block
(``initial`` returns None; a left text that breaks rule 3 only is read with rule 3 off). A token the
helper chooses is held to one more thing (``after_token``): it may not stop halfway into ``==`` or
``:=`` where only that could follow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

_PAIRS = {")": "(", "]": "[", "}": "{"}
_OPENER = {"(": "(", "λ": "(", "[": "[", "{": "{"}  # λ: a parenthesis a lambda came in (its ':' is fine)
# statements led by these may not hold a top-level assignment (soft keywords match/case/type may, and
# None/True/False may lead an annotation's value, x: None = None)
_HEADERS = frozenset({"if", "elif", "else", "while", "for", "with", "def", "class", "async", "try", "except", "finally"})
_KEYWORDS = _HEADERS | {"return", "await", "assert", "del", "raise", "yield", "import", "from", "global", "nonlocal",
                        "pass", "break", "continue", "not", "and", "or", "in", "is"}
_PREFIXES = frozenset(k[:i] for k in _KEYWORDS for i in range(1, len(k) + 1))
_LAMBDA = "lambda"
_OPS = frozenset("!<>+-*/%&|^@")  # an '=' right after one of these (or ':' or '=') completes an operator
_BAD_START = frozenset("><=,;!%&|^/:")  # rule 7


@dataclass(frozen=True)
class LexState:
    """The guard's state after some text.

    stack    open brackets, innermost last (λ: a "(" with a lambda in it)
    quote    "", ', ", ''' or \"\"\"
    escape   the last character in a string was \\
    comment  after # up to the line break
    pending  an empty string '' / "" just closed: the same quote next opens a triple-quoted string
    run      in a triple-quoted string, how many of its quote characters came in a row
    indents  the indentation of the open blocks, outermost first (None: rule 3 is off)
    col      at the start of a line (nothing but spaces yet), their number; -1 elsewhere
    expect   the last logical line ended in ':' (the next code line must be deeper)
    colon    this logical line's last character so far (outside brackets) is ':'
    cont     a backslash just came: the next line break continues the logical line
    joined   that line break just came (the text may not end right after it, rule 9)
    stmt     the statement's first word so far: "" none yet, a keyword prefix, "!" keyword-led (an
             assignment would break rule 4), "h" a compound statement's header (the same, and its
             line may not end before its ':'), "D" a def's header (the same, annotations allowed),
             "-" neither
    lam      how much of ``lambda`` the current word has matched (0 between words, -1 a word that
             is not lambda)
    prev     the last character outside strings: "=" a lone '=', "e" an operator ending in '=',
             ":" a colon, "-" a minus, "o" another operator character, "" anything else
    eq       an '=' came in a keyword-led statement: the next character must be '=' (``==``)
    wal      a ':' came inside parentheses (rule 8): the next character must be '=' (``:=``)
    line     with stop lines: this physical line's text while it may still become one (None: it
             cannot, or it started in the prompt)
    unfinished  with stop lines: the text could not end at this line's start (rule 12)
    """

    stack: tuple[str, ...] = ()
    quote: str = ""
    escape: bool = False
    comment: bool = False
    pending: str = ""
    run: int = 0
    indents: tuple[int, ...] | None = (0,)
    col: int = 0
    expect: bool = False
    colon: bool = False
    cont: bool = False
    joined: bool = False
    stmt: str = ""
    lam: int = 0
    prev: str = ""
    eq: bool = False
    wal: bool = False
    line: str | None = None
    unfinished: bool = False


_FIELDS = tuple(LexState.__dataclass_fields__)


def feed(state: LexState, text: str, stops: tuple[str, ...] = ()) -> LexState | None:
    """The state after ``text``, or None when ``text`` breaks a rule from ``state``; ``stops`` the stop
    lines of rule 12 (none: the rule is off)."""
    lex = _Lexer(state)
    char = lex.char
    for ch in text:
        if stops and ch != "\n" and lex.line is not None:  # rule 12
            line = lex.line + ch
            if line in stops and lex.unfinished:
                return None
            lex.line = line if any(len(p) > len(line) and p.startswith(line) for p in stops) else None
        if not char(ch):
            return None
        if stops and ch == "\n":
            lex.line, lex.unfinished = "", not finished(lex)
    return lex.freeze()


def after_token(state: LexState, text: str, stops: tuple[str, ...] = ()) -> LexState | None:
    """``feed`` for one token the helper chooses, which may also not stop halfway into ``==`` or ``:=``
    where only that could follow (``return x =``, ``f(a:``): the helper then takes its next choice
    instead of being forced into ``return x ==(`` or ``f(a:=``. The one valid spelling this loses is
    ``:=`` split over two tokens (``(n:=1)`` with no space; a tokenizer's `` :=`` is kept)."""
    out = feed(state, text, stops)
    return None if out is not None and text and (out.eq or out.wal) else out


def finished(state) -> bool:
    """Whether the text may end here (rule 9); ``state`` a LexState or a _Lexer."""
    return not (state.stack or state.quote or state.eq or state.cont or state.joined or state.colon
                or state.expect or state.stmt in ("h", "D"))


class _Lexer:
    """A mutable LexState for one ``feed``: ``char`` returns False where a character breaks a rule."""

    __slots__ = _FIELDS

    def __init__(self, state: LexState) -> None:
        for name in _FIELDS:
            setattr(self, name, getattr(state, name))
        self.stack = list(state.stack)

    def freeze(self) -> LexState:
        return LexState(*(tuple(self.stack) if n == "stack" else getattr(self, n) for n in _FIELDS))

    def char(self, ch: str) -> bool:
        self.joined = False  # anything after a backslash-newline, even a space or a line break, may end the text
        if self.comment:
            if ch != "\n":
                return True
            self.comment = False
            return self._newline()
        if self.quote:
            return self._in_string(ch)
        if ch == "\r":
            return True
        if self.eq:  # rule 4: `kw … x =` then anything but a second '='
            if ch != "=":
                return False
            self.eq, self.prev, self.pending = False, "e", ""
            return True
        if self.wal:  # rule 8: `f(a:` then anything but '=' (a walrus)
            if ch != "=":
                return False
            self.wal, self.prev, self.pending = False, "e", ""
            return True
        if ch.isalnum() or ch == "_":
            self.lam = self.lam + 1 if 0 <= self.lam < len(_LAMBDA) and _LAMBDA[self.lam] == ch else -1
        else:
            if self.lam == len(_LAMBDA):
                self._lambda()
            self.lam = 0
        if self.prev == ":" and ch != "=" and self.stmt in ("!", "h", "D") and not self.stack:
            self.stmt = ""  # a compound statement's ':': a new statement may follow
        if ch == "\n":
            return self._newline()
        if self.col >= 0:  # nothing but spaces on this line yet
            if ch == " ":
                self.col += 1
                return True
            if ch in "\t\f":
                self.indents = None  # rule 3 off: tabs need Python's own column arithmetic
                return True
            if ch == "#":  # a comment line: not a line for indentation
                self.comment = True
                return True
            if not self._indent():
                return False
        if _foreign(ch):
            return False  # rule 5
        if ch == "=" and self.prev == "e":
            return False  # rule 4: === <== :==
        if ch == ">" and self.prev == "-" and (self.stmt != "D" or self.stack):
            return False  # rule 10: -> outside a def's header
        self.cont = ch == "\\"
        top = not self.stack
        if ch in "'\"":
            if self.pending == ch:  # '' then ': a triple-quoted string opens
                self.quote, self.pending = ch * 3, ""
            else:
                self.quote, self.pending = ch, ch
        else:
            self.pending = ""
            if ch == "#":
                self.comment = True
                return True
            if ch in "([{":
                self.stack.append(ch)
            elif ch in _PAIRS:
                if not self.stack or _OPENER[self.stack[-1]] != _PAIRS[ch]:
                    return False  # rule 1
                self.stack.pop()
            elif ch == ":" and self.stack and self.stack[-1] == "(" and self.stmt != "D":
                self.wal = True
        if (top or not self.stack) and not self._statement(ch):
            return False
        if ch == "=":
            self.prev = "e" if self.prev in ("=", "o", ":", "-") else "="
        else:
            self.prev = ch if ch in ":-" else "o" if ch in _OPS else ""
        return True

    def _in_string(self, ch: str) -> bool:
        if len(self.quote) == 1:  # a one-line string; pending = quote while it is still empty
            if self.escape or ch == "\\":
                self.escape, self.pending = not self.escape, ""
            elif ch == "\n":
                return False  # rule 2
            elif ch == self.quote:
                self.quote = ""
            else:
                self.pending = ""
        elif self.escape or ch == "\\":  # a triple-quoted string
            self.escape, self.run = not self.escape, 0
        elif ch == self.quote[0]:
            self.run += 1
            if self.run == 3:
                self.quote, self.run = "", 0
        else:
            self.run = 0
        return True

    def _lambda(self) -> None:
        """A lambda came: its ':' may follow inside parentheses, its defaults after a keyword."""
        if self.stack:
            if self.stack[-1] == "(":
                self.stack[-1] = "λ"
        elif self.stmt in ("!", "h", "D"):
            self.stmt = "-"  # a lambda's defaults may follow (return lambda x=1: x)

    def _newline(self) -> bool:
        if self.stack or self.cont:  # inside brackets, or after a backslash: the logical line goes on
            self.cont, self.joined = False, self.cont
            return True
        if self.stmt in ("h", "D"):
            return False  # rule 6: a header without its ':'
        if self.col < 0:  # a logical line ends (not a blank or comment line)
            self.expect = self.colon
        self.col, self.colon, self.stmt, self.prev, self.pending = 0, False, "", "", ""
        return True

    def _indent(self) -> bool:
        """Rule 3, at a line's first character of code."""
        col, self.col = self.col, -1
        ind = self.indents
        if ind is None:
            self.expect = False
            return True
        if self.expect:
            if col <= ind[-1]:
                return False  # expected an indented block
            self.indents = ind + (col,)
        elif col > ind[-1]:
            return False  # unexpected indent
        elif col < ind[-1]:
            while ind[-1] > col:
                ind = ind[:-1]
            if ind[-1] != col:
                return False  # unindent does not match any outer indentation level
            self.indents = ind
        self.expect = False
        return True

    def _statement(self, ch: str) -> bool:
        """Follows the statement's first word, and in a keyword-led one its '=' (rules 4 and 7)."""
        st = self.stmt
        if st == "" and ch in _BAD_START:
            return False  # rule 7: no statement begins so
        if ch == ";":
            self.stmt, self.colon = "", False
            return True
        self.colon = ch == ":" or (self.colon and ch in " \t\f\\")
        if st in ("!", "h", "D"):
            if ch == "=" and self.prev == "":
                self.eq = True
        elif st != "-":
            if ch.isalnum() or ch == "_":
                self.stmt = st + ch if st + ch in _PREFIXES else "-"
            elif st or ch not in " \t\f":
                self.stmt = ("D" if st in ("def", "async") else "h" if st in _HEADERS else "!" if st in _KEYWORDS
                             else "-")
                if self.stmt != "-" and ch == "=" and self.prev == "":
                    self.eq = True
        # rule 11: return x: (a header's or a lambda's ':' never comes in a "!" statement)
        return not (ch == ":" and self.stmt == "!" and not self.stack)


class SyntaxGuard:
    """The token texts of one tokenizer and the rules above; ``allowed`` is cached per (state, token).

    ``risky`` are the end-of-text ids and the ids ``_may_break`` names: from most states only they can
    break a rule; from the states ``_any_id_may_break`` names (a line's or a statement's start, a
    keyword-led '=' …) ``banned`` looks at every id."""

    def __init__(self, tokenizer, vocab_rows: int, *, end_ids: tuple[int, ...] = (), stops: tuple[str, ...] = ()) -> None:
        n = min(vocab_rows, len(tokenizer))  # special tokens decode to "": they change no state
        self.texts = [tokenizer.decode([i], skip_special_tokens=True) for i in range(n)] + [""] * (vocab_rows - n)
        self.end_ids = frozenset(i for i in end_ids if i < vocab_rows)  # rule 9
        self.stops = tuple(p for p in stops if p)  # rule 12
        self.risky = [i for i, t in enumerate(self.texts) if i in self.end_ids or _may_break(t)]
        self.tokenizer = tokenizer
        self._cache: dict[tuple[LexState, int], LexState | None] = {}
        self._banned: dict[LexState, list[int]] = {}

    def initial(self, ids: list[int]) -> LexState | None:
        """The state after the text of ``ids`` (prompt and committed tokens left of a block); a text that
        breaks rule 3 only (a snippet cut out of an indented block) is read with rule 3 off."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        state = feed(LexState(), text)
        state = state if state is not None else feed(LexState(indents=None), text)
        if state is None or not self.stops:
            return state
        start = not text or text.endswith("\n")  # only a line that starts in the completion is a stop line
        return replace(state, line="" if start else None, unfinished=start and not finished(state))

    def feed_ids(self, state: LexState, ids: list[int]) -> LexState | None:
        """The state after ``ids`` more of text (decoded together: a character split over two ids is
        whole here)."""
        return feed(state, self.tokenizer.decode(ids, skip_special_tokens=True), self.stops) if ids else state

    def step(self, state: LexState, tok: int) -> LexState | None:
        key = (state, tok)
        if key not in self._cache:
            if len(self._cache) > 200_000:
                self._cache.clear()
            if tok in self.end_ids:
                self._cache[key] = state if finished(state) else None
            else:
                self._cache[key] = after_token(state, self.texts[tok], self.stops) if tok < len(self.texts) else state
        return self._cache[key]

    def allowed(self, state: LexState, tok: int) -> bool:
        return self.step(state, tok) is not None

    def banned(self, state: LexState) -> list[int]:
        """The ids a choice from ``state`` may not take."""
        if state not in self._banned:
            if len(self._banned) > 2_000:  # a state at a line's start may ban most of the vocabulary
                self._banned.clear()
            ids = range(len(self.texts)) if _any_id_may_break(state) else self.risky
            self._banned[state] = [i for i in ids if self.step(state, i) is None]
        return self._banned[state]


def _may_break(text: str) -> bool:
    """Whether a token's text can break a rule from a state in the middle of a statement (see
    ``_any_id_may_break`` for the others): only through a closing bracket, a line break, '=', rule 5's
    characters,
    ';' or ':' (a statement may begin after them), or '>' (rule 10)."""
    return any(c in ")]}\n=;:>" or _foreign(c) for c in text)


def _foreign(ch: str) -> bool:
    """Rule 5: a character Python's tokenizer rejects outside strings and comments (it reads every
    non-ASCII character as part of a name, and a name may not hold this one)."""
    return ch in "$?`" or (ch > "\x7f" and not ("a" + ch).isidentifier())


def _any_id_may_break(state: LexState) -> bool:
    """States from which a token without any of those can break a rule: a keyword-led '=' (rule 4), a
    ':' in parentheses (rule 8), the start of a statement (rule 7; a line's start, rule 3, is one),
    a compound statement's ':' (a statement begins after it), a line that may still become a stop line
    where the text may not end (rule 12)."""
    return (state.eq or state.wal or (state.stmt == "" and not state.comment)
            or (state.prev == ":" and state.stmt in ("!", "h", "D")) or (state.line is not None and state.unfinished))
