#!/usr/bin/env bash
# Reproduce the CoDiLA paper's Table 1 (syntax errors vs tokens/step) and Figure 4 (pass@1 vs tokens/s)
# at 7B on one GPU, with the checkpoints already in the Hugging Face cache:
#
#   scripts/gpu_eval.sh [AR_HELPER] [OUT_DIR] [LIMIT]
#
# AR_HELPER: a CoDiLA-aligned Qwen3-0.6B directory or repo id (stock qwen3-0.6b has never seen soft
# embeddings and is not expected to work zero-shot; see docs/codila.md). Default: qwen3-0.6b.
set -euo pipefail
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
codila() { python3 -m codila_cli "$@"; }  # the source tree runs, installed or not
AR="${1:-qwen3-0.6b}"
OUT="${2:-results/gpu}"
LIMIT="${3:-164}"
mkdir -p "$OUT"
codila doctor >&2 || true
# HumanEval, the paper's grid (dream K=1,2,4,8; threshold 0.9; codila B=2,4,8; codila B=4 with τ)
codila eval --benchmark humaneval --limit "$LIMIT" --dlm dream-coder --ar "$AR" --sweep \
    --setting "threshold:0.9,cache=dual" --setting "codila:B=4,cache=dual" \
    --max-new-tokens 512 --device "${DEVICE:-cuda}" --dtype bfloat16 --output "$OUT/humaneval"
echo "wrote $OUT/humaneval/{rows.jsonl,summary.md,pareto.png}" >&2
