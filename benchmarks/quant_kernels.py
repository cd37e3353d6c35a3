"""Why codila's 8- and 4-bit weights run on PyTorch's own kernels: one 2048×6144 projection (SDAR-1.7B's
MLP) at 1, 8 and 64 rows, bf16 against the weight-only kernels of each candidate, side by side in one run.

    python benchmarks/quant_kernels.py [--threads 2]

Candidates: codila's QuantWeight (models/quantize.py: ``torch._weight_int8pack_mm`` and
``torch._weight_int4pack_mm_for_cpu``), torchao's ``Int8WeightOnlyConfig`` / ``Int4WeightOnlyConfig``
and bitsandbytes' ``Linear8bitLt`` / ``Linear4bit`` (NF4), each where it is installed (neither is a
dependency: ``pip install torchao bitsandbytes`` to compare). Per cell: milliseconds per product, and
whether a row's result is the same bits with the other rows beside it (the server's same-text rule).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

N, K = 6144, 2048
ROWS = (1, 8, 64)


def _ms(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, reps: int = 20) -> float:
    with torch.inference_mode():
        f(x)
        t = time.perf_counter()
        for _ in range(reps):
            f(x)
    return (time.perf_counter() - t) / reps * 1e3


def _row_invariant(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
    with torch.inference_mode():
        return torch.equal(f(x), torch.cat([f(x[i : i + 1]) for i in range(x.shape[0])]))


def candidates(w: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor] | str]:
    from codila_cli.models.quantize import quantize_weight

    out: dict[str, Callable[[torch.Tensor], torch.Tensor] | str] = {"bf16 (no quantization)": lambda x: F.linear(x, w)}
    for scheme in ("int8", "int4"):
        qw = quantize_weight(w, scheme, dtype=torch.bfloat16, device=torch.device("cpu"))
        out[f"codila {scheme} (PyTorch kernels)"] = lambda x, qw=qw: F.linear(x, qw)
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

        for name, cfg in (("int8", Int8WeightOnlyConfig()), ("int4", Int4WeightOnlyConfig(group_size=128))):
            lin = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
            lin.weight.data.copy_(w)
            try:
                quantize_(lin, cfg)
                out[f"torchao {name}"] = lin
            except Exception as exc:  # noqa: BLE001 - what the library says is the finding
                out[f"torchao {name}"] = f"refused on this CPU: {type(exc).__name__}: {str(exc)[:80]}"
    except ImportError:
        out["torchao"] = "not installed"
    try:
        import bitsandbytes as bnb

        m8 = bnb.nn.Linear8bitLt(K, N, bias=False, has_fp16_weights=False, threshold=0.0)
        m8.weight = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False)
        out["bitsandbytes int8"] = m8.to("cpu")
        m4 = bnb.nn.Linear4bit(K, N, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
        m4.weight = bnb.nn.Params4bit(w.clone(), requires_grad=False, quant_type="nf4")
        out["bitsandbytes nf4"] = m4.to("cpu")
    except ImportError:
        out["bitsandbytes"] = "not installed"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    w = (torch.randn(N, K, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    print(f"torch {torch.__version__}, {args.threads} threads, a {K}×{N} weight, bf16 activations\n")
    print("| kernel | " + " | ".join(f"{r} row{'s' * (r > 1)} ms" for r in ROWS) + " | rows alone = together |")
    print("|---|" + "---|" * len(ROWS) + "---|")
    for name, f in candidates(copy.deepcopy(w)).items():
        if isinstance(f, str):
            print(f"| {name} | {f} |" + " |" * len(ROWS))
            continue
        xs = [torch.randn(r, K).to(torch.bfloat16) for r in ROWS]
        times = [_ms(f, x) for x in xs]
        print(f"| {name} | " + " | ".join(f"{t:.2f}" for t in times) + f" | {_row_invariant(f, xs[-1])} |")


if __name__ == "__main__":
    main()
