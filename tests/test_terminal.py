"""A real terminal (tmux): the live view shows while decoding, then only the code remains."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")]

def test_live_view_in_tmux_then_code(tiny, slow_codila):
    script = slow_codila
    session = f"codila-test-{int(time.time() * 1000) % 100000}"
    cmd = (f"CODILA_TEST_DELAY=0.15 {sys.executable} {script} gen --dlm {tiny['dlm']} --ar {tiny['ar']} --decoder codila "
           f"--max-new-tokens 48 --no-early-stop --seed 0 'def f(x):'; echo CODILA-EXIT=$?; sleep 30")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", cmd], check=True)
    try:
        seen_view = False
        final = ""
        for _ in range(600):
            time.sleep(0.1)
            pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
            seen_view |= "DLM forwards" in pane and "tokens/forward" in pane
            if "CODILA-EXIT=" in pane:
                final = pane
                break
        assert seen_view, "the live view never appeared"
        assert "CODILA-EXIT=0" in final
        assert "DLM forwards" not in final  # transient: the view is gone, the code and syntax line stay
        assert "def f(x):" in final and "syntax:" in final
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_a_canvas_taller_than_a_60x30_terminal_keeps_its_status_and_legend(tiny, slow_codila):
    """Issue 50: at --max-new-tokens 256 in a 60x30 tmux the status line and legend collapsed to `...`;
    every frame that shows the view now shows the status and the whole legend, within 30 rows."""
    session = f"codila-small-{int(time.time() * 1000) % 100000}"
    cmd = (f"CODILA_TEST_DELAY=0.05 {sys.executable} {slow_codila} gen --dlm {tiny['dlm']} --ar {tiny['ar']} "
           f"--decoder codila --max-new-tokens 256 --no-early-stop --seed 0 'def f(x):'; echo CODILA-EXIT=$?; sleep 30")
    frames = 0
    for pane in _view_frames(session, cmd, 60, 30):
        frames += 1
        flat = pane.replace("\n", " ")
        assert "tokens/forward" in flat and "tok/s" in flat, pane
        assert "masked" in flat and "proposed" in flat and "written" in flat and " end" in flat, pane
    assert frames > 0, "the live view never appeared"


def _view_frames(session: str, cmd: str, width: int, height: int):
    """The panes of a tmux session running ``cmd`` that show the live view, until the command ends."""
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), cmd], check=True)
    try:
        for _ in range(1200):
            time.sleep(0.1)
            pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
            if "CODILA-EXIT=" in pane:
                return
            if "DLM forwards" in pane:
                yield pane
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


@pytest.mark.parametrize("width, height", [(60, 20), (80, 24)])
def test_a_small_terminal_shows_the_prompt_whole_words_and_no_wall_of_line_breaks(slow_codila, width, height):
    """Issue 63 at 60x20 and 80x24, the bundled pair with --decoder dream: the notice is wrapped at spaces (it
    broke mid-word), the prompt shows above the canvas (it never did), the status and legend stay in the
    window, and the far masks are dots, not a wall of ↵."""
    session = f"codila-narrow-{width}-{int(time.time() * 1000) % 100000}"
    cmd = (f"CODILA_TEST_DELAY=0.3 {sys.executable} {slow_codila} gen --decoder dream --max-new-tokens 64 "
           f"--no-early-stop --seed 0 'def parse_line(line):'; echo CODILA-EXIT=$?; sleep 30")
    frames = 0
    for pane in _view_frames(session, cmd, width, height):
        frames += 1
        lines = pane.split("\n")
        assert "def parse_line(line):" in pane, pane  # the prompt
        assert "tokens/forward" in pane and " end" in pane, pane  # status and legend within the window
        assert "↵↵↵" not in pane, pane  # committed line ends show ↵; far masks never a wall of them
        notice = " ".join(ln.strip() for ln in lines if ln.strip() and "Note:" in pane.split("def parse_line")[0])
        assert "dream-coder" in notice and "CODILA_NOTICE=0" in notice, pane  # whole words
    assert frames > 0, "the live view never appeared"
