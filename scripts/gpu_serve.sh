#!/usr/bin/env bash
# Issue 39 at 7B on one GPU without real weights: `codila serve` on random checkpoints of Dream-Coder-7B /
# Qwen3-0.6B shape (codila_cli/train/shaped.py), loaded by the native engine so that every model call
# (KV-cached DLM slices, the helper's forwards) is stacked across requests; then benchmarks/serve_load.py:
# tokens/s and p50/p95 latency at 1–16 concurrent clients against the same requests one after another.
# Random weights decide nothing about quality; with them the texts run to max_tokens, which is what a
# throughput number needs. Preparation as scripts/gpu_speed.sh (wheels in .whl, carried), plus the
# serve extra's wheels (fastapi, starlette, pydantic, uvicorn, prometheus-client, httpx).
#   REQUESTS=16 TOKENS=128 ROUNDS=1 bash scripts/gpu_serve.sh
set -euo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 CODILA_ENGINE="${CODILA_ENGINE:-native}"
DEST="${OUT:-results/gpu-serve}"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bfloat16}"
SHAPED="${SHAPED:-/tmp/codila-shaped}"
mkdir -p "$DEST"
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi") | tee "$DEST/gpu.txt"
if [ ! -f "$SHAPED/ar/config.json" ]; then
    python3 -m codila_cli.train.shaped "$SHAPED" --device "$DEVICE" | tee -a "$DEST/gpu.txt"
fi
python3 benchmarks/serve_load.py --requests "${REQUESTS:-16}" --max-tokens "${TOKENS:-128}" --rounds "${ROUNDS:-1}" \
    --out "$DEST/serve-load.json" \
    --serve-args "--dlm $SHAPED/dlm --ar $SHAPED/ar --device $DEVICE --dtype $DTYPE" | tee "$DEST/serve-load.md"
# the same with --deterministic: "same texts at every level" (False above where cuBLAS rounds a stacked
# row otherwise) and the throughput it costs
python3 benchmarks/serve_load.py --requests "${REQUESTS:-16}" --max-tokens "${TOKENS:-128}" --rounds "${ROUNDS:-1}" \
    --out "$DEST/serve-load-deterministic.json" \
    --serve-args="--dlm $SHAPED/dlm --ar $SHAPED/ar --device $DEVICE --dtype $DTYPE --deterministic" \
    | tee "$DEST/serve-load-deterministic.md"
