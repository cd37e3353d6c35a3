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
