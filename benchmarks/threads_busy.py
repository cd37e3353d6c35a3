"""Idle vs beside a busy core (issue 50): one `codila gen` timed with the machine idle and with one
`yes > /dev/null` running, for the default thread count (engine/threads.py) and for torch's own default
(one thread per core, what codila ran before), in one run, interleaved.

    python benchmarks/threads_busy.py --repeats 5 --out docs/results/threads-busy-s27

Reports the median wall time of each cell and the busy/idle ratio per thread setting (issue 50's target:
the default's ratio at most 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMAND = ["gen", "-q", "--seed", "3", "--max-new-tokens", "256", "class Stack:"]


def _time(threads: int | None) -> float:
    args = [sys.executable, "-m", "codila_cli", *COMMAND] + ([] if threads is None else ["--threads", str(threads)])
    env = {**os.environ, "CODILA_NOTICE": "0"}
    env.pop("CODILA_THREADS", None)
    t0 = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    a = ap.parse_args()
    import torch

    from codila_cli.engine.threads import choose_threads, usable_cores

    cores = usable_cores()
    settings = {"default (auto)": None, f"torch's default ({torch.get_num_threads()} threads)": torch.get_num_threads()}
    times: dict[tuple[str, str], list[float]] = {}
    _time(None)  # warm the file cache
    for _ in range(a.repeats):
        for load in ("idle", "busy"):
            hog = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) if load == "busy" else None
            try:
                if hog:
                    time.sleep(0.5)
                for name, n in settings.items():
                    times.setdefault((name, load), []).append(_time(n))
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
    rows = []
    for name in settings:
        idle, busy = statistics.median(times[(name, "idle")]), statistics.median(times[(name, "busy")])
        rows.append({"threads": name, "idle_s": round(idle, 2), "busy_s": round(busy, 2), "ratio": round(busy / idle, 2),
                     "idle_all": [round(x, 2) for x in times[(name, "idle")]],
                     "busy_all": [round(x, 2) for x in times[(name, "busy")]]})
    meta = {"command": "codila " + " ".join(COMMAND), "usable_cores": cores, "default_threads_idle": choose_threads(None).count,
            "cpu": _cpu(), "torch": torch.__version__, "repeats": a.repeats, "busy": "one `yes > /dev/null`"}
    lines = [f"# Idle vs one busy core: `{meta['command']}`", "",
             f"{cores} usable cores, {meta['cpu']}, torch {meta['torch']}, median of {a.repeats}, interleaved.", "",
             "| threads | idle (s) | beside one busy core (s) | busy / idle |", "|---|---|---|---|"]
    lines += [f"| {r['threads']} | {r['idle_s']} | {r['busy_s']} | {r['ratio']} |" for r in rows]
    print("\n".join(lines))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


if __name__ == "__main__":
    main()
