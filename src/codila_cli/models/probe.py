"""``--dtype auto`` on a CPU by measurement: whether this CPU multiplies a model's own shapes faster in bf16
than in fp32 (issue 64, item 4). One CPU flag (Intel AMX) decided it before; on an AMD CPU with AVX-512
bf16 instructions but no AMX, bf16 products were 2.4–7.1× faster at every decoding shape, and a small
helper's steps, which ran 4× slower in bf16 on one Intel CPU, were 1.3–6.5× faster there.

The probe times ``x @ W.T`` for one MLP projection of the model (``W`` [intermediate, hidden]) at the row
counts its forwards have: a diffusion model's forward covers the prompt and the canvas (:data:`ROWS`
"dlm"), a helper's step a few tokens ("ar"); bf16 is chosen where its total time is under
:data:`MARGIN` of fp32's. About 0.1–1 s once per shape; the verdict is cached per CPU model, torch
version, thread count and shape in codila's cache folder (``dtype-probe.json``), so later loads read it.
``CODILA_DTYPE_PROBE=0`` turns the probe off (the AMX rule decides, as before): for runs that must give
the same bits on every machine, name the dtype instead (``--dtype float32``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

ROWS = {"dlm": (64, 256), "ar": (1, 8)}
MARGIN = 0.9  # bf16 only where it takes at most this share of fp32's time (a clear win, not noise)
REPEATS = 5


@dataclass(frozen=True)
class Verdict:
    bf16: bool
    speedup: float  # fp32 time / bf16 time
    cached: bool

    def words(self) -> str:
        """For -v, doctor and /health: the dtype chosen and what the probe measured."""
        chosen = "bf16" if self.bf16 else "fp32"
        return f"{chosen}: bf16 ran {self.speedup:.1f}× fp32's speed on this CPU (probe{', cached' if self.cached else ''})"


def mlp_shape(cfg: dict) -> dict[str, int]:
    """The probed weight's shape from a config.json (Qwen/Dream/SDAR keys, or LLaDA's)."""
    hidden = int(cfg.get("hidden_size") or cfg.get("d_model") or 0)
    return {"hidden": hidden, "intermediate": int(cfg.get("intermediate_size") or cfg.get("mlp_hidden_size") or 4 * hidden)}


def enabled() -> bool:
    return os.environ.get("CODILA_DTYPE_PROBE", "1").strip().lower() not in ("0", "off", "false", "no")


def bf16_faster(*, hidden: int, intermediate: int, role: str) -> Verdict:
    """Whether bf16 products of a [``intermediate``, ``hidden``] weight at ``role``'s row counts beat fp32
    here (cached, see the module's docstring)."""
    import torch

    key = f"{cpu_model()}|torch {torch.__version__}|{torch.get_num_threads()} threads|{role}|{hidden}x{intermediate}"
    cache = _read()
    if key in cache:
        return Verdict(bool(cache[key]["bf16"]), float(cache[key]["speedup"]), cached=True)
    fp32 = sum(time_product(hidden, intermediate, rows, torch.float32) for rows in ROWS[role])
    bf16 = sum(time_product(hidden, intermediate, rows, torch.bfloat16) for rows in ROWS[role])
    verdict = Verdict(bf16 <= MARGIN * fp32, fp32 / bf16 if bf16 > 0 else 1.0, cached=False)
    cache[key] = {"bf16": verdict.bf16, "speedup": round(verdict.speedup, 3), "fp32_s": fp32, "bf16_s": bf16}
    _write(cache)
    return verdict


def fastest_weights(*, hidden: int, intermediate: int, role: str, allowed: tuple[str, ...]) -> tuple[str, str]:
    """``--quantize auto``: of ``allowed`` ("none", "int8", "int4", in that order of precision), the one whose
    products (bf16 activations) at ``role``'s row counts are fastest here, a lower precision only where it
    takes at most :data:`MARGIN` of the time of the one before; (scheme, why). Cached as the dtype probe."""
    import torch

    key = f"{cpu_model()}|torch {torch.__version__}|{torch.get_num_threads()} threads|{role}|{hidden}x{intermediate}|weights"
    cache = _read()
    cached = key in cache
    if not cached:
        cache[key] = {s: sum(time_product(hidden, intermediate, rows, torch.bfloat16, scheme=s) for rows in ROWS[role])
                      for s in ("none", "int8", "int4")}
        _write(cache)
    seconds = cache[key]
    best = allowed[0]
    for scheme in allowed[1:]:
        if seconds[scheme] <= MARGIN * seconds[best]:
            best = scheme
    speed = ", ".join(f"{s} {seconds['none'] / seconds[s]:.1f}×" for s in ("int8", "int4"))
    return best, f"quantize auto: {best} (bf16 products' speed here: {speed}; probe{', cached' if cached else ''})"


def time_product(hidden: int, intermediate: int, rows: int, dtype: object, *, scheme: str = "none") -> float:
    """The median seconds of one [rows, hidden] × [hidden, intermediate] product in ``dtype`` (the weight in
    ``scheme``'s codes: models/quantize.py)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(intermediate, hidden, generator=g) * 0.02).to(dtype)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    if scheme != "none":
        from codila_cli.models.quantize import quantize_weight

        w = quantize_weight(w, scheme, dtype=dtype, device=torch.device("cpu"))
    times = []
    with torch.inference_mode():
        F.linear(x, w)  # the first call pays for kernel selection and packing
        for _ in range(REPEATS):
            t = time.perf_counter()
            F.linear(x, w)
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def cache_file() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("codila")) / "dtype-probe.json"  # $XDG_CACHE_HOME/codila on Linux


def _read() -> dict:
    try:
        data = json.loads(cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(cache: dict) -> None:
    """Best effort: a cache that cannot be written only costs the next run its probe."""
    from codila_cli.atomic import write_text_atomic
    from codila_cli.errors import CodilaError

    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(cache, indent=1, sort_keys=True) + "\n")
    except (OSError, CodilaError):
        pass
