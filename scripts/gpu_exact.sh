#!/usr/bin/env bash
# --exact (FreeDave) on one GPU: sequential forwards, canvases evaluated and the wall-clock ratio against the
# one-token-per-step decode it reproduces, side by side, and identical texts.
#
# 1. Real-width random checkpoints of Dream-Coder-7B's, LLaDA-8B's and SDAR-8B's widths (4 layers) and
#    SDAR-1.7B whole, built as benchmarks/quantize.py builds them (no download), in fp32 and bf16 on the GPU
#    (benchmarks/exact.py --device cuda): $OUT/random.md.
# 2. Only where the weights are in the Hugging Face cache (codila pull dream-coder sdar-8b on a machine that
#    reaches the hub, then copy the cache; a lent device reaches nothing, so there this part says so and is
#    skipped): HumanEval with Dream-Coder-7B at one token per step and SDAR-8B's block decoder at one slot per
#    step (T 0), each with exact=0 and exact=1, in fp32 and bf16: compare rows.jsonl's completions (identical)
#    and summary.md's tokens/s (eval decodes greedily).
# 3. With DATA set to a folder holding human-eval-infilling/ (../shared/data) and DreamOn in the cache:
#    HumanEval-MultiLineInfilling with DreamOn's one slot per step, exact=0 and exact=1, fp32 and bf16.
#
# Prepare on the build machine as docs/gpu.md says (the device has python3 and torch but none of
# tree-sitter, tree-sitter-python, platformdirs, pyflakes, tomlkit: wheels in .whl, carried). Then there:
#   bash scripts/gpu_exact.sh                  # not yet timed on a GPU: run it with a timeout that leaves a retry
# Settings by environment: OUT (results/gpu-exact), DEVICE (cuda), MODELS, TOKENS (128,256), DTYPES
# (float32,bfloat16), LIMIT (164), MAX_NEW (512), CKPTS (/tmp/codila-quant). A dry run on a CPU, in seconds:
#   DEVICE=cpu MODELS=sdar-tiny TOKENS=16 DTYPES=float32 bash scripts/gpu_exact.sh
set -euo pipefail
DEST="${OUT:-results/gpu-exact}"
. "$(dirname "$0")/lib/gpu_setup.sh"  # the source tree, `codila`, `cached`, DEVICE, LIMIT
python3 benchmarks/exact.py --device "$DEVICE" --dir "${CKPTS:-/tmp/codila-quant}" --out "$DEST/random.md" \
    --models "${MODELS:-sdar-1.7b,sdar-8b-4l,dream-7b-4l,llada-8b-4l}" --tokens "${TOKENS:-128,256}" \
    --dtypes "${DTYPES:-float32,bfloat16}" || echo "random checkpoints failed" >&2
for model in dream-coder sdar-8b; do
    if ! cached "$model"; then
        echo "HumanEval with $model skipped: not in the Hugging Face cache" | tee -a "$DEST/gpu.txt" >&2
        continue
    fi
    case "$model" in
        dream-coder) setting="dream:K=1" ;;
        sdar-8b) setting="block:remask=low_confidence" ;;
    esac
    for dtype in bfloat16 float32; do
        for mode in 0 1; do
            codila eval --benchmark humaneval --limit "$LIMIT" --dlm "$model" --setting "$setting,exact=$mode" \
                --max-new-tokens "${MAX_NEW:-512}" --device "$DEVICE" --dtype "$dtype" \
                --output "$DEST/$model-$dtype-exact$mode" || echo "$model $dtype exact=$mode failed" >&2
        done
    done
done
if [ -n "${DATA:-}" ] && cached dreamon; then
    for dtype in bfloat16 float32; do
        for mode in 0 1; do
            codila eval --benchmark he-infill-multi --data-dir "$DATA" --limit "$LIMIT" --dlm dreamon \
                --setting "dreamon:K=1,exact=$mode" --device "$DEVICE" --dtype "$dtype" \
                --output "$DEST/dreamon-$dtype-exact$mode" || echo "dreamon $dtype exact=$mode failed" >&2
        done
    done
fi
python3 - "$DEST" <<'PY' | tee "$DEST/evals.md"
import json, sys
from pathlib import Path
dest = Path(sys.argv[1])
print("| model | dtype | completions identical | DLM forwards exact=0 → 1 | wall exact=0 ÷ exact=1 | pass@1 0 / 1 |")
print("|---|---|---|---|---|---|")
for off in sorted(dest.glob("*-exact0/rows.jsonl")):
    on = Path(str(off).replace("-exact0/", "-exact1/"))
    if not on.is_file():
        continue
    a, b = ([json.loads(line) for line in p.read_text().splitlines()] for p in (off, on))
    same = sum(x["completion"] == y["completion"] for x, y in zip(a, b))
    model, dtype = off.parent.name.removesuffix("-exact0").rsplit("-", 1)
    fa, fb = sum(r["dlm_forwards"] for r in a), sum(r["dlm_forwards"] for r in b)
    wa, wb = sum(r["wall_seconds"] for r in a), sum(r["wall_seconds"] for r in b)
    pa, pb = (sum(r["passed"] for r in rows) / len(rows) for rows in (a, b))
    print(f"| {model} | {dtype} | {same} of {len(a)} | {fa} → {fb} | {wa / wb:.2f}× | {pa:.1%} / {pb:.1%} |")
PY
echo "wrote $DEST/random.md (and $DEST/evals.md, $DEST/<model>-<dtype>-exact<0|1>/ for cached models)" >&2
