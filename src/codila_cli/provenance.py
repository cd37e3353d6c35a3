"""What made a number: written beside every eval result (``provenance.json``, the summary's last line)
and every benchmark's output, so a figure on docs/results.md can name its commit, torch version,
precision and machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def _commit() -> str | None:
    """The checkout's commit (with ``+dirty`` when tracked files changed), or None outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(models: Any = None, *, command: list[str] | None = None) -> dict[str, Any]:
    """The command, codila's version and commit, Python and torch versions, the machine (CPU model,
    cores, torch threads, GPU) and, given the loaded models, where each runs and in what dtype."""
    from codila_cli import __version__

    out: dict[str, Any] = {
        "command": " ".join(command if command is not None else ["codila", *sys.argv[1:]]),
        "codila": __version__, "commit": _commit(), "python": platform.python_version(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "platform": platform.platform()},
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["machine"]["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            out["machine"]["gpu"] = torch.cuda.get_device_name(0)
    if models is not None:
        out["models"] = {role: {"name": m.name, "device": str(m.device),
                                "dtype": str(m.ckpt.dtype).removeprefix("torch.")}
                         for role, m in (("dlm", getattr(models, "dlm", None)), ("ar", getattr(models, "ar", None)))
                         if m is not None}
    return out


def provenance_line(p: dict[str, Any]) -> str:
    """One Markdown line: command, commit, torch, precision, machine."""
    models = "; ".join(f"{role} {m['name']} {m['dtype']} on {m['device']}" for role, m in p.get("models", {}).items())
    mach = p["machine"]
    return (f"Made by `{p['command']}` at commit {(p.get('commit') or 'unknown')[:12]}, codila {p['codila']}, "
            f"torch {p.get('torch', '–')}, Python {p['python']}; {models or 'no models'}; "
            f"{mach['cpu']} ({mach['cores']} cores, {mach.get('torch_threads', '?')} torch threads)"
            + (f", {mach['gpu']}" if mach.get("gpu") else "") + ".")
