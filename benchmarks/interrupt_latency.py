"""Seconds from Ctrl-C (SIGINT) to exit for `codila infill` mid-decode, on an idle and on a loaded
machine (issue 40: about a second under load, in the interpreter's teardown of torch).

    python benchmarks/interrupt_latency.py [--runs 3] [--load 3]

A timing, so a benchmark and not a test (tests/test_signals.py checks what an interrupt leaves)."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(path: Path, delay: float) -> tuple[int, float]:
    p = subprocess.Popen([sys.executable, "-m", "codila_cli", "infill", str(path)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env={**os.environ, "CODILA_NOTICE": "0"})
    time.sleep(delay)
    t = time.perf_counter()
    p.send_signal(signal.SIGINT)
    p.wait()
    return p.returncode, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load", type=int, default=3, help="busy processes beside it in the loaded case")
    args = ap.parse_args()
    src = "\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(300)) + "\ndef g(x):\n    # codila: fill\n    return x\n"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.py"
        path.write_text(src)
        for label, n in (("idle", 0), (f"{args.load} busy processes", args.load)):
            load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
            try:
                t = time.perf_counter()  # one whole run, then interrupts at 60 % of its length: mid-decode
                subprocess.run([sys.executable, "-m", "codila_cli", "infill", str(path)], capture_output=True,
                               env={**os.environ, "CODILA_NOTICE": "0"}, check=False)
                whole = time.perf_counter() - t
                runs = [one(path, 0.6 * whole) for _ in range(args.runs)]
            finally:
                for p in load:
                    p.kill()
            codes = sorted({c for c, _ in runs})
            print(f"{label}: a whole run {whole:.2f} s; exit codes {codes}, seconds to exit median {statistics.median(s for _, s in runs):.3f} "
                  f"(max {max(s for _, s in runs):.3f})")


if __name__ == "__main__":
    main()
