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
        """``--json``'s ``models``: each model's name, directory, dtype and quantization, the DLM's family
        (models/families.py), and how the helper's tokens pair with the DLM's (``bridge``)."""
        from codila_cli.models.families import family_of

        family = family_of(self.dlm.ckpt.config)
        out = {"dlm": {"name": self.dlm.name, "path": str(self.dlm.ckpt.path),
                       "family": family.name if family is not None else None, **_runs(self.dlm.ckpt)}}
        if self.ar is not None:
            out["ar"] = {"name": self.ar.name, "path": str(self.ar.ckpt.path), **_runs(self.ar.ckpt)}
            if self.bridge is not None:  # how the helper's tokens pair with the DLM's: same ids, or same strings
                out["ar"]["bridge"] = {"by": self.bridge.by, "coverage": round(float(self.bridge.coverage), 4)}
        return out


def _runs(ckpt: Any) -> dict:
    """What a loaded checkpoint runs in: its dtype, and its weights' quantization ("none", "int8", "int4")."""
    return {"dtype": str(ckpt.dtype).removeprefix("torch."), "quantize": ckpt.quantize}


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
                also: tuple[str, ...] = (), quantize: str = "none", quantize_ar: str = "none",
                max_new_tokens: int | None = None) -> Models:
    """The DLM and (``ar``) the helper, loaded; ``also``: more DLM specs the caller loads next (the infill
    model), checked here so that every missing model is named in one error. ``quantize`` /
    ``quantize_ar``: the DLM's / the helper's weights in 8 or 4 bits (models/quantize.py).
    ``max_new_tokens``: the longest canvas the caller decodes, which the fit check sizes activations for
    (None: any, as a server)."""
    from codila_cli.models.cache import resolve_local_dirs
    from codila_cli.models.quantize import check_scheme

    check_scheme(quantize)
    check_scheme(quantize_ar, flag="--quantize-ar")
    dlm_spec = resolve_spec(dlm, kind="dlm")
    ar_spec = resolve_spec(ar, kind="ar") if ar else None
    dlm_path, ar_path, *_ = resolve_local_dirs([dlm_spec, ar_spec, *(resolve_spec(s, kind="dlm") for s in also)])
    t0 = time.perf_counter()
    from codila_cli.models.families import load_dlm
    from codila_cli.models.fit import canvas_for

    canvas = canvas_for(max_new_tokens)
    quantize, quantize_ar, why = auto_weights(dlm_path, ar_path, names=(dlm, ar), device=device, dtype=dtype,
                                              quantize=quantize, quantize_ar=quantize_ar, canvas=canvas)
    (dev, dt, note), ar_plan = (plan_load(dlm_path, name=dlm, role="dlm", device=device, dtype=dtype, quantize=quantize),
                                plan_load(ar_path, name=ar, role="ar", device=device, dtype=dtype, quantize=quantize_ar)
                                if ar_path else None)
    ar_dt = ar_plan[1] if ar_plan else None
    fits([(dlm, dlm_path, dt, quantize), *([(ar, ar_path, ar_dt, quantize_ar)] if ar_path else [])], dev,
         canvas=canvas)
    models = Models(dlm=load_dlm(dlm_path, name=dlm, device=dev, dtype=dt, quantize=quantize),
                    bundled=tuple(s.name for s in (dlm_spec, ar_spec) if s is not None and s.bundled))
    models.dlm.ckpt.dtype_note = "; ".join(w for w in (note, why[0]) if w)
    if ar_spec is not None and ar_path is not None and ar_plan is not None:
        from codila_cli.models.ar import load_ar

        models.attach_helper(load_ar(ar_path, name=ar, device=dev, dtype=ar_dt, quantize=quantize_ar))
        models.ar.ckpt.dtype_note = "; ".join(w for w in (ar_plan[2], why[1]) if w)
    if compile:  # torch.compile of the model forwards; pays on GPUs at 7B, rarely for the small CPU models
        import torch

        for m in (models.dlm.model, models.ar.model if models.ar is not None else None):
            if m is not None:
                m.forward = torch.compile(m.forward, dynamic=True)
    models.load_seconds = time.perf_counter() - t0
    return models


def auto_weights(dlm_path: Any, ar_path: Any, *, names: tuple[str, str | None], device: str, dtype: str,
                 quantize: str, quantize_ar: str, canvas: int | None = None) -> tuple[str, str, tuple[str, str]]:
    """``--quantize auto`` / ``--quantize-ar auto`` resolved: of bf16, int8 and int4 weights, those under
    which the loads fit (models/fit.py, the other model as asked, or in bf16 while it is auto too), the one
    whose products a probe of the model's shape finds fastest on this device (models/probe.py); on a GPU,
    the widest that fits (no kernel there was measured). Returns (quantize, quantize_ar, (why, why))."""
    from codila_cli.models import fit
    from codila_cli.models.loading import choose_device, read_config

    chosen, why = [quantize, quantize_ar], ["", ""]
    dev = choose_device(device)
    for i, path in enumerate((dlm_path, ar_path)):
        if chosen[i] != "auto" or path is None:
            continue
        allowed = []
        for scheme in ("none", "int8", "int4"):
            trial = [q if q != "auto" else "none" for q in chosen]
            trial[i] = scheme
            plans = [(n, p, plan_load(p, name=n, role=r, device=device, dtype=dtype, quantize=q)[1], q)
                     for n, p, r, q in zip(names, (dlm_path, ar_path), ("dlm", "ar"), trial) if p is not None]
            if fit.verdict(sized(plans, canvas=canvas, device=dev)[0], dev).fits:
                allowed.append(scheme)
        allowed = allowed or ["int4"]  # nothing fits: the smallest, which the fit check then refuses with numbers
        if dev.type != "cpu":
            chosen[i], why[i] = allowed[0], f"quantize auto: {allowed[0]} (the widest that fits)"
            continue
        from codila_cli.models.probe import fastest_weights, mlp_shape

        chosen[i], why[i] = fastest_weights(**mlp_shape(read_config(path, name=names[i] or "")), role=("dlm", "ar")[i],
                                            allowed=tuple(allowed))
    return chosen[0], chosen[1], (why[0], why[1])


def plan_load(path: Any, *, name: str | None, role: str, device: str, dtype: str,
              quantize: str) -> tuple[Any, Any, str]:
    """(torch device, torch dtype, why: "" where the dtype was named) a load runs in: ``auto`` is per model
    (models/loading.py::auto_on_cpu: bf16 on CUDA; on a CPU by the stored dtype, size and a probe of the
    model's shapes); quantized weights run their products in bf16 under ``auto`` (PyTorch's weight-only
    kernels ran 4-9× slower on fp32 activations here: docs/quantization.md)."""
    from codila_cli.models.loading import auto_on_cpu, choose_device, choose_dtype

    dev = choose_device(device)
    if dtype != "auto":
        return dev, choose_dtype(dtype, dev), ""
    if quantize != "none":
        return dev, choose_dtype("bfloat16", dev), f"{quantize} weights: products in bf16"
    if dev.type != "cpu":
        dt = choose_dtype("auto", dev)
        return dev, dt, f"auto on {dev.type}: {str(dt).removeprefix('torch.')}"
    bf16, why = auto_on_cpu(path, name=name or "", role=role)
    return dev, choose_dtype("auto", dev, bf16_on_cpu=bf16), why


def weights_plan(path: Any, *, name: str, role: str, device: str, dtype: str) -> tuple[Any, Any, float]:
    """(device, dtype, GiB of weights in memory) of an unquantized load (``codila doctor``, ``codila models
    --fit``): the dtype :func:`plan_load` decides, the one ``load_models`` runs."""
    import torch

    from codila_cli.models.loading import _stored

    dev, dt, _ = plan_load(path, name=name, role=role, device=device, dtype=dtype, quantize="none")
    stored, size = _stored(path, name=name)
    stored_bytes = getattr(torch, stored).itemsize if stored in ("float32", "bfloat16", "float16") else None
    return dev, dt, size * (dt.itemsize / stored_bytes if stored_bytes else 1.0) / 2**30


def fits(loads: list[tuple[str, Any, Any, str]], device: Any, *, canvas: int | None = None) -> None:
    """The fit check (models/fit.py) of (name, directory, torch dtype, quantization) loads on ``device``,
    decoding ``canvas`` positions (None: models/fit.py's CANVAS); the refusal names the first of bf16, int8
    and int4 weights (for the DLM) under which they fit."""
    from codila_cli.models import fit

    needs, options = sized(loads, canvas=canvas, device=device)
    fit.check(needs, device, options=options)


def sized(loads: list[tuple[str, Any, Any, str]], *, canvas: int | None = None,
          device: Any = None) -> tuple[list, dict[str, list]]:
    """(what each load needs at its dtype and quantization, {flag: what the loads need with it}) from the
    weights' headers (models/fit.py): ``--dtype bfloat16`` where a load runs in fp32, and ``--quantize
    int8`` / ``int4`` for the first load (the DLM) where it is not quantized so far; ``device``: where they
    run (quantized products off a CPU widen each weight: counted; None: a CPU)."""
    from codila_cli.models import fit
    from codila_cli.models.loading import _weight_files, engine_for, read_config

    widened = getattr(device, "type", "cpu") != "cpu"

    def need(i: int, dtype: str, quantize: str) -> Any:
        name, path, _, _ = loads[i]
        cfg = read_config(path, name=name)
        return fit.estimate(path, cfg, name=name, dtype=dtype, quantize=quantize, files=_weight_files(path, name=name),
                            canvas=canvas or fit.CANVAS, native=engine_for(path, cfg) == "native", widened=widened)

    kinds = [str(dt).removeprefix("torch.") for _, _, dt, _ in loads]
    needs = [need(i, kinds[i], q) for i, (_, _, _, q) in enumerate(loads)]
    options: dict[str, list] = {}
    if "float32" in kinds:
        options["--dtype bfloat16"] = [need(i, "bfloat16", q) if kinds[i] == "float32" else needs[i]
                                       for i, (_, _, _, q) in enumerate(loads)]
    bits = ("int8", "int4")
    for scheme in bits[bits.index(loads[0][3]) + 1 :] if loads[0][3] in bits else bits:
        dtype = kinds[0] if kinds[0] != "float32" else "bfloat16"
        options[f"--quantize {scheme}"] = [need(0, dtype, scheme), *needs[1:]]
    return needs, options
