#!/usr/bin/env bash
# --exact (FreeDave) on one GPU: sequential forwards, canvases evaluated and the wall-clock ratio against the
# one-token-per-step decode it reproduces, side by side, and identical texts.
#
#   scripts/gpu_exact.sh [OUT_DIR] [LIMIT]
#
# 1. Real-width random checkpoints of Dream-Coder-7B's and LLaDA-8B's widths (4 layers) and SDAR-1.7B whole,
#    built as benchmarks/quantize.py builds them, in bf16 on cuda (benchmarks/exact.py --device cuda).
# 2. Where the weights are in the Hugging Face cache (codila pull dream-coder sdar-8b on a machine that
#    reaches the hub, then copy the cache): HumanEval with Dream-Coder-7B at one token per step and SDAR-8B's
#    block decoder at one slot per step (T 0), each with --no-exact and --exact, in fp32 and bf16: compare
#    rows.jsonl's completions (identical) and summary.md's tokens/s (eval decodes greedily: T 0).
# 3. With DATA set to a folder holding human-eval-infilling/ (../shared/data) and DreamOn in the cache:
#    HumanEval-MultiLineInfilling with DreamOn's one slot per step, --no-exact and --exact, fp32 and bf16.
set -euo pipefail
OUT="${1:-results/gpu-exact}"
LIMIT="${2:-164}"
mkdir -p "$OUT"
codila doctor >&2 || true
python benchmarks/exact.py --device cuda --dir "$OUT/ckpts" --out "$OUT/random.md" \
    --models sdar-1.7b,dream-7b-4l,llada-8b-4l --tokens 128,256 || echo "random checkpoints failed" >&2
for model in dream-coder sdar-8b; do
    case "$model" in
        dream-coder) setting="dream:K=1" ;;
        sdar-8b) setting="block:remask=low_confidence" ;;
    esac
    for dtype in bfloat16 float32; do
        for mode in 0 1; do
            codila eval --benchmark humaneval --limit "$LIMIT" --dlm "$model" --setting "$setting,exact=$mode" \
                --max-new-tokens 512 --device cuda --dtype "$dtype" \
                --output "$OUT/$model-$dtype-exact$mode" || echo "$model $dtype exact=$mode failed" >&2
        done
    done
done
if [ -n "${DATA:-}" ]; then
    for dtype in bfloat16 float32; do
        for mode in 0 1; do
            codila eval --benchmark he-infill-multi --data-dir "$DATA" --limit "$LIMIT" --dlm dreamon \
                --setting "dreamon:K=1,exact=$mode" --device cuda --dtype "$dtype" \
                --output "$OUT/dreamon-$dtype-exact$mode" || echo "dreamon $dtype exact=$mode failed" >&2
        done
    done
fi
echo "wrote $OUT/random.md and $OUT/<model>-<dtype>-exact<0|1>/{rows.jsonl,summary.md}" >&2
