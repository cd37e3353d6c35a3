"""What an editor waits for (issue 52): a typical `/infill` on `codila serve` (bundled pair, this machine):
a 40-line prefix and a 20-line suffix cut from one of codila's own modules, a middle of at most 64 tokens,
streamed as llama.vscode and llama.vim would ask for it. Time to the first streamed chunk that carries
text, and to the last byte, alone and while 7 other clients keep long completions running (the load a
shared server sees), measured side by side in one run.

    python benchmarks/infill_latency.py [--repeats 8] [--out docs/results/infill-latency-s28.json]

Each fill is sent `--repeats` times alone, then `--repeats` times under load (seeds differ, so the fills
differ as typed text would); medians and the slowest are reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import threading
import time
from pathlib import Path

import httpx
from serve_load import free_port, start

ROOT = Path(__file__).resolve().parent.parent


def fill_body(seed: int) -> dict:
    """A 40-line prefix and 20-line suffix around line 140 of infill_files.py (a real module, not a toy)."""
    lines = (ROOT / "src/codila_cli/infill_files.py").read_text().splitlines(keepends=True)
    at = 140
    return {"input_prefix": "".join(lines[at - 40 : at]), "input_suffix": "".join(lines[at : at + 20]),
            "input_extra": [], "prompt": "", "n_predict": 64, "seed": seed, "stream": True, "cache_prompt": True}


def one_fill(url: str, body: dict) -> dict:
    """Seconds to the first chunk with text and to the end of the stream."""
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/infill", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and first is None and json.loads(line[6:]).get("content"):
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return {"first_chunk_s": first if first is not None else total, "total_s": total}


def summary(rows: list[dict]) -> dict:
    out = {}
    for key in ("first_chunk_s", "total_s"):
        values = sorted(r[key] for r in rows)
        out[key] = {"median": round(statistics.median(values), 3), "max": round(values[-1], 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--others", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "docs/results/infill-latency-s28.json")
    args = ap.parse_args()
    port = free_port()
    proc = start(port, max_batch=args.others + 1, extra=[])
    url = f"http://127.0.0.1:{port}"
    try:
        one_fill(url, fill_body(0))  # warm-up
        alone = [one_fill(url, fill_body(1 + i)) for i in range(args.repeats)]
        stop = threading.Event()
        done = [0]

        def busy(k: int) -> None:
            body = {"prompt": "def parse(line):", "max_tokens": 128, "seed": k, "codila": {"early_stop": False}}
            while not stop.is_set():
                httpx.post(url + "/v1/completions", json=body, timeout=300)
                done[0] += 1

        others = [threading.Thread(target=busy, args=(k,), daemon=True) for k in range(args.others)]
        for t in others:
            t.start()
        while httpx.get(url + "/health").json()["running"] < args.others:
            time.sleep(0.05)
        loaded = [one_fill(url, fill_body(100 + i)) for i in range(args.repeats)]
        stop.set()
        for t in others:
            t.join()
    finally:
        proc.terminate()
        proc.wait(30)
    result = {"machine": platform.processor() or platform.machine(), "repeats": args.repeats,
              "other_clients": args.others, "alone": summary(alone), "under_load": summary(loaded),
              "rows": {"alone": alone, "under_load": loaded}, "other_completions_finished": done[0]}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    a, u = result["alone"], result["under_load"]
    md = ("| `/infill` (40-line prefix, 20-line suffix, ≤ 64 tokens) | first chunk, median | first chunk, max "
          "| total, median | total, max |\n|---|---|---|---|---|\n"
          f"| alone | {a['first_chunk_s']['median']} s | {a['first_chunk_s']['max']} s | {a['total_s']['median']} s "
          f"| {a['total_s']['max']} s |\n"
          f"| with {args.others} other clients decoding | {u['first_chunk_s']['median']} s | {u['first_chunk_s']['max']} s "
          f"| {u['total_s']['median']} s | {u['total_s']['max']} s |\n")
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
