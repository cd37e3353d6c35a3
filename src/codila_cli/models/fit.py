"""Will it fit? The memory a load needs, from the weights' safetensors headers (nothing loaded), against
what the device has, checked before any weight is read (issue 64: a 7B model on a 16 GB laptop died of
out-of-memory half-loaded, or swapped for minutes).

A model needs (:func:`estimate`) its weights at the dtype it will run in, and the most of what loading and
decoding add (the first is freed before the second starts): while loading, one weight file in its stored
dtype on top when it is cast (codila casts file by file, tensor by tensor), or what quantizing one weight
holds; for decoding, the activations of a canvas of ``canvas`` positions (a command that knows its
``--max-new-tokens`` allows that plus ``PROMPT_ROOM`` for the prompt: :func:`canvas_for`; a server, which
takes any request, ``CANVAS``): the logits of each position (in the
run dtype, and in fp32 for the sampler), the MLP's intermediate buffers, a few hidden-size buffers and
the key/value cache of every layer (benchmarks/fit_estimate.py compares it with the measured peak). A CPU has (:func:`available`)
the smallest of the kernel's ``MemAvailable``, the cgroup's limit less its usage (v2 ``memory.max``, v1
``memory.limit_in_bytes``) and ``CODILA_MEMORY_LIMIT`` (e.g. ``8G``, for a user who wants a margin, and
for tests); a CUDA device its free memory. ``--no-fit-check`` (``CODILA_NO_FIT_CHECK=1``) skips it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codila_cli.errors import ModelLoadError

CANVAS = 2048  # positions the activation estimate allows for (a prompt and its canvas: Dream's usable context)
PROMPT_ROOM = 512  # prompt positions a command allows for beside its --max-new-tokens
RUNTIME = 400 * 2**20  # the process itself on a CPU: the interpreter, torch, the tokenizer
BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
         "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class Need:
    name: str
    dtype: str  # what the weights run in
    weights: int  # bytes
    loading: int  # bytes on top while loading (a file cast to the run dtype)
    activations: int  # bytes for the canvas's positions

    @property
    def total(self) -> int:
        """The most the load holds at once: its weights, and what loading or decoding adds (what loading
        adds is freed before the first forward: models/loading.py::release_freed)."""
        return self.weights + max(self.loading, self.activations)


def canvas_for(max_new_tokens: int | None) -> int:
    """The positions a command's activations are sized for: its canvas and room for a prompt (``CANVAS``
    when the command does not say how many tokens it writes)."""
    return CANVAS if max_new_tokens is None else max_new_tokens + PROMPT_ROOM


def estimate(path: Path, cfg: dict, *, name: str, dtype: str, files: list[Path], quantize: str = "none",
             canvas: int = CANVAS, native: bool = False, widened: bool = False) -> Need:
    """The bytes a load of the checkpoint at ``path`` in ``dtype`` ("float32", "bfloat16", "float16") needs,
    decoding ``canvas`` positions;
    ``quantize`` ("int8", "int4"): the projections inside numbered layers (2-D weights) as codes and scales
    (models/quantize.py), the rest in ``dtype``; ``native``: the load runs models/native.py's network, which
    quantizes fused matrices (models/loading.py::engine_for); ``widened``: no weight-only kernel runs the
    products (CUDA and other non-CPU devices), so each widens its weight to ``dtype`` for the product
    (models/quantize.py::QuantWeight.widened), one at a time while decoding."""
    from codila_cli.models.validate import weight_headers

    size = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    weights = largest = biggest = 0
    for f in files:
        stored = 0
        for key, (stored_dtype, shape) in weight_headers([f], name=name).items():
            n = 1
            for d in shape:
                n *= d
            floating = stored_dtype in ("F64", "F32", "F16", "BF16")
            if quantize != "none" and floating and len(shape) == 2 and _LAYER.search(key):
                weights += n + shape[0] * size if quantize == "int8" else n // 2 + n // 128 * 2 * size
                biggest = max(biggest, n)
            else:
                weights += n * (size if floating else BYTES.get(stored_dtype, 4))
            stored += n * BYTES.get(stored_dtype, 4)
        largest = max(largest, stored)
    stored_kind = str(cfg.get("dtype") or cfg.get("torch_dtype") or "").removeprefix("torch.")
    # while loading: a weight file cast to the run dtype; quantizing reads the stored files in place (mapped)
    # and works on one weight at a time: a chunk's fp32 temporaries, and on the native network the fused
    # matrix it quantizes ([gate; up], two of the largest, in the run dtype: models/native.py::load_native)
    loading = largest if stored_kind != dtype and quantize == "none" else 0
    if quantize != "none":
        loading += (2 * biggest * size if native else 0) + 4 * 4 * min(biggest, QUANT_CHUNK)
    hidden = int(cfg.get("hidden_size") or cfg.get("d_model") or 0)
    layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or cfg.get("n_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or cfg.get("n_kv_heads") or heads)
    head_dim = int(cfg.get("head_dim") or (hidden // heads if heads else 0))
    vocab = int(cfg.get("embedding_size") or cfg.get("vocab_size") or 0)
    inter = int(cfg.get("intermediate_size") or cfg.get("mlp_hidden_size") or 4 * hidden)
    # per position: the logits (in the run dtype, and again in fp32 for the sampler when that is another),
    # the MLP's gate, up and product, a few hidden-size buffers; and the KV cache of every layer
    per = vocab * 4 + (vocab * size if size != 4 else 0) + inter * size * 3 + hidden * 4 * 8
    activations = canvas * per + layers * 2 * canvas * kv * head_dim * size
    if quantize != "none" and widened:  # the largest weight widened (fused [gate; up] natively), and int4's codes
        fused = 2 * biggest if native else biggest
        activations += fused * size + (fused if quantize == "int4" else 0)
    tag = dtype if quantize == "none" else f"{quantize} ({dtype})"
    return Need(name, tag, weights, loading, activations)


_LAYER = re.compile(r"\.\d+\.")  # a tensor inside a numbered layer (model.layers.3.…, transformer.blocks.3.…)
QUANT_CHUNK = 4 * 2**20  # weights quantized at a time (models/quantize.py): their fp32 temporaries are 4 × 4 bytes each


def available(device: Any) -> tuple[int, str]:
    """(bytes this device can still give, where that number comes from)."""
    limit = os.environ.get("CODILA_MEMORY_LIMIT", "").strip()
    if limit:
        return parse_size(limit), "CODILA_MEMORY_LIMIT"
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free memory of {torch.cuda.get_device_name(device)}"
    found = [(n, w) for n, w in ((_meminfo(), "MemAvailable"), (_cgroup_room(), "the cgroup's memory limit")) if n]
    return min(found) if found else (1 << 62, "unknown")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        from codila_cli.errors import UsageError

        raise UsageError(f"CODILA_MEMORY_LIMIT is {text!r}, not a size", hint="e.g. CODILA_MEMORY_LIMIT=8G")
    return int(float(m[1]) * 1024 ** "_KMGT".index((m[2] or "_").upper()))


@dataclass(frozen=True)
class Verdict:
    fits: bool
    total: int  # bytes the loads need, the process included
    have: int
    where: str  # where ``have`` comes from
    options: tuple[tuple[str, int], ...] = ()  # (the flag, bytes the loads need with it), cheapest last

    @property
    def bf16(self) -> int | None:
        """Bytes in bf16, where some load runs in fp32."""
        return dict(self.options).get("--dtype bfloat16")

    @property
    def fitting(self) -> str | None:
        """The first option (flag) under which the loads fit, if any."""
        return next((flag for flag, total in self.options if total <= self.have), None)


def verdict(needs: list[Need], device: Any, *, options: dict[str, list[Need]] | None = None) -> Verdict:
    """Whether ``needs`` fit ``device`` now (and what the same loads need under each flag of ``options``)."""
    have, where = available(device)
    runtime = RUNTIME if getattr(device, "type", "cpu") == "cpu" else 0
    total = sum(n.total for n in needs) + runtime
    sized = tuple((flag, sum(n.total for n in alt) + runtime) for flag, alt in (options or {}).items())
    return Verdict(total <= have, total, have, where, sized)


def check(needs: list[Need], device: Any, *, options: dict[str, list[Need]] | None = None) -> None:
    """Refuse, with the numbers, loads that together need more than the device has; ``options``: the
    same loads under other flags (``--dtype bfloat16``, ``--quantize int8``, …), the first that fits named
    in the hint."""
    if os.environ.get("CODILA_NO_FIT_CHECK", "").strip() in ("1", "true", "yes"):
        return
    v = verdict(needs, device, options=options)
    if v.fits:
        return
    total, have, where = v.total, v.have, v.where
    parts = ", ".join(f"{n.name} {_gib(n.weights)} of {n.dtype} weights + {_gib(max(n.loading, n.activations))} "
                      "to load or decode" for n in needs)
    hint = "use a smaller model, or a device with more memory"
    if v.fitting is not None:
        hint = f"{v.fitting} needs {_gib(dict(v.options)[v.fitting])}: fits"
    raise ModelLoadError(f"the models need about {_gib(total)} ({parts}), and {device} has {_gib(have)} "
                         f"({where})", hint=f"{hint} (--no-fit-check loads anyway)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _meminfo() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """The memory this process's cgroup may still take (limit less usage), v2 then v1; None without a limit."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, rel = line.split(":", 2)
            if names == "":  # v2: the unified hierarchy, mounted alone or beside v1's (hybrid)
                base = next((r / rel.lstrip("/") for r in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                             if (r / "cgroup.controllers").is_file()), Path("/nonexistent"))
                limit, usage = base / "memory.max", base / "memory.current"
            elif "memory" in names.split(","):
                base = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
                limit, usage = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
            else:
                continue
            if limit.is_file():
                text = limit.read_text().strip()
                if text == "max" or int(text) >= 1 << 60:
                    continue
                return max(0, int(text) - int(usage.read_text().strip() or 0))
    except (OSError, ValueError):
        pass
    return None
