"""What ``codila gen`` runs, from its layered settings: flag > ``CODILA_*`` environment variable (Typer
reads those into the flags) > config.toml > the AR helper's recommendation > the DLM's own
generation_config.json (models/generation.py) > built-in default. ``GenRequest.sources`` says where
each value came from (``-v`` and ``--json`` print it).

:func:`resolve_gen` picks the models and the decoder and builds every decoder's frozen config (so a bad
``--block-size`` is an error even when ``dream`` runs); nothing here loads a model or prints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from codila_cli.config import UserConfig
from codila_cli.decoding.config import GEN_KNOBS
from codila_cli.decoding.knobs import inert
from codila_cli.errors import UsageError

GEN_DEFAULTS: dict[str, Any] = GEN_KNOBS.defaults()
RUNTIME_KEYS = tuple(k.name for k in GEN_KNOBS.values() if k.section == "runtime")  # config.toml [runtime]


@dataclass(frozen=True)
class GenRequest:
    """One resolved ``codila gen``: the models to load, the decoder and its config, device and dtype."""

    decoder: str
    config: Any  # DreamConfig | ThresholdConfig | CodilaConfig
    dlm: str
    ar: str | None  # loaded only for the codila decoder
    device: str
    dtype: str
    sources: dict[str, str] = field(default_factory=dict)  # key -> flag | env | config | helper | model | default
    configs: dict[str, Any] = field(default_factory=dict)  # every decoder's config from the same layers
    helper: str | None = None  # the AR helper configured (flag, config, bundled pair), run or not
    language: Any = None  # --language (languages.Language): what the syntax report checks; None: Python
    own: str = "dream"  # the DLM's own sampler (its family row's first decoder)


class Layers:
    """Looks one key up through the layers; the helper's recommendation and the DLM's generation
    defaults are filled in once the models are known."""

    def __init__(self, flags: Mapping[str, Any], user: UserConfig, from_env: frozenset[str] | None = None) -> None:
        """``from_env``: the keys of ``flags`` whose value came from a ``CODILA_*`` variable (None: a key
        counts as one when its variable is set)."""
        self.flags, self.user, self.from_env = flags, user, from_env
        self.recommended: dict[str, Any] = {}
        self.model: dict[str, Any] = {}  # the DLM's generation_config.json

    def lookup(self, key: str) -> tuple[Any, str]:
        """(value, where it came from); (None, "default") when no layer sets it."""
        value = self.flags.get(key)
        if isinstance(value, Enum):
            value = value.value
        if value is not None:
            env = key in self.from_env if self.from_env is not None else os.environ.get("CODILA_" + key.upper()) is not None
            return value, "env" if env else "flag"
        value = self.user.get("runtime" if key in RUNTIME_KEYS else "gen", key)
        if value is not None:
            return value, "config"
        for layer, name in ((self.recommended, "helper"), (self.model, "model")):
            if layer.get(key) is not None:
                return layer[key], name
        return None, "default"

    def given(self, key: str) -> Any:
        """The first value set by a flag, the environment, the config file, the helper or the model; else None."""
        return self.lookup(key)[0]

    def __call__(self, key: str) -> Any:
        value = self.given(key)
        if value is None and self._following(key):
            return self(GEN_KNOBS[key].follows)
        return GEN_DEFAULTS.get(key) if value is None else value

    def _following(self, key: str) -> bool:
        """Unset, and the knob it follows (knobs.Knob.follows) was not set by the model: a DLM's own
        generation_config temperature is the DLM's, so the helper stays at its default."""
        target = GEN_KNOBS[key].follows if key in GEN_KNOBS else None
        return target is not None and self.lookup(target)[1] not in ("model",)

    def sources(self) -> dict[str, str]:
        return {k: (f"follows {GEN_KNOBS[k].follows}" if self.given(k) is None and self._following(k)
                    else self.lookup(k)[1]) for k in GEN_DEFAULTS}


def resolve_gen(flags: Mapping[str, Any], *, user: UserConfig, dlm: str | None, ar: str | None,
                from_env: frozenset[str] | None = None) -> GenRequest:
    """``flags`` holds the options by knob name (decoding/config.py::GEN_KNOBS; None = not given), and
    ``from_env`` those of them a ``CODILA_*`` variable gave (Layers); ``dlm`` / ``ar`` the ``--dlm`` /
    ``--ar`` flags (config ``[models]`` and the bundled pair fill them in)."""
    from codila_cli.decoding.config import SamplingConfig
    from codila_cli.engine.models import default_ar, default_dlm
    from codila_cli.helper_card import recommended_decoding

    opt = Layers(flags, user, from_env)
    dlm_name = dlm or user.get("models", "dlm") or default_dlm()
    ar_name = ar or user.get("models", "ar") or (default_ar() if dlm_name == "bundled-dlm" else None)
    chosen = opt("decoder")
    if chosen not in ("auto", *decoder_configs()):
        raise UsageError(f"invalid decoder {chosen!r} in {user.path}", hint=f"use auto, {', '.join(decoder_configs())}")
    dlm_cfg, dlm_path = dlm_config(dlm_name)  # read once: the family's own sampler, an SDAR block size
    own = own_decoder(dlm_cfg)
    if chosen == "auto":
        chosen = "codila" if ar_name else own
    if chosen == "codila" and not ar_name:
        raise UsageError("--decoder codila needs an AR helper", hint="pass --ar qwen3-0.6b (or bundled-ar)")
    if chosen == "codila":
        opt.recommended.update(recommended_decoding(ar_name, block_size=opt.given("block_size")))  # user's B, if set
        if not helper_cache(dlm_cfg):  # a helper's recommended cache is codila's approximate cache
            opt.recommended.pop("cache", None)
        _drop_inert(opt)
    opt.model.update(model_defaults(dlm_name, user_steps=opt.given("steps") is not None
                                    or opt.given("tokens_per_step") is not None,
                                    user_length=opt.given("max_new_tokens") is not None))
    try:
        sampling = SamplingConfig(temperature=opt("temperature"), top_p=opt("top_p"), top_k=opt("top_k"))
    except ValueError as exc:
        raise _where(str(exc), opt) from None
    alg_name = opt("alg")
    for key in RUNTIME_KEYS:
        if opt.lookup(key)[1] in ("env", "config") and not GEN_KNOBS[key].in_range(opt(key)):
            raise _where(f"invalid {key} {opt(key)!r}", opt)
    try:
        configs = _configs(opt, chosen, sampling, alg_name, _trained_block(dlm_cfg, dlm_path))
    except ValueError as exc:  # a flag only another decoder reads may be the cause: say that first
        raise _flag_of_another_decoder(chosen, opt.sources(), helper=ar_name, own=own) or _where(str(exc), opt) from None
    if chosen == "dream" and opt("cache") != "none":
        raise UsageError("--cache needs a block decoder", hint="use --decoder threshold or --decoder codila")
    if chosen == "llada" and (problem := configs["llada"].tiling_problem()) is not None:
        raise UsageError(problem, hint="e.g. --max-new-tokens 128 --block-length 32 (and --steps a multiple of "
                                       "the blocks), as LLaDA's own generate requires")
    return GenRequest(decoder=chosen, config=configs[chosen], dlm=dlm_name, ar=ar_name if chosen == "codila" else None,
                      device=opt("device"), dtype=opt("dtype"), sources=opt.sources(), configs=configs,
                      helper=ar_name, own=own)


def _drop_inert(opt: Layers) -> None:
    """Drop what the helper recommends that means nothing or cannot run under the other settings (a
    cache window without a cache, a cache under --ar-verify), until nothing more drops: a cache dropped
    takes its window with it."""
    conditions = {k.inert_when[0] for k in GEN_KNOBS.values() if k.inert_when}
    while gone := [n for n in inert(GEN_KNOBS, {c: opt(c) for c in conditions}) if n in opt.recommended]:
        for name in gone:
            opt.recommended.pop(name)


def unread_flag(req: GenRequest) -> UsageError | None:
    """A flag for a knob that another decoder reads and the one that runs does not (``-B`` when dream
    runs because no helper is configured): for ``codila gen`` it would change nothing, so it is an error
    that says which decoder reads it; so is ``--alg origin`` when codila runs (codila has only the
    confidence rules). A ``CODILA_*`` variable or config.toml value is a standing preference and may hold
    settings of every decoder (a server runs another decoder per request)."""
    if req.decoder == "codila" and req.sources.get("alg") == "flag" and req.configs["dream"].alg == "origin":
        return UsageError("--alg origin is a rule of the dream decoder, and codila runs (it reveals by confidence)",
                          hint="add --decoder dream, or use --alg entropy, maskgit_plus or topk_margin")
    return _flag_of_another_decoder(req.decoder, req.sources, helper=req.helper, own=req.own)


def _flag_of_another_decoder(decoder: str, sources: Mapping[str, str], *, helper: str | None,
                              own: str = "dream") -> UsageError | None:
    """The first flag (by ``sources``) that only decoders other than ``decoder`` read, as an error; the hint
    names the DLM's ``own`` sampler when it reads the flag."""
    from codila_cli.decoding.knobs import knob_fields

    reads = {name: set(knob_fields(cls)) for name, cls in decoder_configs().items()}
    for knob in GEN_KNOBS.values():
        readers = [d for d in reads if knob.name in reads[d]]
        if sources.get(knob.name) == "flag" and readers and decoder not in readers:
            need = "" if helper or readers != ["codila"] else " --ar … (codila needs an AR helper)"
            named = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} and {readers[-1]}"
            return UsageError(f"{knob.option} is a setting of the {named} decoder"
                              f"{'s' if len(readers) > 1 else ''}, and {decoder} runs",
                              hint=f"add --decoder {own if own in readers else ([d for d in readers if d != 'llada'] or readers)[-1]}{need}, "
                                   f"or drop {knob.option}")
    return None


def _where(message: str, opt: Layers) -> UsageError:
    """A config error that names where a value came from when no flag gave it (CODILA_*, config.toml)."""
    for key in GEN_DEFAULTS:
        where = opt.lookup(key)[1]
        if where in ("env", "config") and (key.replace("_", "-") in message or f"invalid {key} " in message):
            section = "runtime" if key in RUNTIME_KEYS else "gen"
            origin = f"CODILA_{key.upper()}" if where == "env" else f"{key} in [{section}] of {opt.user.path}"
            return UsageError(f"{message} (the value comes from {origin})",
                              hint="fix or unset CODILA_" + key.upper() if where == "env" else "fix the value in the config file")
    return UsageError(message, hint="see `codila gen --help` for the allowed values")


def _configs(opt: Layers, chosen: str, sampling: Any, alg_name: str, dlm_block: int | None = None) -> dict[str, Any]:
    """Every decoder's config, each knob read through the layers (``knobs.build``), so a bad value is an
    error whichever decoder runs. The few rules between knobs: the sampling config is shared; a knob
    the table marks ``follows`` takes its target's value (Layers); CoDiLA has no ``origin`` rule; a
    cache (which the helper may recommend) applies to CoDiLA only when it runs."""
    from codila_cli.decoding.block import BlockConfig
    from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig
    from codila_cli.decoding.knobs import build
    from codila_cli.decoding.llada import LladaConfig

    fixed = {k for k, v in opt.sources().items() if v != "default"}

    shared = {"sampling": sampling, "stop": tuple(opt("stop") or ())}
    # CoDiLA's config when another decoder runs: no cache, and what means nothing without one unset
    idle = {} if chosen == "codila" else {"cache": "none", **dict.fromkeys(inert(GEN_KNOBS, {"cache": "none"}))}
    return {
        "dream": build(DreamConfig, opt, alg=alg_name, **shared),
        "threshold": build(ThresholdConfig, opt, **shared),
        "codila": build(CodilaConfig, opt, alg=alg_name if alg_name != "origin" else "entropy", **idle, **shared),
        "llada": build(LladaConfig, opt, **shared).fitted(fixed),
        "block": build(BlockConfig, opt, **shared).fitted(fixed, dlm_block),
    }


def decoder_configs() -> dict[str, type]:
    """Each decoder's config class (what it reads: knobs.knob_fields): decoding/registry.py's."""
    from codila_cli.decoding.registry import decoder_configs as configs

    return configs()


def _trained_block(cfg: dict, path: Any) -> int | None:
    """A block-diffusion DLM's trained block size (its family row's, models/families.py; ``cfg`` its
    config.json), None for any other model."""
    from codila_cli.models.families import family_of

    family = family_of(cfg)
    return family.block_of(cfg, path) if family is not None else None


def dlm_config(dlm: str) -> tuple[dict, Any]:
    """The DLM's config.json and directory; ({}, None) when the name cannot be resolved here (loading then
    says why)."""
    from codila_cli.errors import CodilaError
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.loading import read_config
    from codila_cli.models.registry import resolve_spec

    try:
        path = resolve_local_dir(resolve_spec(dlm, kind="dlm"))
        return read_config(path, name=dlm), path
    except CodilaError:
        return {}, None


def helper_cache(cfg: dict) -> bool:
    """Whether CoDiLA's approximate KV cache runs the DLM with config.json ``cfg`` (its family row says; a
    config that could not be read keeps the helper's recommendation, and loading then says why)."""
    from codila_cli.models.families import family_of

    family = family_of(cfg)
    return family is None or family.helper_cache


def own_decoder(cfg: dict) -> str:
    """The sampler of the family of a DLM with config.json ``cfg`` (its row's first decoder,
    models/families.py), else dream (also for a config that could not be read)."""
    from codila_cli.models.families import family_of

    family = family_of(cfg)
    return family.decoders[0] if family is not None else "dream"


def model_defaults(dlm: str, *, user_steps: bool, user_length: bool) -> dict[str, Any]:
    """The DLM's generation_config defaults that apply: its ``steps`` only together with its own
    ``max_new_tokens`` (their ratio is the model's choice) and never under a user's --steps or -K."""
    from codila_cli.models.generation import dlm_generation_defaults

    out = dlm_generation_defaults(dlm)
    if user_steps or user_length or "max_new_tokens" not in out:
        out.pop("steps", None)
    return out
