"""Weight-only 8- and 4-bit weights (``--quantize int8|int4``, ``--quantize-ar``): the projections of
every transformer layer are stored in 8 or 4 bits and multiplied by activations in the run's dtype;
the embeddings, the norms and the output head stay as loaded.

* int8: per output channel, symmetric: ``w ≈ q · s`` with ``q`` in [-127, 127], ``s = max|w_row| / 127``.
* int4: per group of G input columns (G = 128, or 64 / 32 where the width needs it), asymmetric
  round-to-nearest: ``w ≈ (q − 8) · s + z`` with ``q`` in [0, 15], ``s = (max − min) / 15``,
  ``z = min + 8 s`` (the convention of PyTorch's int4 kernels), two codes per byte.

Storage is 1 byte (int8) or ½ byte (int4) per weight plus the scales. The products run on PyTorch's own
weight-only kernels on a CPU (``torch._weight_int8pack_mm``, ``torch._weight_int4pack_mm_for_cpu``;
a row's result does not depend on the other rows, so the server's same-text rule holds quantized); on
other devices (CUDA, MPS) and for int4 shapes the CPU kernel does not take (N not a multiple of 16),
each layer's weight is widened to the run dtype for its product (the memory is saved; the speed of that
path was not measured on a GPU). Why not torchao or bitsandbytes: docs/quantization.md (measured).

A quantized weight is a :class:`QuantWeight`, a tensor-like object that ``torch.nn.functional.linear``
dispatches to (``__torch_function__``), so the native network's fused matrices and transformers'
``nn.Linear`` both run it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SCHEMES = ("none", "int8", "int4")
BITS = {"none": None, "int8": 8, "int4": 4}
GROUPS = (128, 64, 32)  # int4 group sizes tried in order (PyTorch's CPU kernel takes 32..256)


@dataclass(eq=False)
class QuantWeight:
    """A [N, K] weight in ``scheme``'s codes: ``q`` (int8 [N, K]; int4: packed bytes), ``scales`` (int8:
    [N]; int4: [K/G, N, 2] scales and zeros, the kernels' layout), run in ``dtype`` on ``device``."""

    scheme: str
    q: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    dtype: torch.dtype
    group: int = 0
    kernel: bool = True  # PyTorch's packed CPU kernel runs it (else: widened per product)

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.scales.numel() * self.scales.element_size()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return w.linear(x, bias)
        raise TypeError(f"a {cls.__name__} takes part only in F.linear (got {getattr(func, '__name__', func)})")

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias`` for x [..., K] in the run dtype; [..., N]."""
        lead, k = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, k).to(self.dtype).contiguous()
        if self.kernel and self.scheme == "int8":
            out = torch._weight_int8pack_mm(flat, self.q, self.scales)
        elif self.kernel:
            out = torch._weight_int4pack_mm_for_cpu(flat, self.q, self.group, self.scales)
        else:
            out = F.linear(flat, self.widened())
        if bias is not None:
            out = out + bias
        return out.reshape(*lead, self.shape[0])

    def widened(self) -> torch.Tensor:
        """The weight [N, K] in the run dtype, from the codes (what the kernels multiply by); computed in place
        on one [N, K] buffer, so a product holds one widened weight at a time (models/fit.py counts it)."""
        n, k = self.shape
        if self.scheme == "int8":
            return self.q.to(self.dtype).mul_(self.scales[:, None])
        if self.kernel:  # PyTorch's packed CPU layout: only its kernel reads it
            raise ValueError("an int4 weight packed for PyTorch's CPU kernel cannot be widened")
        codes = torch.stack([self.q & 15, self.q >> 4], dim=-1).view(n, k // self.group, self.group)
        scale, zero = self.scales[..., 0].t()[..., None], self.scales[..., 1].t()[..., None]  # [N, K/G, 1]
        return codes.to(self.dtype).sub_(8).mul_(scale).add_(zero).view(n, k)


def int4_group(k: int) -> int | None:
    """The int4 group size for a layer of input width ``k`` (None: no group divides it)."""
    return next((g for g in GROUPS if k % g == 0), None)


@torch.no_grad()  # a weight loaded as a parameter may still require grad: no graph may keep the fp32 chunks
def quantize_weight(w: torch.Tensor, scheme: str, *, dtype: torch.dtype, device: torch.device,
                    kernel: bool | None = None) -> QuantWeight:
    """``w`` [N, K] (any float dtype, any device) in ``scheme``'s codes on ``device``, run in ``dtype``.
    ``kernel``: force PyTorch's packed CPU kernel on or off (None: on for a CPU where the shape allows).
    Computed in fp32 a chunk of rows at a time (models/fit.py::QUANT_CHUNK weights, in blocks of 64 rows:
    PyTorch's int4 CPU packing packs 64 rows together, so chunks of 64 pack as the whole does), and int4 codes
    packed chunk by chunk, so a load needs the packed codes plus one chunk's temporaries (packing a whole
    fused MLP weight at once went through 5 bytes a weight: 0.7 GB on Dream-7B's width)."""
    from codila_cli.models.fit import QUANT_CHUNK

    n, k = w.shape
    on_cpu = torch.device(device).type == "cpu"
    if scheme not in ("int8", "int4"):
        raise ValueError(f"unknown quantization {scheme!r}: use one of {', '.join(SCHEMES)}")
    group = int4_group(k) if scheme == "int4" else k
    if group is None:
        raise ValueError(f"int4 needs layer widths that are multiples of {GROUPS[-1]}, got {k}")
    rows = max(64, QUANT_CHUNK // k // 64 * 64)
    use = (on_cpu and n % 16 == 0) if kernel is None else kernel  # int4: PyTorch's packed CPU layout

    def pack(codes: torch.Tensor) -> torch.Tensor:
        if scheme == "int8":
            return codes
        if use:
            return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        pairs = codes.view(codes.shape[0], k // 2, 2)
        return pairs[..., 0] | (pairs[..., 1] << 4)

    # the codes and scales are allocated once, before any chunk's temporaries, and filled in place: kept parts
    # between freed temporaries would fragment the heap (models/loading.py::release_freed)
    codes = scales = None
    for i in range(0, n, rows):
        part, part_scales = _codes(w[i : i + rows].to(device=device, dtype=torch.float32, copy=True), scheme, group)
        part = pack(part)
        if codes is None:
            codes = torch.empty((n, *part.shape[1:]), dtype=part.dtype, device=part.device)
            shape = (n,) if scheme == "int8" else (k // group, n, 2)
            scales = torch.empty(shape, dtype=dtype, device=part_scales.device)
        codes[i : i + part.shape[0]] = part
        if scheme == "int8":
            scales[i : i + part.shape[0]] = part_scales
        else:
            scales[:, i : i + part.shape[0]] = part_scales
        del part, part_scales
    if scheme == "int8":
        return QuantWeight("int8", codes, scales, (n, k), dtype, kernel=on_cpu if kernel is None else kernel)
    return QuantWeight("int4", codes, scales, (n, k), dtype, group=group, kernel=use)


def _codes(w32: torch.Tensor, scheme: str, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [r, K] in fp32 → (codes [r, K] int8 / uint8, scales: int8 [r]; int4 [K/G, r, 2] scale and zero)."""
    r, k = w32.shape  # ``w32`` is the chunk's own fp32 copy: worked on in place (one chunk of temporaries)
    if scheme == "int8":
        scale = (w32.abs().amax(dim=1) / 127).clamp(min=1e-12)
        return w32.div_(scale[:, None]).round_().clamp_(-127, 127).to(torch.int8), scale
    g = w32.view(r, k // group, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    codes = g.sub_(lo[..., None]).div_(scale[..., None]).round_().clamp_(0, 15).to(torch.uint8).view(r, k)
    return codes, torch.stack([scale.t(), (lo + 8 * scale).t()], dim=-1)  # [K/G, r, 2]


def check_scheme(scheme: str, *, flag: str = "--quantize") -> str:
    from codila_cli.errors import UsageError

    if scheme not in (*SCHEMES, "auto"):
        raise UsageError(f"invalid {flag} {scheme!r}", hint=f"use one of {', '.join(SCHEMES)}, auto")
    return scheme


def quantizer(scheme: str, *, dtype: torch.dtype, device: torch.device, name: str) -> Any:
    """What models/loading.py::build_model calls to quantize, one weight at a time (each original freed
    as its codes exist): on each native layer as it is fused (models/native.py::load_native), then on
    the whole network: a transformers one has every ``nn.Linear`` but the head done there (a native one
    is already done). The embeddings, norms and head stay. A width the scheme cannot take is one error."""
    from codila_cli.errors import ModelLoadError
    from codila_cli.models.native import MLP, Attention, NativeLM

    def each(part: Any) -> None:
        try:
            if isinstance(part, Attention):
                _native_attention(part, scheme, dtype=dtype, device=device)
            elif isinstance(part, MLP):
                _native_mlp(part, scheme, dtype=dtype, device=device)
            elif not isinstance(part, NativeLM):
                _linears(part, scheme, dtype=dtype, device=device)
        except ValueError as exc:
            raise ModelLoadError(f"'{name}' cannot be loaded in {scheme}: {exc}",
                                 hint="load it with --quantize none (or int8, which takes every width)") from exc

    return each


def _swap(linear: torch.nn.Module, weight: Any) -> None:
    """``linear.weight`` becomes ``weight`` (a QuantWeight, or None for a view of a fused matrix)."""
    del linear.weight
    if weight is None:
        linear.register_parameter("weight", None)
    else:
        linear.weight = weight


def _native_attention(attn: Any, scheme: str, *, dtype: torch.dtype, device: torch.device) -> None:
    """A fused native attention (models/native.py): its [q; k; v] matrix and ``o_proj``; the unfused
    projections were views of the fused one and are dropped."""
    w, bias = attn.qkv
    attn.qkv = (quantize_weight(w, scheme, dtype=dtype, device=device), None if bias is None else bias.to(device))
    if attn.qk_norm is not None:  # plain tensors, which model.to() does not move
        attn.qk_norm = attn.qk_norm.to(device)
    for p in (attn.q_proj, attn.k_proj, attn.v_proj):
        _swap(p, None)
    _swap(attn.o_proj, quantize_weight(attn.o_proj.weight, scheme, dtype=dtype, device=device))


def _native_mlp(mlp: Any, scheme: str, *, dtype: torch.dtype, device: torch.device) -> None:
    """A fused native MLP: its [gate; up] matrix and ``down_proj`` (the unfused two are dropped)."""
    for p in (mlp.gate_proj, mlp.up_proj):
        _swap(p, None)
    mlp.gate_up = quantize_weight(mlp.gate_up, scheme, dtype=dtype, device=device)
    _swap(mlp.down_proj, quantize_weight(mlp.down_proj.weight, scheme, dtype=dtype, device=device))


def _linears(model: Any, scheme: str, *, dtype: torch.dtype, device: torch.device) -> None:
    """Every ``nn.Linear`` of a transformers network but the output head (and a layer tied to the input
    embeddings)."""
    head = model.get_output_embeddings()
    emb = model.get_input_embeddings().weight
    for module in list(model.modules()):
        if isinstance(module, torch.nn.Linear) and module is not head and module.weight is not emb:
            _swap(module, quantize_weight(module.weight, scheme, dtype=dtype, device=device))


def describe(scheme: str) -> str | None:
    """What ``--json`` / ``/health`` report: None for full-precision weights."""
    return None if scheme == "none" else f"{scheme} weight-only"
