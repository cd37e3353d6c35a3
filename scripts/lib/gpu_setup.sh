# Sourced by scripts/gpu_exact.sh and gpu_quantize.sh (not run on its own): a lent GPU has python3 with
# PyTorch but no `codila` entry point and none of codila's own dependencies (docs/gpu.md), so the source
# tree runs, with the wheels carried in .whl installed first.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
codila() { python3 -m codila_cli "$@"; }  # the device has no `codila` entry point: the source tree runs
cached() {  # whether the alias $1 is in the Hugging Face cache
    codila models --json | python3 -c "import json, sys; sys.exit(not any(m['alias'] == sys.argv[1] and m['cached'] for m in json.load(sys.stdin)['models']))" "$1"
}
DEVICE="${DEVICE:-cuda}"
LIMIT="${LIMIT:-164}"
mkdir -p "$DEST"
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi") | tee "$DEST/gpu.txt"
codila doctor >> "$DEST/gpu.txt" 2>&1 || true
