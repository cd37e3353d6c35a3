"""One generation run: resolve and load models once, encode the prompt, decode, report.

The CLI calls :func:`load_models` and :func:`generate`; nothing here prints. Model resolution happens
before torch is imported, so a missing model fails in milliseconds with exit code 3.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.errors import ModelNotFoundError, UsageError
from codila_cli.models.registry import bundled_available, resolve_spec
from codila_cli.models.tokens import encode_text

DECODERS = ("dream", "threshold", "codila")
SCHEMA_VERSION = 1


@dataclass
class Models:
    dlm: Any
    ar: Any | None = None
    bridge: Any | None = None
    load_seconds: float = 0.0
    bundled: tuple[str, ...] = ()  # the bundled aliases among the loaded models (demonstration-size)

    def describe(self) -> dict:
        out = {"dlm": {"name": self.dlm.name, "path": str(self.dlm.ckpt.path)}}
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


RECOMMENDABLE: dict[str, type] = {"block_size": int, "candidate_blocks": int, "ar_context": int,
                                  "ar_repetition_penalty": float, "cache": str, "cache_blocks": int,
                                  "ar_syntax_guard": bool, "ar_no_repeat_ngram": int, "conditioning": str}


def recommendable(key: str, value: object) -> bool:
    """A setting a helper checkpoint may recommend, with a value of its type (an int counts as a float;
    ``cache`` is one of decoding.config.CACHES, ``conditioning`` "soft" or "topk:K") and in range (no
    negative number)."""
    import re

    from codila_cli.decoding.config import CACHES

    kind = RECOMMENDABLE.get(key)
    if key == "conditioning":
        return isinstance(value, str) and bool(re.fullmatch(r"soft|topk:[1-9][0-9]*", value))
    if kind is str:
        return value in CACHES
    if kind is bool:
        return type(value) is bool
    ok = type(value) is int if kind is int else kind is float and type(value) in (int, float)
    return ok and value >= 0


def recommendable_per_block_size(value: object) -> bool:
    """A ``by_block_size`` table a helper may recommend: {"8": {KEY: value, …}, …}, block sizes as positive
    integers, each table of recommendable settings other than ``block_size``."""
    return isinstance(value, dict) and bool(value) and all(
        str(b).isdigit() and int(b) > 0 and isinstance(one, dict) and "block_size" not in one
        and all(recommendable(k, v) for k, v in one.items()) for b, one in value.items())


def recommended_decoding(ar: str, *, block_size: int | None = None) -> dict[str, int | float | str]:
    """CoDiLA settings an AR helper checkpoint recommends: ``codila_decoding`` in its config.json (the way
    a generation_config.json carries a model's sampling defaults); {} when it has none. Only the keys in
    RECOMMENDABLE with values of their type count (an int is accepted for a float); flags, environment
    variables and the user's config file override them. ``cache`` (none / prefix / dual) is recommended
    where it was measured to keep quality on that pair (the bundled one: docs/results.md §2, session 11);
    ``cache_blocks`` applies only when a cache is on.

    ``by_block_size`` {"8": {...}} holds settings chosen for one block size: they replace the general
    ones when the block size is ``block_size`` (the user's), or else the recommended or default one."""
    import json

    from codila_cli.errors import CodilaError
    from codila_cli.models.cache import resolve_local_dir

    try:
        cfg = json.loads((resolve_local_dir(resolve_spec(ar, kind="ar")) / "config.json").read_text(encoding="utf-8"))
    except (CodilaError, OSError, ValueError):  # loading reports a missing or broken checkpoint itself
        return {}
    rec = cfg.get("codila_decoding") if isinstance(cfg, dict) else None
    if not isinstance(rec, dict):
        return {}
    out = {k: RECOMMENDABLE[k](v) for k, v in rec.items() if recommendable(k, v)}
    if block_size is None:  # the library default, as `codila gen` uses it (resolve.GEN_DEFAULTS)
        from codila_cli.decoding.config import CodilaConfig

        block_size = out.get("block_size", CodilaConfig.__dataclass_fields__["block_size"].default)
    per = rec.get("by_block_size")
    one = per.get(str(block_size)) if isinstance(per, dict) else None
    if isinstance(one, dict):
        out.update({k: RECOMMENDABLE[k](v) for k, v in one.items() if k != "block_size" and recommendable(k, v)})
    return out


def load_models(*, dlm: str, ar: str | None, device: str = "auto", dtype: str = "auto", compile: bool = False) -> Models:
    from codila_cli.models.cache import resolve_local_dir

    dlm_spec = resolve_spec(dlm, kind="dlm")
    dlm_path = resolve_local_dir(dlm_spec)
    ar_spec = resolve_spec(ar, kind="ar") if ar else None
    ar_path = resolve_local_dir(ar_spec) if ar_spec else None
    t0 = time.perf_counter()
    from codila_cli.models.dream import load_dlm
    from codila_cli.models.loading import bf16_on_cpu, choose_device, choose_dtype

    dev = choose_device(device)
    dt = choose_dtype(dtype, dev, bf16_on_cpu=bf16_on_cpu(dlm_path, name=dlm, role="dlm"))  # "auto" is per model
    models = Models(dlm=load_dlm(dlm_path, name=dlm, device=dev, dtype=dt),
                    bundled=tuple(s.name for s in (dlm_spec, ar_spec) if s is not None and s.bundled))
    if ar_spec is not None and ar_path is not None:
        from codila_cli.models.ar import load_ar
        from codila_cli.models.tokens import VocabBridge

        ar_dt = choose_dtype(dtype, dev, bf16_on_cpu=bf16_on_cpu(ar_path, name=ar, role="ar"))
        models.ar = load_ar(ar_path, name=ar, device=dev, dtype=ar_dt)
        models.bridge = VocabBridge(
            dlm_tokenizer=models.dlm.tokenizer, ar_tokenizer=models.ar.tokenizer,
            dlm_specials=models.dlm.specials, ar_specials=models.ar.specials,
            dlm_vocab_rows=models.dlm.vocab_rows, ar_vocab_rows=models.ar.vocab_rows, dlm_name=dlm, ar_name=ar)
    if compile:  # torch.compile of the model forwards; pays on GPUs at 7B, rarely for the small CPU models
        import torch

        for m in (models.dlm.model, models.ar.model if models.ar is not None else None):
            if m is not None:
                m.forward = torch.compile(m.forward, dynamic=True)
    models.load_seconds = time.perf_counter() - t0
    return models


def is_chat(tokenizer: Any) -> bool:
    """A chat model (its tokenizer has a chat template): prompts go through the template and the code is
    extracted from the answer; otherwise raw completion."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer: Any, specials: Any, prompt: str, *, system: str | None = None) -> tuple[list[int], str]:
    """(ids, mode). mode "chat" when the tokenizer has a chat template, else "raw" (bos + text)."""
    if is_chat(tokenizer):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        try:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # noqa: BLE001 - a checkpoint's template (Jinja) is not codila's code
            from codila_cli.errors import ModelLoadError

            raise ModelLoadError(f"the model's chat template failed: {type(exc).__name__}: {str(exc)[:200]}",
                                 hint="the checkpoint's chat_template (tokenizer_config.json or chat_template.jinja) "
                                      "is broken: fix it, or use a checkpoint without one") from None
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids], "chat"
    text = (system + "\n\n" + prompt) if system else prompt
    ids = encode_text(tokenizer, text)  # a prompt's "<|endoftext|>" is text, not the end of the input
    return ([specials.bos] if specials.bos is not None else []) + list(ids), "raw"


def decode_text(tokenizer: Any, specials: Any, canvas: list[int]) -> str:
    """Text of the canvas up to the first stop token (special tokens dropped)."""
    stops = set(specials.stop_ids)
    cut = next((i for i, t in enumerate(canvas) if t in stops), len(canvas))
    ids = [t for t in canvas[:cut] if t != specials.mask]
    return tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class GenerationResult:
    text: str  # the payload printed on stdout
    completion: str  # raw model text (before code extraction)
    mode: str
    seed: int
    decoder: str
    settings: dict
    metrics: dict
    syntax: Any
    prompt_tokens: int
    events: list = field(default_factory=list, repr=False)

    def to_json(self, *, models: dict) -> dict:
        return {"schema_version": SCHEMA_VERSION, "command": "gen", "text": self.text, "completion": self.completion,
                "models": models, "seed": self.seed, "decoder": self.decoder, "mode": self.mode,
                "settings": self.settings, "syntax": self.syntax.to_dict(),
                "metrics": {**self.metrics, "prompt_tokens": self.prompt_tokens}}


def _prepare(models: Models, prompt: str, config: Any, system: str | None) -> tuple[list[int], str]:
    if not prompt.strip():
        raise UsageError("the prompt is empty", hint='give a prompt: codila gen "def fib(n):"')
    ids, mode = encode_prompt(models.dlm.tokenizer, models.dlm.specials, prompt, system=system)
    problem = _overflow(models, len(ids), config)
    if problem:
        room = models.dlm.context_length - len(ids)  # the largest canvas this prompt leaves
        fit = models.dlm.context_length - config.max_new_tokens  # the longest prompt this canvas leaves
        shorten = f"shorten the prompt to {fit} tokens or less" if fit > 0 else "shorten the prompt"
        raise UsageError(problem, hint=f"lower --max-new-tokens to {room} or less, or {shorten}" if room > 0
                         else f"{shorten} (the model's context is {models.dlm.context_length} tokens)")
    return ids, mode


def _overflow(models: Models, prompt_tokens: int, config: Any) -> str | None:
    need = prompt_tokens + config.max_new_tokens
    if need <= models.dlm.context_length:
        return None
    return (f"the prompt is {prompt_tokens} tokens; with --max-new-tokens {config.max_new_tokens} that is {need}, "
            f"more than the model's context of {models.dlm.context_length} tokens")


def context_overflow(models: Models, prompt: str, *, config: Any, system: str | None = None) -> str | None:
    """Why ``prompt`` plus a canvas of ``config.max_new_tokens`` does not fit the DLM's context (the
    message ``generate`` would raise), or None when it fits."""
    ids, _ = encode_prompt(models.dlm.tokenizer, models.dlm.specials, prompt, system=system)
    return _overflow(models, len(ids), config)


def text_end_ids(dlm: Any, ar: Any) -> tuple[int, ...]:
    """The ids that end the text in a CoDiLA decode: the DLM's stop ids and the helper's (either ends it)."""
    base = getattr(ar, "_ar", ar)  # a RowAR view (decoding/batch.py): its helper's
    return tuple(sorted(set(dlm.specials.stop_ids) | set(getattr(getattr(base, "specials", None), "stop_ids", ()))))


def syntax_guard(ar: Any, *, end_ids: tuple[int, ...] = (), stops: tuple[str, ...] = ()) -> Any:
    """The helper's SyntaxGuard (decoding/syntax_guard.py), built once per loaded helper, set of
    end-of-text ids (``text_end_ids``) and stop lines (rule 12)."""
    from codila_cli.decoding.syntax_guard import SyntaxGuard

    base = getattr(ar, "_ar", ar)  # a RowAR view (decoding/batch.py) shares its helper's guard
    guards = base.__dict__.setdefault("_syntax_guards", {})
    ends = tuple(end_ids)
    key = (ends, tuple(stops))
    if key not in guards:
        if len(guards) > 8:  # a user's own --stop lines make new guards; keep a few
            guards.clear()
        guards[key] = SyntaxGuard(base.tokenizer, base.vocab_rows, end_ids=ends, stops=tuple(stops))
    return guards[key]


def _decode(models: Models, dlm: Any, ar: Any, ids: list[int], *, decoder: str, config: Any, gen: Any,
            on_step: OnStep, raw: bool = True) -> Any:
    """Run one sampler on one sequence; ``dlm``/``ar`` may be per-row views of the loaded models; ``raw``:
    a raw completion prompt (a chat answer is not code from its first token, so it gets no syntax guard)."""
    if decoder == "dream":
        from codila_cli.decoding.dream import decode_dream

        return decode_dream(dlm, ids, config=config, generator=gen, on_step=on_step)
    if decoder == "threshold":
        from codila_cli.decoding.threshold import decode_threshold

        return decode_threshold(dlm, ids, config=config, generator=gen, on_step=on_step)
    if decoder == "codila":
        from codila_cli.decoding.codila import decode_codila
        from codila_cli.decoding.soft_ar import SoftBlockWriter

        if ar is None:
            raise UsageError("--decoder codila needs an AR helper", hint="pass --ar qwen3-0.6b (or bundled-ar)")
        ends = text_end_ids(dlm, ar)
        guard = (syntax_guard(ar, end_ids=ends, stops=tuple(config.stop or ()))
                 if config.ar_syntax_guard and raw else None)
        writer = SoftBlockWriter(ar, models.bridge, temperature=config.ar_temperature, topk=config.topk,
                                 repetition_penalty=config.ar_repetition_penalty, guard=guard,
                                 no_repeat_ngram=config.ar_no_repeat_ngram, end_ids=ends)
        return decode_codila(dlm, writer, ids, config=config, generator=gen, on_step=on_step)
    raise UsageError(f"unknown decoder {decoder!r}", hint=f"use one of {', '.join(DECODERS)}")


def _result(models: Models, prompt: str, mode: str, ids: list[int], res: Any, *, decoder: str, config: Any,
            seed: int, recorder: Any, wall: float) -> GenerationResult:
    from codila_cli.decoding.stops import ends_line, stop_offset
    from codila_cli.syntax import check_python, extract_code

    dlm = models.dlm
    completion = decode_text(dlm.tokenizer, dlm.specials, res.canvas)
    stops = getattr(config, "stop", ())
    cut = stop_offset(completion, stops, at_line_start=ends_line(dlm.tokenizer, ids)) if stops else None
    if cut is not None:  # a --stop line: the output ends before it
        stop_line = next(p for p in stops if completion.startswith(p, cut))
        completion = completion[:cut]
    else:
        stop_line = None
    text = extract_code(completion) if mode == "chat" else prompt + completion
    if text and not text.endswith("\n"):
        text += "\n"
    metrics = recorder.finish(wall_seconds=wall, dlm_forwards=res.dlm_forwards, ar_forwards=res.ar_forwards)
    stop_ids = set(dlm.specials.stop_ids)
    ended = cut is not None or any(t in stop_ids for t in res.canvas)  # else the canvas ran out
    extra = {"stopped_early": res.stopped_early, "ended": ended, "stop_line": stop_line,
             "load_seconds": round(models.load_seconds, 3)}
    return GenerationResult(text=text, completion=completion, mode=mode, seed=seed, decoder=decoder,
                            settings=asdict(config), metrics={**metrics.to_dict(), **extra},
                            syntax=check_python(text), prompt_tokens=len(ids), events=recorder.events)


def generate(models: Models, prompt: str, *, decoder: str, config: DreamConfig | ThresholdConfig | CodilaConfig,
             seed: int | None = None, system: str | None = None, on_step: OnStep = no_op) -> GenerationResult:
    import torch

    from codila_cli.decoding.metrics import MetricsRecorder

    ids, mode = _prepare(models, prompt, config, system)
    dlm = models.dlm
    seed = secrets.randbelow(2**31) if seed is None else seed
    torch.manual_seed(seed)
    gen = torch.Generator(device=dlm.device).manual_seed(seed)
    recorder = MetricsRecorder()

    def tee(event):
        recorder(event)
        on_step(event)

    t0 = time.perf_counter()
    res = _decode(models, dlm, models.ar, ids, decoder=decoder, config=config, gen=gen, on_step=tee, raw=mode == "raw")
    return _result(models, prompt, mode, ids, res, decoder=decoder, config=config, seed=seed, recorder=recorder,
                   wall=time.perf_counter() - t0)


@dataclass
class BatchOutcome:
    results: list[GenerationResult]
    batched_forwards: int  # DLM forwards the hardware ran (shared by the rows when batched)
    wall_seconds: float
    batched: bool = True  # False: the rows were decoded one after another (batching_pays)

    @classmethod
    def one_after_another(cls, results: list[GenerationResult], wall_seconds: float) -> "BatchOutcome":
        """Rows decoded in turn: the hardware ran every row's forwards."""
        return cls(results, sum(r.metrics["dlm_forwards"] for r in results), wall_seconds, batched=False)

    def summary(self) -> dict:
        tokens = sum(r.metrics.get("tokens", 0) for r in self.results)
        return {"rows": len(self.results), "batched": self.batched, "batched_dlm_forwards": self.batched_forwards,
                "row_dlm_forwards": sum(r.metrics.get("dlm_forwards", 0) for r in self.results),
                "tokens": tokens, "wall_seconds": round(self.wall_seconds, 4),
                "tokens_per_second": round(tokens / self.wall_seconds, 2) if self.wall_seconds > 0 else 0.0}


def batching_pays(models: Models, config: Any = None) -> bool:
    """Whether decoding rows together beats decoding them one after another on the models' device: on
    a GPU one forward serves N rows for about the price of one; on a CPU a forward of N rows costs about
    N forwards, and the batch runs as long as its longest row (gen -n 2–4 on the bundled pair: 0.74–0.92×
    the speed of one after another, docs/results.md §2, session 10). A decoder ``config`` with a KV cache
    on never batches: every cached call runs per row (decoding/batch.py), so a batch shares nothing."""
    return shares_forwards(config) and getattr(models.dlm.device, "type", str(models.dlm.device)) != "cpu"


def shares_forwards(config: Any) -> bool:
    """Whether rows decoded with ``config`` can share DLM forwards in a batch: not with a KV cache, whose
    every call runs per row (decoding/batch.py)."""
    return getattr(config, "cache", "none") == "none"


def generate_many(models: Models, prompts: list[str], *, decoder: str, config: Any, seeds: list[int],
                  system: str | None = None, on_step: OnStep = no_op, batched: bool = True) -> BatchOutcome:
    """Decode several prompts (or one prompt several times) together: one DLM forward per step serves
    every row (decoding/batch.py). Row i uses ``seeds[i]`` and gives exactly what ``generate`` gives with
    that seed. ``on_step`` receives row 0's events (the live view follows one row). ``batched`` False, or
    a config whose rows share no forward (:func:`shares_forwards`), decodes the rows one after another
    instead (the same results; see :func:`batching_pays`)."""
    import torch

    from codila_cli.decoding.batch import RowAR, run_batched
    from codila_cli.decoding.metrics import MetricsRecorder

    if len(prompts) != len(seeds) or not prompts:
        raise ValueError("generate_many needs one seed per prompt and at least one prompt")
    if not (batched and shares_forwards(config)):
        t0 = time.perf_counter()
        results = [generate(models, p, decoder=decoder, config=config, seed=s, system=system,
                            on_step=on_step if i == 0 else no_op) for i, (p, s) in enumerate(zip(prompts, seeds))]
        return BatchOutcome.one_after_another(results, time.perf_counter() - t0)
    prepared = [_prepare(models, p, config, system) for p in prompts]
    dlm = models.dlm
    recorders = [MetricsRecorder() for _ in prompts]
    walls = [0.0] * len(prompts)

    def row(r: int, row_dlm: Any) -> Any:
        gen = torch.Generator(device=dlm.device).manual_seed(seeds[r])
        rec = recorders[r]

        def tee(event):
            rec(event)
            if r == 0:
                on_step(event)

        t = time.perf_counter()
        ar = RowAR(models.ar) if models.ar is not None else None
        out = _decode(models, row_dlm, ar, prepared[r][0], decoder=decoder, config=config, gen=gen, on_step=tee,
                      raw=prepared[r][1] == "raw")
        walls[r] = time.perf_counter() - t
        return out

    t0 = time.perf_counter()
    outs, batcher = run_batched(dlm, len(prompts), row)
    wall = time.perf_counter() - t0
    results = [_result(models, p, mode, ids, res, decoder=decoder, config=config, seed=s, recorder=rec, wall=w)
               for p, (ids, mode), res, s, rec, w in zip(prompts, prepared, outs, seeds, recorders, walls)]
    return BatchOutcome(results, batcher.batched_forwards, wall)


@dataclass
class InfillOutcome:
    middle: str  # indented to fit, ends with a newline unless empty
    new_text: str
    seed: int
    metrics: dict
    syntax_before: Any
    syntax_after: Any
    context_cut: dict

    @property
    def introduced_errors(self) -> bool:
        return self.syntax_before.valid and not self.syntax_after.valid


def default_infill_dlm() -> str:
    for name in ("bundled-infill", "bundled-dlm"):
        if bundled_available(name):
            return name
    raise ModelNotFoundError("no infill model given and no bundled model is installed",
                             hint="pass --dlm dreamon (DreamOn-v0-7B in the HF cache) or a local directory")


def infill_tokens(models: Models, prefix: str, suffix: str, *, config: Any, seed: int | None = None,
                  on_step: OnStep = no_op) -> tuple[Any, dict, int]:
    """DreamOn (or CoDiLA) decoding of the middle between two texts; returns (InfillResult, context cut, seed).

    Prefix and suffix are cut to the model's context around the fill point (2/3 of the room for the prefix).
    """
    import torch

    from codila_cli.decoding.dreamon import decode_dreamon

    dlm = models.dlm
    tok = dlm.tokenizer
    p_ids, s_ids = encode_text(tok, prefix), encode_text(tok, suffix)
    room = dlm.context_length - config.max_middle_tokens - 2
    if room < 16:
        raise UsageError(f"--max-middle-tokens {config.max_middle_tokens} leaves no room for context "
                         f"(the model's context is {dlm.context_length} tokens)", hint="lower --max-middle-tokens")
    cut = {"prefix_tokens": len(p_ids), "suffix_tokens": len(s_ids), "prefix_kept": len(p_ids), "suffix_kept": len(s_ids)}
    if len(p_ids) + len(s_ids) > room:
        keep_s = min(len(s_ids), max(room // 3, room - len(p_ids)))
        keep_p = room - keep_s
        p_ids, s_ids = p_ids[len(p_ids) - keep_p :], s_ids[:keep_s]
        cut.update(prefix_kept=len(p_ids), suffix_kept=len(s_ids))
    seed = secrets.randbelow(2**31) if seed is None else seed
    torch.manual_seed(seed)
    gen = torch.Generator(device=dlm.device).manual_seed(seed)
    writer = None
    if config.tau is not None:
        if models.ar is None:
            raise UsageError("--tau (CoDiLA infill) needs an AR helper", hint="pass --ar, or drop --tau")
        from codila_cli.decoding.soft_ar import SoftBlockWriter

        # the helper samples at the same temperature as DreamOn's own steps (greedy at 0)
        writer = SoftBlockWriter(models.ar, models.bridge, temperature=config.sampling.temperature)
    res = decode_dreamon(dlm, prefix_ids=p_ids, suffix_ids=s_ids, config=config, writer=writer, generator=gen,
                         on_step=on_step)
    return res, cut, seed


def infill(models: Models, src: Any, region: Any, *, config: Any, seed: int | None = None,
           instruction: str | None = None, on_step: OnStep = no_op) -> InfillOutcome:
    """Fill ``region`` of ``src`` (infill_files.Source) with DreamOn decoding (CoDiLA when config.tau)."""
    from codila_cli.infill_files import patch, place_middle, split
    from codila_cli.syntax import check_python

    prefix, suffix = split(src, region)
    view_prefix = (f"# Instruction: {instruction.strip()}\n" if instruction else "") + prefix
    res, cut, seed = infill_tokens(models, view_prefix, suffix, config=config, seed=seed, on_step=on_step)
    tok = models.dlm.tokenizer
    middle = place_middle(src, region, tok.decode(res.middle, skip_special_tokens=True))
    new_text = patch(src, region, middle)
    metrics = {"dlm_forwards": res.dlm_forwards, "ar_forwards": res.ar_forwards, "steps": res.steps,
               "middle_tokens": len(res.middle), "expansions": res.expansions, "deletions": res.deletions,
               "tokens_per_step": (len(res.middle) + res.deletions + res.expansions) / res.dlm_forwards
               if res.dlm_forwards else 0.0, "wall_seconds": res.seconds, "truncated": res.truncated,
               "load_seconds": round(models.load_seconds, 3)}
    return InfillOutcome(middle, new_text, seed, metrics, check_python(src.text), check_python(new_text), cut)


def plan(models: Models, prompt: str, *, config: Any, contract: Any = None, seed: int | None = None,
         on_step: OnStep = no_op) -> dict:
    """Run SDDC; returns the JSON-ready result (program, contract, units, metrics, syntax)."""
    import torch

    from codila_cli.decoding.sddc import decode_plan
    from codila_cli.plan_metrics import all_defined, misbound_overrun
    from codila_cli.syntax import check_python

    if not prompt.strip():
        raise UsageError("the prompt is empty", hint='codila plan "a CLI that counts words in files"')
    dlm = models.dlm
    ids = dlm.tokenizer.encode(prompt, add_special_tokens=False)
    if len(ids) + 128 > dlm.context_length:
        raise UsageError(f"the prompt is {len(ids)} tokens; plan needs it under {dlm.context_length - 128} "
                         f"(the model's context is {dlm.context_length})", hint="shorten the prompt")
    seed = secrets.randbelow(2**31) if seed is None else seed
    torch.manual_seed(seed)
    gen = torch.Generator(device=dlm.device).manual_seed(seed)
    res = decode_plan(dlm, ids, config=config, contract=contract, generator=gen, on_step=on_step)
    mis, over = misbound_overrun(res.contract, res.units)
    syntax = check_python(res.program)
    return {"text": res.program, "seed": seed, "contract": res.contract.text(), "contract_source": res.contract_source,
            "units": [{"index": e.index, "role": e.role, "budget": e.budget, "def": list(e.defs), "use": list(e.uses),
                       "code": code} for e, code in zip(res.contract.entries, res.units)],
            "warnings": res.warnings, "syntax": syntax,
            "metrics": {"iterations": res.iterations, "contract_iterations": res.contract_iterations,
                        "latency_seconds": res.seconds, "misbound": mis, "overrun": over,
                        "all_defined": all_defined(res.contract, res.program),
                        "load_seconds": round(models.load_seconds, 3)}}
