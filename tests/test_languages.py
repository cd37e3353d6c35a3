"""Every language an editor sends: which language a file is, the syntax report by language ("not
checked" where codila has no grammar, never "does not parse"), infill's region and indentation rules,
and bytes outside the fill kept exactly."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from codila_cli import languages
from codila_cli.cli import app
from codila_cli.infill_files import find_region, indent_unit, place_middle, read_source
from codila_cli.report import clean, syntax_line
from codila_cli.syntax import check_code, not_checked

runner = CliRunner()

# one valid and one broken program per language the issue names (the broken one: a bracket left open)
PROGRAMS = {
    "python": ("def add(a, b):\n    return a + b\n", "def add(a, b:\n    return a + b\n"),
    "javascript": ("function add(a, b) {\n  return a + b;\n}\n", "function add(a, b {\n  return a + b;\n}\n"),
    "typescript": ("function add(a: number, b: number): number {\n  return a + b;\n}\n",
                   "function add(a: number, b: number): number {\n  return (a + b;\n}\n"),
    "go": ("package main\n\nfunc add(a int, b int) int {\n\treturn a + b\n}\n",
           "package main\n\nfunc add(a int, b int) int {\n\treturn (a + b\n}\n"),
    "rust": ("fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n", "fn add(a: i32, b: i32) -> i32 {\n    (a + b\n}\n"),
    "java": ("class A {\n  int add(int a, int b) {\n    return a + b;\n  }\n}\n",
             "class A {\n  int add(int a, int b) {\n    return (a + b;\n  }\n}\n"),
    "c": ("int add(int a, int b) {\n  return a + b;\n}\n", "int add(int a, int b) {\n  return (a + b;\n}\n"),
    "cpp": ("#include <vector>\nint add(int a, int b) {\n  return a + b;\n}\n",
            "#include <vector>\nint add(int a, int b) {\n  return (a + b;\n}\n"),
    "bash": ('add() {\n  echo $(( $1 + $2 ))\n}\nif [ -n "$1" ]; then\n  add 1 2\nfi\n',
             'add() {\n  echo $(( $1 + $2 ))\n}\nif [ -n "$1" ]; then\n  add 1 2\n'),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_language_parses_its_own_code_and_locates_a_break(name):
    lang = languages.by_name(name)
    good, bad = PROGRAMS[name]
    ok = check_code(good, language=lang)
    assert ok.valid and ok.checked and ok.language == name and not ok.errors
    broken = check_code(bad, language=lang)
    assert broken.checked and not broken.valid and broken.errors
    assert all(1 <= e.line <= bad.count("\n") + 1 for e in broken.errors)
    # and the valid program of one language is not reported as valid Python (the old, wrong default)
    if name != "python":
        assert not check_code(good, language=languages.PYTHON).valid


def test_unknown_language_is_not_checked_never_does_not_parse():
    report = check_code("∀x. P(x) ⊢ Q", language=None)
    assert report == not_checked(None) and not report.checked
    assert syntax_line(report).startswith("syntax: not checked")
    assert "does not parse" not in syntax_line(report) and not clean(report)
    assert report.to_dict()["valid"] is None and report.to_dict()["checked"] is False
    js = check_code("let x = 1;\n", language=languages.by_name("js"))
    assert syntax_line(js) == "syntax: parses (javascript)"


def test_language_from_flag_extension_shebang_and_editor_ids():
    assert languages.resolve(path="src/app.TS").name == "typescript"
    assert languages.resolve(path="main.go").name == "go" and languages.resolve(path="lib.rs").name == "rust"
    assert languages.resolve(path="Makefile") is None and languages.resolve(path="notes.xyz") is None
    assert languages.resolve(path="run", text="#!/usr/bin/env -S python3 -u\nprint(1)\n").name == "python"
    assert languages.resolve(path="run", text="#!/bin/bash\necho hi\n").name == "bash"
    for editor_id, name in [("typescriptreact", "tsx"), ("javascriptreact", "javascript"), ("shellscript", "bash"),
                            ("csharp", "csharp"), ("C++", "cpp"), ("golang", "go")]:
        assert languages.resolve(language=editor_id).name == name
    assert languages.resolve(language="go", path="x.py").name == "go"  # the flag wins
    with pytest.raises(ValueError, match="unknown language 'klingon'"):
        languages.resolve(language="klingon")


def _write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


def test_region_rules_follow_the_language(tmp_path):
    js = read_source(str(_write(tmp_path, "a.js", "function f(a) {\n  const b = a;\n}\n")))
    assert js.language.name == "javascript" and indent_unit(js.lines) == "  "
    assert find_region(js, line=2, lines_range=None).indent == "  "  # inside the braces, at the file's unit
    go = read_source(str(_write(tmp_path, "m.go", "package m\n\nfunc f() int {\n\treturn 1\n}\n")))
    assert find_region(go, line=4, lines_range=None).indent == "\t"
    sh = read_source(str(_write(tmp_path, "s.sh", "if true; then\n    echo a\nfi\n")))
    assert find_region(sh, line=2, lines_range=None).indent == "    "
    # a block opened on the line before, with nothing after it yet: one level deeper, the file's unit
    rs = read_source(str(_write(tmp_path, "r.rs", "fn f() {\n  let a = 1;\n}\nfn g() {\n")))
    assert find_region(rs, line=5, lines_range=None).indent == "  "
    marked = read_source(str(_write(tmp_path, "m.ts", "function f(): number {\n    // codila: fill\n}\n")))
    r = find_region(marked, line=None, lines_range=None)
    assert (r.start, r.end, r.indent, r.how) == (1, 2, "    ", "marker")


def test_placed_middle_keeps_the_models_legal_indentation_in_braces(tmp_path):
    src = read_source(str(_write(tmp_path, "a.js", "function f(a) {\n  if (a) {\n    return 1;\n  }\n}\n")))
    region = find_region(src, line=4, lines_range=None)  # before `  }`: the region's indent is the next line's
    assert place_middle(src, region, "x = 2;\n") == "  x = 2;\n"


def test_stdin_language_is_python_only_when_it_parses_as_python():
    assert read_source("-", stdin_bytes=b"def f():\n    return 1\n").language.name == "python"
    assert read_source("-", stdin_bytes=b"function f() { return 1; }\n").language is None
    assert read_source("-", stdin_bytes=b"function f() { return 1; }\n", language="js").language.name == "javascript"


FILES = {  # each with a region in the middle; the bytes around it must come back exactly
    "app.js": "// utilities\r\nfunction add(a, b) {\r\n  return a + b;\r\n}\r\n\r\nfunction mul(a, b) {\r\n  // codila: fill\r\n}\r\n",
    "app.ts": "export function add(a: number, b: number): number {\n  return a + b;\n}\n\nexport function mul(a: number, b: number): number {\n  // codila: fill\n}\n",
    "main.go": "package main\n\nfunc add(a, b int) int {\n\treturn a + b\n}\n\nfunc mul(a, b int) int {\n\t// codila: fill\n}\n",
    "lib.rs": "\ufeffpub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\npub fn mul(a: i32, b: i32) -> i32 {\n    // codila: fill\n}",
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_infill_reports_the_files_language_and_keeps_bytes_outside_the_region(tmp_path, tiny, name):
    raw = FILES[name].encode()
    p = _write(tmp_path, name, FILES[name])
    r = runner.invoke(app, ["infill", str(p), "--dlm", str(tiny["dlm"]), "--seed", "0", "--json", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    lang = languages.for_path(name).name
    before = doc["syntax_before"]
    assert before["language"] == lang and before["checked"] and before["valid"], before  # a valid file stays valid
    assert doc["syntax"]["language"] == lang and doc["syntax"]["checked"]
    # the fill replaced the marker line only: every byte before and after it is the file's own
    marker = raw.index(b"// codila: fill")
    head, tail = raw[: raw.rindex(b"\n", 0, marker) + 1], raw[raw.index(b"\n", marker) + 1 :]
    out = doc["text"]
    assert p.read_bytes() == raw  # nothing written without --in-place
    r2 = runner.invoke(app, ["infill", str(p), "--dlm", str(tiny["dlm"]), "--seed", "0", "-q"])
    assert r2.exit_code == 0 and r2.stdout_bytes.startswith(head) and r2.stdout_bytes.endswith(tail)
    assert out.encode("utf-8").startswith(head) and out.encode("utf-8").endswith(tail)  # --json's text: the bytes as written


def test_infill_status_line_names_the_language_and_an_unknown_one_is_not_checked(tmp_path, tiny):
    js = _write(tmp_path, "a.js", FILES["app.js"])
    r = runner.invoke(app, ["infill", str(js), "--dlm", str(tiny["dlm"]), "--seed", "0"])
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("syntax:"))
    assert "(javascript)" in line and "had syntax errors before" not in line
    odd = _write(tmp_path, "notes.xyz", "alpha\n  beta\n  # codila: fill\ngamma\n")
    r = runner.invoke(app, ["infill", str(odd), "--dlm", str(tiny["dlm"]), "--seed", "0"])
    assert r.exit_code == 0
    assert "syntax: not checked" in r.stderr and "does not parse" not in r.stderr
    r = runner.invoke(app, ["infill", str(odd), "--dlm", str(tiny["dlm"]), "--seed", "0", "--strict"])
    assert r.exit_code == 2 and "Error: --strict needs a syntax check" in r.stderr and "Hint: name it with --language" in r.stderr
    import subprocess
    import sys

    for args, env, where in ((["--language", "klingon"], {}, "--language"),
                             ([], {"CODILA_LANGUAGE": "klingon"}, "CODILA_LANGUAGE")):  # issue 60: the variable named
        r = subprocess.run([sys.executable, "-m", "codila_cli", "infill", str(odd), "--dlm", str(tiny["dlm"]), *args],
                           capture_output=True, text=True, env={**os.environ, **env}, check=False)
        assert r.returncode == 2 and f"Error: {where}: unknown language 'klingon'" in r.stderr, r.stderr
        assert f"Hint: {where} takes one of" in r.stderr and "Traceback" not in r.stderr


def test_gen_checks_as_the_named_language(tiny):
    r = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "--seed", "0", "--max-new-tokens", "8", "--json", "-q",
                            "--language", "typescript", "function add(a: number, b: number): number {"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["syntax"]["language"] == "typescript"
    r = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--decoder", "codila",
                            "--ar-syntax-guard", "--language", "go", "func f() {"])
    assert r.exit_code == 2 and "--ar-syntax-guard holds the helper to Python's rules" in r.stderr


def test_models_lists_languages():
    r = runner.invoke(app, ["models", "--languages", "--json"])
    rows = {row["name"]: row for row in json.loads(r.stdout)["languages"]}
    for name in ("python", "javascript", "typescript", "go", "rust", "java", "c", "cpp", "bash"):
        assert name in rows
    assert ".ts" in rows["typescript"]["extensions"] and rows["python"]["checks"].endswith("pyflakes")


def test_infill_from_stdin_guesses_the_language_from_a_shebang_or_a_modeline_and_says_so(tiny):
    """Issue 63: `codila infill -` (how an editor pipes a buffer) reported "not checked" unless --language
    was given. A #! line or an editor modeline names the language now, and the report says it was guessed;
    text with neither (and that Python does not parse) stays "not checked"."""
    def fill(text: str) -> str:
        r = runner.invoke(app, ["infill", "-", "--dlm", str(tiny["dlm"]), "--seed", "0"], input=text)
        assert r.exit_code == 0, r.stderr
        return next(ln for ln in r.stderr.splitlines() if ln.startswith("syntax:"))

    assert "(checked as rust: guessed from a modeline" in fill("fn f() -> i32 {\n    // codila: fill\n}\n// vim: set ft=rust:\n")
    assert "(checked as go: guessed from a modeline" in fill("// -*- mode: go -*-\npackage main\n\n// codila: fill\n")
    assert "(checked as bash: guessed from the #! line" in fill("#!/bin/bash\necho hi\n# codila: fill\n")
    assert fill("fn f() -> i32 {\n    // codila: fill\n}\n").startswith("syntax: not checked")
    assert languages.for_modeline("x\n# vim: ts=4 ft=python\n") is languages.PYTHON
    assert languages.for_modeline("# vim: ts=4\n") is None


def test_a_named_python_is_named_in_the_summary(tiny):
    """Issue 63: `--language python` printed a summary without the language name the others print."""
    named = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "--seed", "0", "--max-new-tokens", "8",
                                "--language", "python", "def f(x):"])
    line = next(ln for ln in named.stderr.splitlines() if ln.startswith("syntax:"))
    assert "(python)" in line
    plain = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "--seed", "0", "--max-new-tokens", "8", "def f(x):"])
    assert "(python)" not in next(ln for ln in plain.stderr.splitlines() if ln.startswith("syntax:"))
