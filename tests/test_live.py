"""The live view: only on a terminal, driven by events, never touching stdout."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.decoding.events import StepEvent
from codila_cli.ui.live import LiveView


class FakeTok:
    def decode(self, ids, skip_special_tokens=False):
        return {5: "def", 6: " f", 7: "(\n"}.get(ids[0], "?")


def test_live_view_renders_masks_dlm_and_ar_tokens(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system="standard", width=80)
    view = LiveView(tokenizer=FakeTok(), mask_id=1, console=console, block_width=2, min_interval=0.0)
    with view:
        view(StepEvent(0, (0,), (5,), "dlm", None, 1, 0, 0.1, (5, 1, 1, 1)))
        view(StepEvent(1, (2, 3), (6, 7), "ar", (2, 4), 2, 2, 0.2, (5, 1, 6, 7)))
    plain = view.render()
    out = buf.getvalue()
    assert view.redraws == 2
    assert "\x1b[36mdef" in out  # DLM token in cyan
    assert "32m" in out and " f" in out  # AR tokens in green
    assert "·" in out and "▏" in out  # masked slot, block boundary
    assert "DLM forwards 2" in out and "tokens/forward 1.50" in out
    assert plain is not None


def test_live_view_is_off_when_stderr_is_not_a_terminal(tiny):
    r = CliRunner().invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--max-new-tokens", "8",
                                 "--seed", "0", "--color", "always", "def f("])
    assert r.exit_code == 0
    assert "DLM forwards" not in r.stderr and "\x1b[?25l" not in r.stderr
    assert "\x1b[" not in r.stdout


def test_streamed_output_equals_buffered_output(tiny):
    args = ["gen", "--dlm", str(tiny["dlm"]), "-K", "2", "--max-new-tokens", "24", "--seed", "5", "def f(x):\n    "]
    streamed = CliRunner().invoke(app, args)
    buffered = CliRunner().invoke(app, [*args, "--no-stream"])
    assert streamed.exit_code == buffered.exit_code == 0
    assert streamed.stdout == buffered.stdout


def test_streamer_writes_whole_lines_before_the_end():
    from codila_cli.models.tokens import SpecialTokens
    from codila_cli.ui.stream import StdoutStreamer

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join({5: "a", 6: "\n", 7: "b"}[i] for i in ids)

    out = io.StringIO()
    sp = SpecialTokens(mask=1, eos=0, pad=0, bos=2, end_of_turn=None, expand=None, think_open=None, think_close=None)
    s = StdoutStreamer(tokenizer=Tok(), specials=sp, prompt="x\n", out=out)
    s(StepEvent(0, (0,), (5,), "dlm", None, 1, 0, 0.1, (5, 1, 1)))
    assert out.getvalue() == "x\n"  # "a" is not a whole line yet
    s(StepEvent(1, (1,), (6,), "dlm", None, 2, 0, 0.2, (5, 6, 1)))
    assert out.getvalue() == "x\na\n"
    s(StepEvent(2, (2,), (0,), "dlm", None, 3, 0, 0.3, (5, 6, 0)))
    s.finish("x\na\n")
    assert out.getvalue() == "x\na\n"


def _console(buf):
    return Console(file=buf, force_terminal=True, color_system="standard", width=100)


def test_infill_view_shows_context_and_keeps_owners_across_expansions(monkeypatch):
    from codila_cli.ui.live import InfillView

    monkeypatch.delenv("NO_COLOR", raising=False)
    buf = io.StringIO()
    view = InfillView(prefix="import os\ndef g():\n", suffix="    return x\n", tokenizer=FakeTok(), mask_id=1,
                      console=_console(buf), min_interval=0.0)
    with view:
        view(StepEvent(0, (0,), (5,), "dlm", None, 1, 0, 0.1, (5, 1, 1)))
        # slot 1 expanded into two masks: the middle grows, token 5 keeps its DLM owner at slot 0
        view(StepEvent(1, (3,), (6,), "ar", (3, 4), 2, 1, 0.2, (5, 1, 1, 6)))
    assert view._owner == {0: "dlm", 3: "ar"}
    out = buf.getvalue()
    assert "def g():" in out and "return x" in out  # the file around the fill, dim
    assert "middle 4 slots" in out and "\x1b[36mdef" in out


def test_plan_view_has_a_row_for_the_contract_and_each_unit(monkeypatch):
    from codila_cli.ui.live import PlanView

    monkeypatch.delenv("NO_COLOR", raising=False)
    buf = io.StringIO()
    view = PlanView(tokenizer=FakeTok(), mask_id=1, console=_console(buf), min_interval=0.0)
    with view:
        view(StepEvent(0, (0,), (5,), "dlm", None, 1, 0, 0.1, (5, 1), row=0))
        view(StepEvent(1, (0,), (6,), "dlm", (10, 13), 2, 0, 0.2, (6, 1, 1), row=1))
        view(StepEvent(1, (1,), (7,), "dlm", (13, 15), 2, 0, 0.2, (1, 7), row=2))
    out = buf.getvalue()
    assert "contract (1 masked)" in out and "unit 1 (2 masked)" in out and "unit 2 (1 masked)" in out
    assert "tokens/forward 1.50" in out


def test_infill_and_plan_show_the_live_view_on_a_terminal_only(tiny, tmp_path, monkeypatch):
    from codila_cli.ui import live, terminal

    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    # codila: fill\n    return x\n")
    runs = {"InfillView": ["infill", str(src), "--dlm", str(tiny["dlm"]), "--seed", "0", "--max-middle-tokens", "8"],
            "PlanView": ["plan", "--dlm", str(tiny["dlm"]), "--seed", "0", "--max-units", "2", "a tool"]}
    for view_name, args in runs.items():
        off = CliRunner().invoke(app, args)
        assert off.exit_code == 0, off.stderr
        seen: list[str] = []
        with monkeypatch.context() as m:
            m.setattr(terminal, "stderr_is_tty", lambda: True)
            cls = getattr(live, view_name)
            real = cls.__call__
            m.setattr(cls, "__call__", lambda self, e, real=real, seen=seen: (seen.append(type(self).__name__), real(self, e)))
            on = CliRunner().invoke(app, args)
        assert on.exit_code == 0, on.stderr
        assert seen and set(seen) == {view_name}
        assert on.stdout == off.stdout  # the view never touches stdout


def test_control_tokens_render_as_one_dim_glyph():
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return {0: "<|endoftext|>", 3: "<|expand|>", 4: "<think>", 5: "def"}[ids[0]]

    view = LiveView(tokenizer=Tok(), mask_id=1, console=Console(file=io.StringIO()))
    assert [view.piece(t) for t in (0, 3, 4, 5)] == ["∅", "⊕", "◆", "def"]
    text = view.tokens_text((5, 0, 0), {0: "dlm", 1: "dlm", 2: "dlm"}, None)
    assert text.plain == "def∅∅"
    assert all(span.style == "bright_black" for span in text.spans if text.plain[span.start:span.end] == "∅")


@pytest.mark.parametrize("gpu", [False, True])
def test_num_samples_view_follows_each_sample_in_turn_on_a_cpu(tiny, monkeypatch, gpu):
    import codila_cli.engine.generate as rt
    """gen -n 3 on a terminal: one after another (a CPU), each sample gets a view of its own, titled
    with its number; batched (a GPU), one view follows sample 1. stdout is the same either way."""
    from codila_cli.ui import live, terminal

    args = ["gen", "--dlm", str(tiny["dlm"]), "-n", "3", "--temperature", "1", "--max-new-tokens", "8", "--seed", "3",
            "-K", "2", "def f("]
    off = CliRunner().invoke(app, args)
    titles: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(terminal, "stderr_is_tty", lambda: True)
        m.setattr(rt, "batching_pays", lambda models, config=None: gpu)
        real = live.LiveView.__enter__
        m.setattr(live.LiveView, "__enter__", lambda self: (titles.append(self.title), real(self))[1])
        on = CliRunner().invoke(app, args)
    assert off.exit_code == on.exit_code == 0, on.stderr
    want = ["sample 1 of 3"] if gpu else ["sample 1 of 3", "sample 2 of 3", "sample 3 of 3"]
    assert [t.rsplit(" · ", 1)[-1] for t in titles] == want
    assert on.stdout == off.stdout


def test_proposed_line_breaks_show_as_masked_dots_not_a_wall_of_arrows():
    """Issue 63: with --decoder dream the canvas was a wall of ↵ (the DLM proposes a line break for most far
    masks), which looked like a rendering bug. A blank proposal is drawn as a masked slot."""
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return {5: "def", 6: "\n", 7: "  ", 8: "x"}[ids[0]]

    view = LiveView(tokenizer=Tok(), mask_id=1, console=Console(file=io.StringIO()))
    text = view.tokens_text((5, 1, 1, 1, 1), {0: "dlm"}, None, proposed={1: 6, 2: 6, 3: 7, 4: 8})
    assert text.plain == "def···x"


@pytest.mark.parametrize("height, shown", [(40, ["import os", "", "def f(x):"]), (10, ["def f(x):"]), (8, [])])
def test_the_prompts_last_lines_show_above_the_canvas_as_room_allows(height, shown):
    """Issue 63: the prompt was never shown. Its last lines are, dim, above the canvas; a small terminal
    keeps only the last one, and a tiny one none (the canvas keeps at least three rows)."""
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=60, height=height, color_system=None)
    view = LiveView(tokenizer=FakeTok(), mask_id=1, console=console, min_interval=0.0,
                    prompt="x = 1\nimport os\n\ndef f(x):\n")
    view(StepEvent(0, (0,), (5,), "dlm", None, 1, 0, 0.1, (5, 1, 1, 1)))
    with console.capture() as cap:
        console.print(view.render())
    lines = cap.get().split("\n")
    assert lines[: len(shown)] == shown and ("x = 1" not in lines)
    assert any(line.startswith("def") or "·" in line for line in lines[len(shown):])
