"""``codila train align --nproc N``: start N processes of this machine through torchrun (PyTorch's own
launcher, ``torch.distributed.run``), each running ``python -m codila_cli.train.align`` with the same
flags. Multi-node runs call torchrun directly with its rendezvous flags (docs/training.md)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from typing import Any


def align_args(cfg: Any) -> list[str]:
    """``cfg`` (an AlignConfig) as the ``codila train align`` flags that rebuild it."""
    out: list[str] = []
    for f in fields(cfg):
        value, flag = getattr(cfg, f.name), "--" + f.name.replace("_", "-")
        if f.name == "marginals_top_k" and cfg.marginals_cache is None:
            continue  # it applies with a cache only
        if isinstance(value, bool) or value is None:
            if f.name == "grad_checkpointing" and value is not None:
                out.append(flag if value else "--no-grad-checkpointing")
            elif value is True:
                out.append(flag)
        elif isinstance(value, tuple):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def torchrun(nproc: int, cfg: Any) -> int:
    """Run torchrun in the foreground and return its exit code (Ctrl-C reaches every child)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "codila_cli.train.align", *align_args(cfg)]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130
