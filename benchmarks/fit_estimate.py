"""The fit check's estimate (models/fit.py) against the memory a load and a forward really take.

    python benchmarks/fit_estimate.py [--dir /tmp/codila-load-mem] [--out results/fit-estimate.md]

Builds (or reuses) benchmarks/load_memory.py's random Dream-layout DLM (12 layers, hidden 1024, 30k
vocabulary: about 245 M parameters, stored in bf16), then in a fresh process per dtype: the estimate
the fit check makes before loading, the growth of peak RSS over the process's own after `load_models`,
and after one forward over a canvas of the estimate's 2048 positions (the activations it allows for),
from /proc/self/status (the peak reset just before loading). The process itself (the 400 MiB the check
adds on a CPU) is its RSS before loading, shown apart.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import sys
import torch
from codila_cli.engine.models import load_models, sized
from codila_cli.models.fit import CANVAS
from codila_cli.models.cache import resolve_local_dir
from codila_cli.models.registry import resolve_spec
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) / 1024
torch.set_num_threads(2)
torch.ones(1)
path, dtype = sys.argv[1], getattr(torch, sys.argv[2])
(need,), _ = sized([(path, resolve_local_dir(resolve_spec(path, kind="dlm")), dtype, "none")])
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) starts again from the RSS now
base = status("VmRSS")
m = load_models(dlm=path, ar=None, device="cpu", dtype=sys.argv[2])
loaded = status("VmHWM")
with torch.inference_mode():
    m.dlm.logits(torch.full((1, CANVAS), m.dlm.specials.mask, dtype=torch.long))
peak = status("VmHWM")
mib = 2**20
print(f"{base:.0f} {(need.weights + need.loading) / mib:.0f} {loaded - base:.0f} {need.total / mib:.0f} {peak - base:.0f}")
"""


def main() -> None:
    from load_memory import cli_args, write_table  # the same checkpoint (this folder is on sys.path when run)

    args = cli_args()
    head = ("| dtype (file: bf16) | process RSS MiB | load: estimate MiB | load: measured MiB | "
            "load + 2048-position forward: estimate MiB | measured MiB | estimate / measured |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    for dtype in ("bfloat16", "float32"):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.dir / "dlm"), dtype], capture_output=True,
                             text=True, check=True).stdout.split()
        base, est_load, load, est_all, peak = (float(x) for x in out)
        lines.append(f"| {dtype} | {base:.0f} | {est_load:.0f} | {load:.0f} | {est_all:.0f} | {peak:.0f} | "
                     f"{est_all / peak:.2f} |")
    write_table(lines, args.out)


if __name__ == "__main__":
    main()
