"""Which language a file or a request is in, and what codila knows about each one (pure Python, no torch).

A :class:`Language` names its tree-sitter grammar (tree-sitter-language-pack, one pinned bundle; Python's
comes from tree-sitter-python as before), its line comment (an infill instruction is written as one), and
how a line opens an indented block (Python's ``:``, a brace language's ``{`` / ``(`` / ``[``, the shell's
``then`` / ``do``): infill's region and indentation rules read it. The language comes from, in this
order: ``--language`` (or a request's ``language`` field: a name, an alias or an editor's language id such
as ``typescriptreact``), the file's extension, a ``#!`` line. A file none of these names is not checked:
codila then says "not checked", never "does not parse".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

BRACES = ("{", "(", "[")


@dataclass(frozen=True)
class Language:
    name: str  # codila's name, shown in reports
    grammar: str | None  # tree-sitter-language-pack's name; None: no grammar (never checked)
    extensions: tuple[str, ...] = ()
    comment: str = "//"  # line comment
    openers: tuple[str, ...] = BRACES  # a line ending with one opens an indented block
    aliases: tuple[str, ...] = ()  # other names: editors' language ids, short names, interpreters

    @property
    def python(self) -> bool:
        return self.name == "python"

    def comment_line(self, text: str) -> str:
        """``text`` as one comment line (a block comment is closed on the same line)."""
        close = {"/*": " */", "<!--": " -->", "(*": " *)"}.get(self.comment, "")
        return f"{self.comment} {text}{close}"

    def opens_block(self, line: str) -> bool:
        """Whether ``line`` ends by opening a block whose body is indented deeper (a trailing comment is
        not read past: such a line does not count)."""
        code = line.rstrip()
        for opener in self.openers:
            if opener[-1].isalpha():  # a keyword: a whole word at the end
                if re.search(rf"(^|[\s;]){re.escape(opener)}$", code):
                    return True
            elif code.endswith(opener):
                return True
        return False


def _lang(name: str, grammar: str | None, ext: str, comment: str = "//", openers: tuple[str, ...] = BRACES,
          aliases: str = "") -> Language:
    return Language(name, grammar, tuple(f".{e}" for e in ext.split()), comment, openers, tuple(aliases.split()))


SHELL_OPENERS = ("then", "do", "else", "{", "(", "in")
LANGUAGES: tuple[Language, ...] = (
    _lang("python", "python", "py pyi pyw", "#", (":",), "py python3 python2"),
    _lang("javascript", "javascript", "js mjs cjs jsx", aliases="js node javascriptreact jsx"),
    _lang("typescript", "typescript", "ts mts cts", aliases="ts"),
    _lang("tsx", "tsx", "tsx", aliases="typescriptreact"),
    _lang("go", "go", "go", aliases="golang"),
    _lang("rust", "rust", "rs", aliases="rs"),
    _lang("java", "java", "java"),
    _lang("c", "c", "c h"),
    _lang("cpp", "cpp", "cc cpp cxx c++ hpp hh hxx h++ ipp", aliases="c++ cxx"),
    _lang("csharp", "csharp", "cs", aliases="c# cs c_sharp"),
    _lang("bash", "bash", "sh bash zsh ksh", "#", SHELL_OPENERS, "sh shell shellscript zsh ksh dash"),
    _lang("ruby", "ruby", "rb rake gemspec", "#", ("do", "then", "else", "begin", "{", "(", "[", "|"), "rb"),
    _lang("php", "php", "php phtml"),
    _lang("kotlin", "kotlin", "kt kts", aliases="kt"),
    _lang("swift", "swift", "swift"),
    _lang("scala", "scala", "scala sc"),
    _lang("lua", "lua", "lua", "--", ("then", "do", "else", "(", "{", "function()"), ""),
    _lang("dart", "dart", "dart"),
    _lang("zig", "zig", "zig"),
    _lang("r", "r", "r R", "#", BRACES),
    _lang("julia", "julia", "jl", "#", ()),
    _lang("perl", "perl", "pl pm", "#", BRACES),
    _lang("haskell", "haskell", "hs", "--", ("where", "do", "of", "=")),
    _lang("elixir", "elixir", "ex exs", "#", ("do", "->", "(", "[", "{")),
    _lang("ocaml", "ocaml", "ml", "(*", ()),
    _lang("sql", "sql", "sql", "--", ("(",)),
    _lang("html", "html", "html htm", "<!--", (">",)),
    _lang("css", "css", "css", "/*"),
    _lang("json", "json", "json", "//"),
    _lang("yaml", "yaml", "yaml yml", "#", (":",)),
    _lang("toml", "toml", "toml", "#", ()),
)
_BY_NAME = {key: lang for lang in LANGUAGES for key in (lang.name, *lang.aliases)}
_BY_EXT = {ext: lang for lang in LANGUAGES for ext in lang.extensions}


def names() -> tuple[str, ...]:
    """The languages ``--language`` takes (each also by its aliases)."""
    return tuple(lang.name for lang in LANGUAGES)


def by_name(name: str) -> Language | None:
    """A language from its name, an alias or an editor's language id (case-insensitive); None if unknown."""
    return _BY_NAME.get(name.strip().lower())


def for_path(path: str) -> Language | None:
    """The language of a file name, by its extension (``Makefile``-like names have none); None if unknown."""
    suffix = PurePath(path).suffix
    return _BY_EXT.get(suffix) or _BY_EXT.get(suffix.lower())


def for_shebang(text: str) -> Language | None:
    """The language a ``#!`` first line names (``#!/usr/bin/env python3``, ``#!/bin/bash``); None if none."""
    if not text.startswith("#!"):
        return None
    words = text[2:].split("\n", 1)[0].split()
    if words and PurePath(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    program = re.sub(r"[0-9.]+$", "", PurePath(words[0]).name) if words else ""
    return by_name(program) if program else None


_MODELINE = (re.compile(r"\b(?:vim?|ex):.*?\b(?:ft|filetype|syntax)=([A-Za-z0-9_+#-]+)"),  # vim: set ft=go:
             re.compile(r"-\*-.*?\bmode:\s*([A-Za-z0-9_+#-]+)", re.IGNORECASE),  # -*- mode: rust -*-
             re.compile(r"-\*-\s*([A-Za-z0-9_+#-]+)\s*-\*-"))  # -*- python -*-


def for_modeline(text: str) -> Language | None:
    """The language an editor modeline in the first or last five lines names (vim's ``ft=``/``filetype=``,
    Emacs' ``-*- mode: … -*-``); None if none names a language codila knows."""
    lines = text.splitlines()
    for line in [*lines[:5], *lines[-5:]]:
        for pattern in _MODELINE:
            m = pattern.search(line)
            if m and (lang := by_name(m[1].lower())) is not None:
                return lang
    return None


def resolve(*, language: str | None = None, path: str | None = None, text: str = "") -> Language | None:
    """The language to check with: ``language`` when given (ValueError if codila does not know it), else
    the file's extension, else its ``#!`` line, else an editor modeline; None when none of them names one."""
    if language:
        lang = by_name(language)
        if lang is None:
            raise ValueError(f"unknown language {language!r} (known: {', '.join(names())})")
        return lang
    return (for_path(path) if path else None) or for_shebang(text) or for_modeline(text)


PYTHON = _BY_NAME["python"]
GENERIC = Language("text", None, comment="#", openers=(":", *BRACES))  # block rules for a file of no known language
