#!/usr/bin/env bash
# HumanEval pass@1 of Dream-Coder-7B and SDAR-8B-Chat with bf16, int8 and int4 weights (--quantize), and
# their tokens/s, on one GPU, with the checkpoints already in the Hugging Face cache (codila pull
# dream-coder sdar-8b on a machine that reaches the hub, then copy the cache). No public table of these
# models' quantized pass@1 exists; this makes one.
#
#   scripts/gpu_quantize.sh [OUT_DIR] [LIMIT]
#
# Dream-Coder: one token per step (its paper's setting); SDAR: its block decoder with its defaults; 512 new
# tokens, greedy.
# Also prints each load's memory (codila models --fit) so the fit check's estimate can be compared.
set -euo pipefail
OUT="${1:-results/gpu-quantize}"
LIMIT="${2:-164}"
mkdir -p "$OUT"
codila doctor >&2 || true
codila models --fit --json > "$OUT/fit.json" || true
for model in dream-coder sdar-8b; do
    case "$model" in
        dream-coder) setting="dream:K=1" ;;
        sdar-8b) setting="block" ;;
    esac
    for q in none int8 int4; do
        nvidia-smi --query-gpu=memory.used --format=csv,noheader > "$OUT/$model-$q.mem-before" || true
        codila eval --benchmark humaneval --limit "$LIMIT" --dlm "$model" --setting "$setting" \
            --max-new-tokens 512 --device cuda --dtype bfloat16 --quantize "$q" \
            --output "$OUT/$model-$q" || echo "$model $q failed" >&2
    done
done
echo "wrote $OUT/<model>-<none|int8|int4>/{rows.jsonl,summary.md}: compare pass@1 and tokens/s across the three" >&2
