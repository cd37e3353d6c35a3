#!/usr/bin/env bash
# Issue 24 at real size on one GPU without real weights: random checkpoints of Dream-Coder-7B / Qwen3-0.6B
# shape (codila_cli/train/shaped.py), synthetic text in their word-level test tokenizer, then
# benchmarks/align_throughput.py for a fixed number of `codila train align` steps in bf16 (DLM) / fp32
# master weights with bf16 autocast (helper), with gradient checkpointing. Prints seconds per step,
# DLM tokens/s, helper blocks/s and peak GPU memory (the figure docs/training.md estimates).
#
# Prepare on the build machine as for scripts/gpu_speed.sh (.whl with tree-sitter, platformdirs), carry it:
#   STEPS=10 BATCH=8 SEQ=2048 bash scripts/gpu_align.sh          # results in $OUT (or results/gpu-align)
# Dry run here on a small pair: DEVICE=cpu SHAPED=<build_shaped dir> SEQ=64 BATCH=4 bash scripts/gpu_align.sh
set -euo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
DEST="${OUT:-results/gpu-align}"
DEVICE="${DEVICE:-cuda}"
STEPS="${STEPS:-10}"
BATCH="${BATCH:-8}"
SEQ="${SEQ:-2048}"
SHAPED="${SHAPED:-/tmp/codila-shaped}"
mkdir -p "$DEST"
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi") | tee "$DEST/gpu.txt"
if [ ! -f "$SHAPED/ar/config.json" ]; then
    python3 -m codila_cli.train.shaped "$SHAPED" --device "$DEVICE" | tee -a "$DEST/gpu.txt"
fi
DATA="$DEST/synthetic.jsonl"   # documents of the shaped tokenizer's words t0 … t<ordinary-1>
python3 - "$SHAPED" "$DATA" <<'PY'
import json, random, sys
from pathlib import Path
shaped, out = Path(sys.argv[1]), Path(sys.argv[2])
vocab = json.loads((shaped / "dlm" / "tokenizer.json").read_text())["model"]["vocab"]
n = len(vocab)
rng = random.Random(0)
with open(out, "w") as fh:
    for _ in range(400):
        fh.write(json.dumps({"text": " ".join(f"t{rng.randrange(1, n)}" for _ in range(3000))}) + "\n")
PY
for gc in --grad-checkpointing --no-grad-checkpointing; do
    python3 benchmarks/align_throughput.py --dlm "$SHAPED/dlm" --ar "$SHAPED/ar" --data "$DATA" --device "$DEVICE" \
        --steps "$STEPS" --batch "$BATCH" --seq-len "$SEQ" --context "${CONTEXT:-96}" $gc --json "$DEST/align${gc#--}.json" \
        | tee -a "$DEST/align.md"
done
