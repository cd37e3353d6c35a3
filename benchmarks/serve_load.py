"""Load on `codila serve` (bundled pair, this machine): aggregate tokens/s and p50/p95 latency at 1, 2,
4, 8 and 16 concurrent clients, side by side in one run with the same requests sent one after another;
then a short request sent while 7 long ones run (does it finish first?).

    python benchmarks/serve_load.py [--requests 16] [--max-tokens 128] [--rounds 3] [--out FILE.json]
        [--serve-args "--dlm DIR --ar DIR --device cuda --dtype bfloat16"]   # scripts/gpu_serve.sh

The requests are the first N prompts of the dev-ext set (greedy, seed 0, codila's default setting);
every concurrency level sends the same N requests, so the tokens are the same and only the time moves.
Each of ``--rounds`` passes runs the one-after-another baseline and every level in turn; a level's
ratio is the median over rounds of its tokens/s against the same round's baseline (a 16-request level
lasts 2–4 s, and one pass of the 8-client level moved by up to ±0.3 between rounds in session 30), and the JSON keeps every round's ratio.
The server runs in its own process, started and stopped here; the first request of each level is not
special-cased (the server is warmed by a full one-after-another pass before anything is timed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int, max_batch: int, extra: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "codila_cli", "serve", "--port", str(port), "-q",
                             "--max-batch", str(max_batch), "--max-queue", "64", *extra], stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 900  # a 7B pair loads in minutes
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


def prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "src/codila_cli/data/dev_ext_prompts.jsonl").open(encoding="utf-8")]
    return [r["prompt"] for r in rows[:n]]


def ask(url: str, body: dict) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    doc = r.json()
    return time.perf_counter() - t0, doc["usage"]["completion_tokens"], doc["choices"][0]["text"]


def level(url: str, bodies: list[dict], clients: int) -> dict:
    t0 = time.perf_counter()
    if clients == 0:  # one after another
        out = [ask(url, b) for b in bodies]
    else:
        with ThreadPoolExecutor(clients) as pool:
            out = list(pool.map(lambda b: ask(url, b), bodies))
    wall = time.perf_counter() - t0
    lat = sorted(o[0] for o in out)
    tokens = sum(o[1] for o in out)
    return {"clients": clients or "one after another", "wall_s": round(wall, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 2), "p50_s": round(statistics.median(lat), 3),
            "p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3), "texts": [o[2] for o in out]}


def short_behind_long(url: str, prompt: str) -> dict:
    long = {"prompt": prompt, "max_tokens": 256, "temperature": 0, "seed": 0, "codila": {"early_stop": False}}
    short = {"prompt": "def add(a, b):", "max_tokens": 16, "temperature": 0, "seed": 0}
    with ThreadPoolExecutor(8) as pool:
        t0 = time.perf_counter()
        longs = [pool.submit(ask, url, long) for _ in range(7)]
        time.sleep(0.5)  # the long ones are decoding
        s = pool.submit(ask, url, short)
        short_done = s.result()[0] + 0.5
        long_done = [f.result()[0] for f in longs]
    return {"short_finished_s": round(short_done, 3), "first_long_finished_s": round(min(long_done), 3),
            "short_first": short_done < min(long_done), "wall_s": round(time.perf_counter() - t0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3, help="passes over every level, interleaved; medians reported")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--serve-args", default="", help='more `codila serve` flags, e.g. "--dlm DIR --ar DIR --device cuda"')
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    levels = [int(x) for x in args.levels.split(",")]
    import shlex

    proc = start(port, max_batch=max(levels), extra=shlex.split(args.serve_args))
    health = httpx.get(url + "/health", timeout=10).json()
    try:
        bodies = [{"prompt": p, "max_tokens": args.max_tokens, "temperature": 0, "seed": 0}
                  for p in prompts(args.requests)]
        level(url, bodies, 0)  # warm-up pass, not reported
        runs = []  # per round: one-after-another, then each level (a round's ratios use its own baseline)
        for _ in range(args.rounds):
            runs.append([level(url, bodies, 0)] + [level(url, bodies, c) for c in levels])
        same = all(r["texts"] == runs[0][0]["texts"] for run in runs for r in run)
        rows = []
        for i, first in enumerate(runs[0]):
            each = [run[i] for run in runs]
            ratios = [r["tokens_per_s"] / run[0]["tokens_per_s"] for r, run in zip(each, runs)]
            rows.append({"clients": first["clients"], "tokens": first["tokens"],
                         "wall_s": round(statistics.median(r["wall_s"] for r in each), 3),
                         "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in each), 2),
                         "p50_s": round(statistics.median(r["p50_s"] for r in each), 3),
                         "p95_s": round(statistics.median(r["p95_s"] for r in each), 3),
                         "ratio": round(statistics.median(ratios), 2),
                         "ratio_each_round": [round(x, 2) for x in ratios]})
        short = short_behind_long(url, bodies[0]["prompt"])
    finally:
        proc.terminate()
        proc.wait(30)
    import torch

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=ROOT, check=False).stdout.strip()

    report = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "torch": torch.__version__, "threads": torch.get_num_threads()},
              "commit": git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "-uno") else ""),
              "device": health["device"], "dtype": health["dtype"], "serve_args": args.serve_args,
              "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
              "requests": args.requests, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "same_texts_at_every_level": same, "health": health, "levels": rows, "short_behind_7_long": short}
    print("| clients | tokens/s | × one after another (each round) | p50 s | p95 s |\n|---|---|---|---|---|")
    for r in report["levels"]:
        print(f"| {r['clients']} | {r['tokens_per_s']} | {r['ratio']} ({', '.join(map(str, r['ratio_each_round']))}) "
              f"| {r['p50_s']} | {r['p95_s']} |")
    print(f"\nsame texts at every level: {same}; short request behind 7 long ones: {short}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
