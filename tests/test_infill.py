"""Infill: region resolution, DreamOn expand/delete bookkeeping, file safety, bad inputs, stdout payload."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.decoding.config import InfillConfig
from codila_cli.decoding.dreamon import decode_dreamon
from codila_cli.errors import UsageError
from codila_cli.infill_files import Region, find_region, fit_indent, patch, read_source, write_in_place
from codila_cli.models.tokens import SpecialTokens

runner = CliRunner()
SP = SpecialTokens(mask=1, eos=0, pad=0, bos=2, end_of_turn=None, expand=3, think_open=None, think_close=None)


@dataclass
class ScriptedInfill:
    """Grows or shrinks the middle towards ``target`` (expand at the last mask while too short, delete
    the last mask while too long), then writes ``target`` token by token."""

    head: int
    tail: int
    target: list[int]
    vocab: int = 20
    delete_first_extra: bool = False  # delete the first slot beyond the target instead of the last mask
    specials: SpecialTokens = SP
    device: torch.device = torch.device("cpu")
    forwards: int = 0
    context_length: int = 2048

    def logits(self, x, *, rows=None):
        self.forwards += 1
        n = x.shape[1]
        middle = x[0, self.head : n - self.tail].tolist()
        out = torch.full((1, n, self.vocab), -5.0)
        masked = [i for i, t in enumerate(middle) if t == SP.mask]
        for i in masked:
            out[0, self.head + i, self.target[i] if i < len(self.target) else SP.eos] = 2.0
        last = masked[-1]
        if len(middle) < len(self.target):
            out[0, self.head + last] = -5.0
            out[0, self.head + last, SP.expand] = 9.0
        elif len(middle) > len(self.target):
            at = len(self.target) if self.delete_first_extra and middle[len(self.target)] == SP.mask else last
            out[0, self.head + at] = -5.0
            out[0, self.head + at, SP.eos] = 9.0
        return out if rows is None else out[:, rows[0] : rows[1]]


@pytest.mark.parametrize("n0,target", [(2, [5, 6, 7, 8, 9, 10]), (6, [5, 6]), (4, [5, 6, 7, 8])])
def test_expand_and_delete_bookkeeping(n0, target):
    prefix, suffix = [10, 11], [12]
    dlm = ScriptedInfill(head=1 + len(prefix), tail=len(suffix) + 1, target=target)
    events = []
    res = decode_dreamon(dlm, prefix_ids=prefix, suffix_ids=suffix, config=InfillConfig(
        initial_masks=n0, max_middle_tokens=16, broadcast_delete=False), on_step=events.append)
    assert res.middle == target
    assert res.expansions == max(0, len(target) - n0) and res.deletions == max(0, n0 - len(target))
    assert res.dlm_forwards == len(events) == len(target) + res.expansions + res.deletions
    assert not res.truncated


def test_expand_is_forbidden_when_the_middle_is_full():
    dlm = ScriptedInfill(head=2, tail=1, target=list(range(5, 15)))
    res = decode_dreamon(dlm, prefix_ids=[10], suffix_ids=[], config=InfillConfig(initial_masks=2, max_middle_tokens=4))
    assert len(res.middle) <= 4


def test_expand_stops_at_the_models_context_as_the_official_2048_cap():
    """DreamOn's generator caps the whole canvas at 2048 tokens (max_tokens) as well as the middle at
    max_gen_len: with the prefix and suffix near the context, the middle grows only to what fits."""
    dlm = ScriptedInfill(head=4, tail=2, target=list(range(5, 15)), context_length=4 + 2 + 6)
    events = []
    res = decode_dreamon(dlm, prefix_ids=[10, 11, 12], suffix_ids=[13],
                         config=InfillConfig(initial_masks=2, max_middle_tokens=16), on_step=events.append)
    assert max(len(e.canvas) for e in events) == 6 and res.expansions == 4  # 4 + 6 + 2 = the 12-token context
    with pytest.raises(ValueError, match="exceed the model's 12-token context"):
        decode_dreamon(dlm, prefix_ids=[10, 11, 12], suffix_ids=[13], config=InfillConfig(initial_masks=7,
                                                                                           max_middle_tokens=16))


def test_an_empty_initial_middle_is_an_empty_fill_and_an_eos_in_the_prefix_is_refused():
    """n0 = 0: the official loop finds no mask and returns an empty middle after no forward (codila
    refused it before session 28). An end-of-text id inside the prefix ids would end the middle for the
    official loop, which then deletes every slot: refused, with the reason."""
    dlm = ScriptedInfill(head=2, tail=1, target=[5, 6])
    res = decode_dreamon(dlm, prefix_ids=[10], suffix_ids=[], config=InfillConfig(initial_masks=0, max_middle_tokens=8))
    assert res.middle == [] and res.dlm_forwards == 0 and not res.truncated
    with pytest.raises(ValueError, match="prefix_ids hold the end-of-text id 0"):
        decode_dreamon(dlm, prefix_ids=[10, SP.eos, 11], suffix_ids=[], config=InfillConfig())
    # an end-of-text in the suffix lies after the middle: the official loop never reads it there either
    res = decode_dreamon(ScriptedInfill(head=2, tail=2, target=[5]), prefix_ids=[10], suffix_ids=[SP.eos],
                         config=InfillConfig(initial_masks=1, max_middle_tokens=4))
    assert res.middle == [5]


def test_broadcast_delete_removes_masks_to_the_right():
    dlm = ScriptedInfill(head=2, tail=1, target=[5], delete_first_extra=True)
    res = decode_dreamon(dlm, prefix_ids=[10], suffix_ids=[], config=InfillConfig(initial_masks=6, max_middle_tokens=8))
    assert res.middle == [5] and res.deletions == 5 and res.dlm_forwards == 2  # one delete removed 5 slots


# --- regions ----------------------------------------------------------------------------------------

def _src(tmp_path, text, name="a.py"):
    p = tmp_path / name
    p.write_bytes(text.encode())
    return read_source(str(p))


def test_line_lines_marker(tmp_path):
    src = _src(tmp_path, "def f(x):\n    y = 1\n    # codila: fill\n    return y\n")
    assert find_region(src, line=None, lines_range=None) == Region(2, 3, "    ", "marker")
    r = find_region(src, line=2, lines_range=None)
    assert (r.start, r.end, r.indent) == (1, 1, "    ")
    assert find_region(src, line=5, lines_range=None).start == 4  # append
    r = find_region(src, line=None, lines_range="2-3")
    assert (r.start, r.end) == (1, 3)


@pytest.mark.parametrize("line,lines,msg", [(0, None, "out of range"), (7, None, "out of range"),
                                             (None, "3-2", "reversed"), (None, "1-9", "out of range"),
                                             (None, "x", "not A-B"), (2, "1-2", "not both")])
def test_bad_regions(tmp_path, line, lines, msg):
    src = _src(tmp_path, "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n")
    with pytest.raises(UsageError, match=msg):
        find_region(src, line=line, lines_range=lines)


def test_no_marker(tmp_path):
    with pytest.raises(UsageError, match="no fill marker"):
        find_region(_src(tmp_path, "a = 1\n"), line=None, lines_range=None)


line_text = st.text(alphabet=st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(line_text, min_size=1, max_size=12), st.data(), st.text(max_size=30), st.booleans())
def test_text_outside_the_region_is_identical(lines, data, middle, crlf):
    nl = "\r\n" if crlf else "\n"
    raw = nl.join(lines) + nl
    src = read_source("-", stdin_bytes=raw.encode())
    n = len(src.lines)
    a = data.draw(st.integers(1, n))
    b = data.draw(st.integers(a, n))
    use_lines = data.draw(st.booleans())
    region = find_region(src, line=None if use_lines else a, lines_range=f"{a}-{b}" if use_lines else None)
    filled = fit_indent(middle, region.indent)
    new = patch(src, region, filled)
    before = "".join(line + "\n" for line in src.lines[: region.start])
    after = "".join(line + "\n" for line in src.lines[region.end :])
    assert new.startswith(before) and new.endswith(after) and new == before + filled + after


def test_fit_indent_follows_a_tab_indented_file():
    """Models write spaces; in a tab-indented file the middle's levels become tabs (mixing them in no
    longer parses), and a stray tab from the model becomes spaces in a space-indented file."""
    from codila_cli.infill_files import uses_tabs

    assert fit_indent("    if x:\n        y = 1\n    w\n", "\t") == "\tif x:\n\t\ty = 1\n\tw\n"
    assert fit_indent("if x:\n  y = 1\n", "\t") == "\tif x:\n\t\ty = 1\n"  # a 2-space level is one tab
    assert fit_indent("if x:\n\ty = 1\n", "    ") == "    if x:\n        y = 1\n"
    assert fit_indent("if x:\n    y = 1\n", "", tabs=True) == "if x:\n\ty = 1\n"  # top level of a tab file
    assert uses_tabs("def f():\n\treturn 1\n") and not uses_tabs("def f():\n    return 1\n")
    assert not uses_tabs("x = 1\n")
    src = "class A:\n\tdef f(self):\n\t\t# codila: fill\n\t\treturn 1\n"
    middle = fit_indent("if self.x:\n    self.y = 2\n", "\t\t")
    compile(src.replace("\t\t# codila: fill\n", middle), "<t>", "exec")  # parses (spaces would not)


def test_infill_writes_tabs_into_a_tab_indented_file(tmp_path, tiny, monkeypatch):
    from codila_cli.decoding import dreamon
    from codila_cli.decoding.dreamon import InfillResult
    from codila_cli.engine.models import load_models

    tok = load_models(dlm=str(tiny["dlm"]), ar=None, device="cpu", dtype="float32").dlm.tokenizer
    ids = tok.encode("for k in ks:\n    total += k\n", add_special_tokens=False)
    monkeypatch.setattr(dreamon, "decode_dreamon", lambda *a, **k: InfillResult(ids, 1, 0, 1, 0.0, 0, 0, False))
    p = tmp_path / "t.py"
    p.write_text("def f(ks):\n\ttotal = 0\n\t# codila: fill\n\treturn total\n")
    r = runner.invoke(app, ["infill", str(p), "--dlm", str(tiny["dlm"]), "--seed", "0"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "def f(ks):\n\ttotal = 0\n\tfor k in ks:\n\t\ttotal += k\n\treturn total\n"
    assert "syntax: parses" in r.stderr


def test_fit_indent_keeps_relative_indentation():
    assert fit_indent("if x:\n    y = 1\n", "        ") == "        if x:\n            y = 1\n"
    assert fit_indent("\n\n", "    ") == ""


# --- file safety ---------------------------------------------------------------------------------------

def test_in_place_keeps_mode_and_crlf(tmp_path):
    p = tmp_path / "a.py"
    p.write_bytes(b"a = 1\r\n# codila: fill\r\nb = 2\r\n")
    os.chmod(p, 0o640)
    src = read_source(str(p))
    write_in_place(src, patch(src, find_region(src, line=None, lines_range=None), "x = 3\n"))
    assert p.read_bytes() == b"a = 1\r\nx = 3\r\nb = 2\r\n"
    assert stat.S_IMODE(p.stat().st_mode) == 0o640
    assert [f.name for f in tmp_path.iterdir()] == ["a.py"]  # no temp file left


def test_in_place_refuses_when_file_changed(tmp_path):
    p = tmp_path / "a.py"
    p.write_text("a = 1\n")
    src = read_source(str(p))
    p.write_text("a = 2\n")  # someone edited it meanwhile
    from codila_cli.infill_files import FileChangedError

    with pytest.raises(FileChangedError):
        write_in_place(src, "x = 1\n")
    assert p.read_text() == "a = 2\n"


def test_failure_mid_write_leaves_the_original(tmp_path, monkeypatch):
    p = tmp_path / "a.py"
    p.write_text("a = 1\n")
    src = read_source(str(p))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_in_place(src, "x = 1\n")
    assert p.read_text() == "a = 1\n" and [f.name for f in tmp_path.iterdir()] == ["a.py"]


def test_symlink_target_is_edited_and_link_kept(tmp_path, tiny):
    target = tmp_path / "real.py"
    target.write_text("a = 1\n# codila: fill\n")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    r = runner.invoke(app, ["infill", str(link), "--dlm", str(tiny["dlm"]), "--in-place", "--seed", "0"])
    assert r.exit_code == 0, r.stderr
    assert link.is_symlink() and "# codila: fill" not in target.read_text()


# --- the command ---------------------------------------------------------------------------------------

@pytest.fixture
def pyfile(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f(x):\n    y = x + 1\n    # codila: fill\n    return y\n")
    return p


def test_stdout_is_the_patched_file(pyfile, tiny):
    r = runner.invoke(app, ["infill", str(pyfile), "--dlm", str(tiny["dlm"]), "--seed", "0"])
    assert r.exit_code == 0
    assert r.stdout.startswith("def f(x):\n    y = x + 1\n") and r.stdout.endswith("    return y\n")
    assert "\x1b[" not in r.stdout and "syntax" in r.stderr
    assert pyfile.read_text().count("codila: fill") == 1  # not modified without --in-place


def test_diff_and_json(pyfile, tiny):
    r = runner.invoke(app, ["infill", str(pyfile), "--dlm", str(tiny["dlm"]), "--diff", "--seed", "0"])
    assert r.exit_code == 0 and r.stdout.startswith("---")
    r = runner.invoke(app, ["infill", str(pyfile), "--dlm", str(tiny["dlm"]), "--json", "--seed", "0", "--line", "2"])
    doc = json.loads(r.stdout)
    assert doc["command"] == "infill" and doc["region"]["how"] == "line" and "introduced_errors" in doc


def test_codila_infill_runs(pyfile, tiny):
    r = runner.invoke(app, ["infill", str(pyfile), "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]),
                            "--decoder", "codila", "--tau", "50", "--json", "--seed", "0"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["ar_forwards"] > 0


@pytest.mark.parametrize("flag", [["--tau", "0.3"], ["-B", "8"], ["--block-size", "8"]])
def test_a_codila_flag_without_the_codila_decoder_is_refused(pyfile, tiny, flag):
    """--tau and -B mean nothing to DreamOn alone: refused (exit 2) with the flag named, nothing decoded."""
    r = runner.invoke(app, ["infill", str(pyfile), "--dlm", str(tiny["dlm"]), *flag, "--seed", "0"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"Error: {'--block-size' if flag[0] == '-B' else flag[0]} is a setting of --decoder codila")
    assert "Hint: add --decoder codila" in r.stderr


def test_codila_infill_defaults_tau_and_takes_the_flags(pyfile, tiny):
    """--decoder codila without --tau runs τ = CODILA_INFILL_TAU; -B and --tau reach the config (--json)."""
    from codila_cli.decoding.config import CODILA_INFILL_TAU

    base = ["infill", str(pyfile), "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--decoder", "codila",
            "--json", "--seed", "0"]
    plain = json.loads(runner.invoke(app, base).stdout)["settings"]
    given = json.loads(runner.invoke(app, [*base, "-B", "2", "--tau", "7"]).stdout)["settings"]
    assert (plain["tau"], plain["block_size"]) == (CODILA_INFILL_TAU, 4) and (given["tau"], given["block_size"]) == (7.0, 2)


def test_codila_infill_helper_samples_at_the_temperature(pyfile, tiny):
    """With τ this large the helper writes the spans; at --temperature > 0 it samples (it stayed greedy,
    so every seed gave the same middle), at 0 it is greedy."""
    def middles(temperature: str) -> set[str]:
        out = set()
        for seed in range(4):
            r = runner.invoke(app, ["infill", str(pyfile), "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]),
                                    "--decoder", "codila", "--tau", "50", "--json", "--seed", str(seed),
                                    "--temperature", temperature])
            assert r.exit_code == 0, r.stderr
            doc = json.loads(r.stdout)
            assert doc["metrics"]["ar_forwards"] > 0
            out.add(doc["middle"])
        return out

    assert len(middles("0")) == 1
    assert len(middles("2")) > 1


@pytest.mark.parametrize("case", ["missing", "directory", "binary", "latin1", "nomarker", "range", "reversed",
                                  "conflict", "inplace-stdin"])
def test_bad_inputs_exit_2_and_leave_file(tmp_path, tiny, case):
    p = tmp_path / "f.py"
    p.write_text("a = 1\nb = 2\n")
    args = ["infill", str(p), "--dlm", str(tiny["dlm"])]
    if case == "missing":
        args[1] = str(tmp_path / "nope.py")
    elif case == "directory":
        args[1] = str(tmp_path)
    elif case == "binary":
        p.write_bytes(b"\x00\x01\x02abc")
    elif case == "latin1":
        p.write_bytes("a = 'é'\n".encode("latin-1"))
    elif case == "range":
        args += ["--line", "9"]
    elif case == "reversed":
        args += ["--lines", "2-1"]
    elif case == "conflict":
        args += ["--line", "1", "--lines", "1-2"]
    elif case == "inplace-stdin":
        args = ["infill", "-", "--in-place", "--line", "1"]
    before = p.read_bytes()
    r = runner.invoke(app, [*args, "--in-place"] if case not in ("inplace-stdin",) else args, input="a = 1\n")
    assert r.exit_code == 2, (case, r.stderr)
    assert r.stderr.startswith("Error: ") and r.stdout == ""
    assert p.read_bytes() == before


@pytest.mark.parametrize("name, data", [
    ("crlf.py", b"def f(x):\r\n    y = 1\r\n    return y\r\n"),
    ("feed.py", b"import os\n\x0c\ndef g():\n    pass\n"),
    ("no_final_newline.py", b"def h():\n    a = 1\n    return a"),
])
def test_diff_output_applies_with_git(tmp_path, name, data):
    """`--diff` is a patch git accepts: CRLF lines as on disk, a form feed inside a line, and a last line
    without a newline marked as git marks it."""
    import subprocess

    from codila_cli.infill_files import unified_diff

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    target = tmp_path / name
    target.write_bytes(data)
    src = read_source(str(target))
    region = find_region(src, line=3, lines_range=None)
    new = patch(src, region, fit_indent("z = 2\n", region.indent))
    (tmp_path / "p.diff").write_text(unified_diff(src, new, name), newline="")
    r = subprocess.run(["git", "apply", "--check", "p.diff"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    assert target.read_bytes() == new.replace("\n", src.newline).encode()


def test_a_model_written_return_stays_inside_the_function(tmp_path):
    """Filling before a top-level line: the region's indentation is column 0, but the model wrote
    `    return x` for the function it is in; the model's own (legal) indentation wins when only it parses."""
    from codila_cli.infill_files import place_middle

    f = tmp_path / "a.py"
    f.write_text("def f(x):\n    if x:\n        x += 1\n\ndef g():\n    pass\n")
    src = read_source(str(f))
    region = find_region(src, line=4, lines_range=None)
    assert region.indent == "" and place_middle(src, region, "    return x\n") == "    return x\n"
    assert place_middle(src, region, "x = 1\n") == "x = 1\n"  # a top-level statement stays where it was put
    inside = find_region(src, line=3, lines_range=None)
    assert place_middle(src, inside, "y = 2\n") == "        y = 2\n"  # the usual case: the context's indent


@pytest.mark.parametrize("engine", ["transformers", "native"])
def test_special_token_strings_in_a_file_are_text(tiny, monkeypatch, engine):
    """A file (or prompt) that contains `<|endoftext|>` is encoded as those characters, not as the token
    (both tokenizer kinds: transformers', and the native engine's tokenizers-only stand-in)."""
    from codila_cli.engine.models import load_models
    from codila_cli.models.tokens import encode_text

    monkeypatch.setenv("CODILA_ENGINE", engine)
    for engine_dir in (tiny["dlm"],):
        models = load_models(dlm=str(engine_dir), ar=None, device="cpu", dtype="float32")
        tok, eos = models.dlm.tokenizer, models.dlm.specials.eos
        assert eos in tok.encode("x = '<|endoftext|>'", add_special_tokens=False)  # what the tokenizer does by itself
        ids = encode_text(tok, "x = '<|endoftext|>'")
        assert eos not in ids and tok.decode(ids) == "x = '<|endoftext|>'"


def test_the_expand_budget_is_dreamons_and_can_be_set(tmp_path, tiny):
    assert InfillConfig().budget == 64 and InfillConfig(max_middle_tokens=16).budget == 16  # = max_gen_len
    assert InfillConfig(max_middle_tokens=16, expand_budget=3).budget == 3
    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    # codila: fill\n    return x\n")
    r = CliRunner().invoke(app, ["infill", str(src), "--dlm", str(tiny["dlm"]), "--seed", "0", "--json",
                                 "--expand-budget", "0", "--max-middle-tokens", "16"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["settings"]["expand_budget"] == 0 and doc["metrics"]["expansions"] == 0


def _fill(tiny, *args: str):
    return CliRunner().invoke(app, ["infill", *args, "--dlm", str(tiny["dlm"]), "--seed", "0",
                                    "--max-middle-tokens", "8"])


def test_in_place_keeps_owner_group_mode_bom_and_every_line_ending(tmp_path, tiny):
    f = tmp_path / "a.py"
    raw = "\ufeffdef f(x):\r\n    y = x\n    # codila: fill\r\n    return y\n".encode()
    f.write_bytes(raw)
    os.chmod(f, 0o640)
    if os.geteuid() == 0:
        os.chown(f, 1234, 2345)
    r = _fill(tiny, str(f), "--in-place")
    assert r.exit_code == 0, r.stderr
    st = os.stat(f)
    assert stat.S_IMODE(st.st_mode) == 0o640
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1234, 2345)  # the user keeps their file
    out = f.read_bytes()
    assert out.startswith("\ufeffdef f(x):\r\n    y = x\n".encode()) and out.endswith(b"    return y\n")


def test_json_text_is_the_file_as_it_would_be_written_bom_and_line_endings_kept(tmp_path, tiny):
    """Issue 60: --json's text dropped the BOM and turned CRLF into LF, so an editor writing it back
    rewrote every line ending. It is now exactly what stdout gets (and --in-place writes)."""
    import json

    f = tmp_path / "a.py"
    f.write_bytes("\ufeffdef f(x):\r\n    y = x\r\n    # codila: fill\r\n    return y\r\n".encode())
    plain = _fill(tiny, str(f), "--seed", "3")
    doc = json.loads(_fill(tiny, str(f), "--seed", "3", "--json").stdout)
    assert doc["text"].encode("utf-8") == plain.stdout_bytes and doc["text"].startswith("\ufeffdef f(x):\r\n")
    assert doc["newline"] == "\r\n" and "\r" not in doc["middle"]


def test_in_place_keeps_extended_attributes(tmp_path, tiny):
    """Issue 40: --in-place dropped extended attributes (tags, labels) with the old inode."""
    f = tmp_path / "a.py"
    f.write_text("def f(x):\n    # codila: fill\n    return x\n")
    try:
        os.setxattr(f, "user.codila-test", b"kept")
    except OSError:
        pytest.skip("this file system has no user extended attributes")
    r = _fill(tiny, str(f), "--in-place")
    assert r.exit_code == 0, r.stderr
    assert "codila: fill" not in f.read_text() and os.getxattr(f, "user.codila-test") == b"kept"


def test_stdout_keeps_the_bytes_outside_the_region_too(tmp_path, tiny):
    f = tmp_path / "a.py"
    f.write_bytes(b"a = 1\r\nb = 2\n# codila: fill\nc = 3")
    r = _fill(tiny, str(f))
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes.startswith(b"a = 1\r\nb = 2\n") and r.stdout_bytes.endswith(b"c = 3")


def test_in_place_refuses_read_only_and_hard_linked_files(tmp_path, tiny):
    ro = tmp_path / "ro.py"
    ro.write_text("x = 1\n# codila: fill\n")
    os.chmod(ro, 0o444)
    r = _fill(tiny, str(ro), "--in-place")
    assert r.exit_code == 1 and "read-only" in r.stderr and ro.read_text() == "x = 1\n# codila: fill\n"
    linked = tmp_path / "l.py"
    linked.write_text("x = 1\n# codila: fill\n")
    os.link(linked, tmp_path / "other.py")
    r = _fill(tiny, str(linked), "--in-place")
    assert r.exit_code == 1 and "hard links" in r.stderr
    assert os.stat(linked).st_ino == os.stat(tmp_path / "other.py").st_ino  # the link is whole


def test_only_regular_files_of_a_sane_size_are_read(tmp_path, tiny, monkeypatch):
    import codila_cli.infill_files as files

    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    for target in (str(fifo), "/dev/zero", str(tmp_path)):
        r = _fill(tiny, target, "--line", "1")
        assert r.exit_code == 2, (target, r.stderr)
    monkeypatch.setattr(files, "MAX_BYTES", 16)
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 10)
    r = _fill(tiny, str(big), "--line", "1")
    assert r.exit_code == 2 and "limit" in r.stderr


def test_a_middle_that_leaves_no_room_for_context_is_refused_in_the_same_words_everywhere():
    from codila_cli.decoding.config import InfillConfig

    assert InfillConfig(max_middle_tokens=82).room_problem(100) is None  # 16 left: enough
    assert InfillConfig(max_middle_tokens=83).room_problem(100) == (
        "a middle of up to 83 tokens leaves no room for context (the model's context is 100 tokens)")


def test_the_cli_refuses_a_middle_the_context_cannot_hold_before_decoding(tiny, tmp_path):
    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    # codila: fill\n    return x\n")
    r = CliRunner().invoke(app, ["infill", str(src), "--dlm", str(tiny["dlm"]), "--max-middle-tokens", "4096"])
    assert r.exit_code == 2 and r.stdout == "" and src.read_text().count("codila: fill") == 1
    assert "leaves no room for context" in r.stderr and "Hint: lower --max-middle-tokens" in r.stderr
