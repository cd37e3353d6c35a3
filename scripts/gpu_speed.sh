#!/usr/bin/env bash
# Issue 10 at 7B on one GPU without real weights: random checkpoints of Dream-Coder-7B / Qwen3-0.6B shape
# (codila_cli/train/shaped.py), then benchmarks/perf.py in bf16 on CUDA for each engine. Reports the time
# per forward, tokens/s ratios, cache gains and the share of wall time outside forwards (the sampler
# overhead target: under 2 % at 7B). Random weights decide nothing about quality or tokens per step.
#
# Prepare on the build machine (the device has no tree-sitter / platformdirs and cannot download):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl tree-sitter==0.26.1 tree-sitter-python==0.25.0 platformdirs pyflakes tomlkit   (docs/gpu.md)
# Then run this script there with `.whl` carried; results land in $OUT (or results/gpu-speed).
#   ENGINES="transformers native" PROMPTS=3 TOKENS=128 REPEATS=2 bash scripts/gpu_speed.sh
set -euo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
DEST="${OUT:-results/gpu-speed}"
ENGINES="${ENGINES:-transformers native}"
PROMPTS="${PROMPTS:-3}"
TOKENS="${TOKENS:-128}"
REPEATS="${REPEATS:-2}"
COMPILE="${COMPILE:-0}"     # 1: also measure torch.compile'd forwards (minutes of compilation at 7B)
DEVICE="${DEVICE:-cuda}"   # DEVICE=cpu DTYPE=float32 SHAPED=<a small build_shaped pair> dry-runs the script here
DTYPE="${DTYPE:-bfloat16}"
mkdir -p "$DEST"
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi") | tee "$DEST/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$DEST/gpu.txt"
SHAPED="${SHAPED:-/tmp/codila-shaped}"
if [ ! -f "$SHAPED/ar/config.json" ]; then
    start=$SECONDS
    python3 -m codila_cli.train.shaped "$SHAPED" --device "$DEVICE" | tee -a "$DEST/gpu.txt"
    echo "random checkpoints written in $((SECONDS - start)) s" | tee -a "$DEST/gpu.txt"
fi
for engine in $ENGINES; do  # cold start at 7B: `codila gen` end to end (imports, load, 16 tokens)
    CODILA_ENGINE="$engine" python3 - "$SHAPED" "$DEVICE" "$DTYPE" "$engine" <<'PY' | tee -a "$DEST/gpu.txt"
import subprocess, sys, time
shaped, device, dtype, engine = sys.argv[1:]
t = time.perf_counter()
r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "-v", "--dlm", f"{shaped}/dlm", "--ar", f"{shaped}/ar",
                    "--device", device, "--dtype", dtype, "--max-new-tokens", "16", "--seed", "0", "def f(x):"],
                   capture_output=True, text=True, check=False)
print(f"codila gen end to end ({engine}): {time.perf_counter() - t:.1f} s, rc {r.returncode}")
print("\n".join(r.stderr.strip().splitlines()[-2:]))
PY
done
R="codila:B=4,W=1,ctx=64,rp=1.3"  # the bundled helper's recommendation; gen adds its cache=prefix,cb=8
for engine in $ENGINES; do
    CODILA_ENGINE="$engine" python3 benchmarks/perf.py --out "$DEST/$engine" --dlm "$SHAPED/dlm" --ar "$SHAPED/ar" \
        --device "$DEVICE" --dtype "$DTYPE" --prompts "$PROMPTS" --max-new-tokens "$TOKENS" --repeats "$REPEATS" \
        $([ "$COMPILE" = 1 ] || echo --no-compile) --no-startup --batch 4 \
        --settings dream:K=1 threshold:0.9 threshold:0.9,cache=dual codila:B=4,W=1 "$R" \
        "$R,cache=prefix,cb=8" "$R,cache=dual,cb=4" 2>&1 | tail -n 20
done
