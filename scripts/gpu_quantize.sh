#!/usr/bin/env bash
# --quantize int8|int4 on one GPU, against bf16 weights, side by side.
#
# 1. Real-width random checkpoints (SDAR-1.7B whole, SDAR-8B's, Dream-Coder-7B's and LLaDA-8B's widths with 4 layers,
#    built as benchmarks/quantize.py builds them: no download), each scheme in a fresh process on the GPU:
#    the GPU memory torch allocated after decoding and its peak against the fit check's estimate, load
#    seconds, tokens/s and the share of tokens equal to bf16's: $OUT/random.md. On CUDA a quantized weight is
#    widened to bf16 for each product (models/quantize.py): this measures what that costs.
# 2. Only where the weights are in the Hugging Face cache (codila pull dream-coder sdar-8b on a machine that
#    reaches the hub, then copy the cache; a lent device reaches nothing, so there this part says so and is
#    skipped): HumanEval pass@1 of Dream-Coder-7B (one token per step, its paper's setting) and SDAR-8B-Chat
#    (its block decoder with its defaults) with bf16, int8 and int4 weights, 512 new tokens, greedy; and
#    `codila models --fit --json`, the fit check's estimate for each. No public table of these models'
#    quantized pass@1 exists; this makes one.
#
# Prepare on the build machine as docs/gpu.md says (wheels in .whl, carried). Then there:
#   bash scripts/gpu_quantize.sh               # not yet timed on a GPU: run it with a timeout that leaves a retry
# Settings by environment: OUT (results/gpu-quantize), DEVICE (cuda), MODELS, TOKENS (64), LIMIT (164), MAX_NEW (512),
# CKPTS (/tmp/codila-quant). A dry run on a CPU, in seconds:
#   DEVICE=cpu MODELS=sdar-tiny TOKENS=8 bash scripts/gpu_quantize.sh
set -euo pipefail
DEST="${OUT:-results/gpu-quantize}"
. "$(dirname "$0")/lib/gpu_setup.sh"  # the source tree, `codila`, `cached`, DEVICE, LIMIT
python3 benchmarks/quantize.py --device "$DEVICE" --dir "${CKPTS:-/tmp/codila-quant}" --out "$DEST/random.md" \
    --models "${MODELS:-sdar-1.7b,sdar-8b-4l,dream-7b-4l,llada-8b-4l}" --tokens "${TOKENS:-64}" --prompts 0 \
    || echo "random checkpoints failed" >&2
codila models --fit --json > "$DEST/fit.json" || true
for model in dream-coder sdar-8b; do
    if ! cached "$model"; then
        echo "HumanEval with $model skipped: not in the Hugging Face cache" | tee -a "$DEST/gpu.txt" >&2
        continue
    fi
    case "$model" in
        dream-coder) setting="dream:K=1" ;;
        sdar-8b) setting="block" ;;
    esac
    for q in none int8 int4; do
        codila eval --benchmark humaneval --limit "$LIMIT" --dlm "$model" --setting "$setting" \
            --max-new-tokens "${MAX_NEW:-512}" --device "$DEVICE" --dtype bfloat16 --quantize "$q" \
            --output "$DEST/$model-$q" || echo "$model $q failed" >&2
    done
done
python3 - "$DEST" <<'PY' | tee "$DEST/evals.md"
import json, sys
from pathlib import Path
dest = Path(sys.argv[1])
print("| model | weights | pass@1 | syntax-valid | tokens/s (× bf16) | completions = bf16 |")
print("|---|---|---|---|---|---|")
for base in sorted(dest.glob("*-none/summary.json")):
    model = base.parent.name.removesuffix("-none")
    ref = json.loads(base.read_text())[0]
    ref_rows = [json.loads(line) for line in (base.parent / "rows.jsonl").read_text().splitlines()]
    for q in ("none", "int8", "int4"):
        folder = dest / f"{model}-{q}"
        if not (folder / "summary.json").is_file():
            continue
        s = json.loads((folder / "summary.json").read_text())[0]
        rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
        same = sum(a["completion"] == b["completion"] for a, b in zip(rows, ref_rows))
        print(f"| {model} | {'bf16' if q == 'none' else q} | {s['pass_at_1']:.1%} | {s['syntax_valid']:.1%} | "
              f"{s['tokens_per_second']:.1f} ({s['tokens_per_second'] / ref['tokens_per_second']:.2f}×) | "
              f"{same} of {len(ref_rows)} |")
PY
echo "wrote $DEST/random.md (and $DEST/evals.md, $DEST/<model>-<none|int8|int4>/ for cached models)" >&2
