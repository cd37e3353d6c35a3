"""The loaded model pair (and infill model): resolution before torch is imported, so a missing model
fails in milliseconds with exit code 3; then one load onto the chosen device and dtype."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from codila_cli.errors import ModelNotFoundError
from codila_cli.models.registry import bundled_available, resolve_spec


@dataclass
class Models:
    dlm: Any
    ar: Any | None = None
    bridge: Any | None = None
    load_seconds: float = 0.0
    bundled: tuple[str, ...] = ()  # the bundled aliases among the loaded models (demonstration-size)
    threads_note: str | None = None  # why the asked --threads will run slowly here (engine/threads.py)

    def attach_helper(self, ar: Any) -> None:
        """Use the loaded helper ``ar`` with this DLM, and the vocabulary bridge between them: equal ids
        (models/tokens.py::VocabBridge), else equal token strings (models/token_map.py::TokenMap)."""
        from codila_cli.models.token_map import bridge_between

        self.ar = ar
        self.bridge = bridge_between(
            dlm_tokenizer=self.dlm.tokenizer, ar_tokenizer=ar.tokenizer, dlm_specials=self.dlm.specials,
            ar_specials=ar.specials, dlm_vocab_rows=self.dlm.vocab_rows, ar_vocab_rows=ar.vocab_rows,
            dlm_name=self.dlm.name, ar_name=ar.name)

    def describe(self) -> dict:
        """``--json``'s ``models``: each model's name and directory, and the DLM's family (models/families.py)."""
        from codila_cli.models.families import family_of

        family = family_of(self.dlm.ckpt.config)
        out = {"dlm": {"name": self.dlm.name, "path": str(self.dlm.ckpt.path),
                       "family": family.name if family is not None else None}}
        if self.ar is not None:
            out["ar"] = {"name": self.ar.name, "path": str(self.ar.ckpt.path)}
        return out


def default_dlm() -> str:
    if bundled_available("bundled-dlm"):
        return "bundled-dlm"
    raise ModelNotFoundError(
        "no DLM given and the bundled model is not installed in this package",
        hint="pass --dlm (an alias, repo id or directory), or set CODILA_MODEL",
    )


def default_ar() -> str | None:
    return "bundled-ar" if bundled_available("bundled-ar") else None


def default_infill_dlm() -> str:
    for name in ("bundled-infill", "bundled-dlm"):
        if bundled_available(name):
            return name
    raise ModelNotFoundError("no infill model given and no bundled model is installed",
                             hint="pass --dlm dreamon (DreamOn-v0-7B in the HF cache) or a local directory")


def load_models(*, dlm: str, ar: str | None, device: str = "auto", dtype: str = "auto", compile: bool = False,
                also: tuple[str, ...] = ()) -> Models:
    """The DLM and (``ar``) the helper, loaded; ``also``: more DLM specs the caller loads next (the infill
    model), checked here so that every missing model is named in one error."""
    from codila_cli.models.cache import resolve_local_dirs

    dlm_spec = resolve_spec(dlm, kind="dlm")
    ar_spec = resolve_spec(ar, kind="ar") if ar else None
    dlm_path, ar_path, *_ = resolve_local_dirs([dlm_spec, ar_spec, *(resolve_spec(s, kind="dlm") for s in also)])
    t0 = time.perf_counter()
    from codila_cli.models.families import load_dlm
    from codila_cli.models.loading import bf16_on_cpu, choose_device, choose_dtype

    dev = choose_device(device)
    dt = choose_dtype(dtype, dev, bf16_on_cpu=bf16_on_cpu(dlm_path, name=dlm, role="dlm"))  # "auto" is per model
    ar_dt = choose_dtype(dtype, dev, bf16_on_cpu=bf16_on_cpu(ar_path, name=ar, role="ar")) if ar_path else None
    fits([(dlm, dlm_path, dt), *([(ar, ar_path, ar_dt)] if ar_path else [])], dev)  # before any weight is read
    models = Models(dlm=load_dlm(dlm_path, name=dlm, device=dev, dtype=dt),
                    bundled=tuple(s.name for s in (dlm_spec, ar_spec) if s is not None and s.bundled))
    if ar_spec is not None and ar_path is not None:
        from codila_cli.models.ar import load_ar

        models.attach_helper(load_ar(ar_path, name=ar, device=dev, dtype=ar_dt))
    if compile:  # torch.compile of the model forwards; pays on GPUs at 7B, rarely for the small CPU models
        import torch

        for m in (models.dlm.model, models.ar.model if models.ar is not None else None):
            if m is not None:
                m.forward = torch.compile(m.forward, dynamic=True)
    models.load_seconds = time.perf_counter() - t0
    return models


def fits(loads: list[tuple[str, Any, Any]], device: Any) -> None:
    """The fit check (models/fit.py) of (name, directory, torch dtype) loads on ``device``; a model in fp32
    is also sized in bf16, which the refusal names when that would fit."""
    from codila_cli.models import fit

    needs, bf16 = sized(loads)
    fit.check(needs, device, alternative=bf16 if bf16 != needs else None)


def sized(loads: list[tuple[str, Any, Any]]) -> tuple[list, list]:
    """(what each load needs at its dtype, and in bf16) from the weights' headers (models/fit.py)."""
    from codila_cli.models import fit
    from codila_cli.models.loading import _weight_files, read_config

    needs, bf16 = [], []
    for name, path, dt in loads:
        cfg, files = read_config(path, name=name), _weight_files(path, name=name)
        kind = str(dt).removeprefix("torch.")
        needs.append(fit.estimate(path, cfg, name=name, dtype=kind, files=files))
        bf16.append(fit.estimate(path, cfg, name=name, dtype="bfloat16", files=files) if kind == "float32" else needs[-1])
    return needs, bf16
