"""One generation, or many decoded together: encode the prompt, run one sampler, build the result.
Nothing here prints; decoders emit step events (``on_step``)."""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from codila_cli.decoding.config import GEN_DECODERS as DECODERS
from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.engine.models import Models
from codila_cli.engine.prompts import decode_text, encode_prompt
from codila_cli.errors import UsageError

SCHEMA_VERSION = 1


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


def _prepare(models: Models, prompt: str, config: Any, system: str | None,
             messages: list[dict] | None = None) -> tuple[list[int], str]:
    if not prompt.strip() and not messages:
        raise UsageError("the prompt is empty", hint='give a prompt: codila gen "def fib(n):"')
    ids, mode = encode_prompt(models.dlm.tokenizer, models.dlm.specials, prompt, system=system, messages=messages)
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


def text_end_ids(dlm: Any, ar: Any, bridge: Any = None) -> tuple[int, ...]:
    """The ids that end the text in a CoDiLA decode: the DLM's stop ids and the helper's (either ends it),
    in the helper's ids when a TokenMap bridges two vocabularies (the choice rules read those)."""
    base = getattr(ar, "_ar", ar)  # a RowAR view (decoding/batch.py): its helper's
    own = list(dlm.specials.stop_ids)
    if hasattr(bridge, "ids_to_ar"):
        own = bridge.ids_to_ar(own)
    return tuple(sorted(set(own) | set(getattr(getattr(base, "specials", None), "stop_ids", ()))))


def _decode(models: Models, dlm: Any, ar: Any, ids: list[int], *, decoder: str, config: Any, gen: Any,
            on_step: OnStep, raw: bool = True) -> Any:
    """Run one sampler on one sequence: a decoder the DLM's family row allows (models/families.py), by
    decoding/registry.py::sampler; ``dlm``/``ar`` may be per-row views of the loaded models; ``raw``: a raw
    completion prompt (a chat answer is not code from its first token, so it gets no syntax guard)."""
    from dataclasses import replace

    from codila_cli.decoding.registry import WRITES_WITH_HELPER, sampler

    family = check_decoder(dlm, decoder)
    extra = {}
    if decoder in WRITES_WITH_HELPER:
        if ar is None:
            raise UsageError(f"--decoder {decoder} needs an AR helper",
                             hint="pass --ar with a helper (bundled-ar for the bundled model, qwen3-0.6b for Dream or SDAR)")
        from codila_cli.decoding.bridged import make_writer
        from codila_cli.decoding.rules import build_rules

        rules = build_rules(config, ar=ar, end_ids=text_end_ids(dlm, ar, models.bridge), raw=raw)
        extra["writer"] = make_writer(ar, models.bridge, temperature=config.ar_temperature, topk=config.topk, rules=rules)
    if exact_pays(dlm, decoder, config):
        from codila_cli.decoding.freedave import decode_exact

        res = decode_exact(dlm, ids, decoder=decoder, config=config, generator=gen, on_step=on_step)
    else:
        res = sampler(decoder, block_diffusion=family.block_diffusion)(dlm, ids, config=config, generator=gen,
                                                                       on_step=on_step, **extra)
    if family.block_diffusion:  # whole blocks are decoded (as the official loop does); the limit is kept
        res = replace(res, canvas=res.canvas[: config.max_new_tokens])
    return res


def check_decoder(dlm: Any, decoder: str) -> Any:
    """The DLM's family row (models/families.py), or a UsageError when ``decoder`` does not run it."""
    family = dlm.family
    if decoder not in DECODERS:
        raise UsageError(f"unknown decoder {decoder!r}", hint=f"use one of {', '.join(DECODERS)}")
    if decoder not in family.decoders:
        what = "a block-diffusion" if family.block_diffusion else "a whole-canvas"
        raise UsageError(f"{dlm.name} is {what} model ({family.name}): --decoder {decoder} does not run it",
                         hint=f"use --decoder {' or '.join(family.decoders)} (`codila models` lists what runs each "
                              "family), or drop --decoder to use the model's own sampler")
    return family


def exact_pays(dlm: Any, decoder: str, config: Any) -> bool:
    """Whether this decode (``decoder``: gen's, or "dreamon" for a fill) runs FreeDave (decoding/freedave.py):
    when ``--exact`` says so (settings it cannot run exactly are refused by the config), or, unset, where it pays:
    a GPU computing in fp32 with deterministic settings. Not on a CPU, where a forward of d canvases costs about
    d forwards (benchmarks/exact.py: 0.53–0.56× the wall time on the bundled model), nor in 16 bits, where a
    batch's rows are not lone rows and the near ties it must then decide alone take back most of the savings
    (docs/results/exact-s36.md: 0.87–1.08× the reference's sequential forwards)."""
    import torch

    from codila_cli.decoding.config import exact_problem
    from codila_cli.decoding.registry import WRITES_WITH_HELPER

    if decoder in WRITES_WITH_HELPER or not hasattr(config, "exact") or config.needs_helper:  # the helper's writes
        return False  # are not the DLM's steps
    if config.exact is not None:
        return config.exact
    return (getattr(dlm.device, "type", str(dlm.device)) == "cuda" and exact_problem(config) is None
            and dlm.ckpt.dtype == torch.float32)


def exact_note(models: Models, decoder: str, config: Any) -> str | None:
    """The warning ``--exact`` needs in 16 bits: a batched forward rounds rows otherwise than a lone one there,
    so a choice closer than the rounding can break otherwise (docs/decoders.md, Exact); None in fp32."""
    import torch

    if decoder != "dreamon":
        check_decoder(models.dlm, decoder)  # a decode it would refuse gets its error, not this warning first
    dtype = models.dlm.ckpt.dtype
    if not exact_pays(models.dlm, decoder, config) or dtype == torch.float32:
        return None
    name = str(dtype).removeprefix("torch.")
    return (f"--exact in {name}: a batched forward rounds a row otherwise than a lone one, so where two choices "
            "are closer than that rounding the text can differ from the one-token-per-step decode's (fp32 keeps "
            "it identical: --dtype float32)")


def _result(models: Models, prompt: str, mode: str, ids: list[int], res: Any, *, decoder: str, config: Any,
            seed: int, recorder: Any, wall: float, language: Any = None) -> GenerationResult:
    """``language``: what the text is checked as (languages.Language); None: a chat answer's fence names
    it (```go), else Python."""
    from codila_cli.decoding.stops import ends_line, stop_offset
    from codila_cli.languages import PYTHON
    from codila_cli.syntax import check_code, extract_code, fence_language

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
    metrics = recorder.finish(wall_seconds=wall, dlm_forwards=res.dlm_forwards, ar_forwards=res.ar_forwards,
                              limit=len(res.canvas))
    stop_ids = set(dlm.specials.stop_ids)
    ended = cut is not None or any(t in stop_ids for t in res.canvas)  # else the canvas ran out
    extra = {"stopped_early": res.stopped_early, "ended": ended, "stop_line": stop_line,
             "load_seconds": round(models.load_seconds, 3),
             # canvases the DLM evaluated (a FreeDave verification forward of d candidates counts d) and its counts
             "dlm_rows": res.dlm_rows, "freedave": res.freedave}
    return GenerationResult(text=text, completion=completion, mode=mode, seed=seed, decoder=decoder,
                            settings=asdict(config), metrics={**metrics.to_dict(), **extra},
                            syntax=check_code(text, language=language or (mode == "chat" and fence_language(completion))
                                              or PYTHON, span=(len(prompt), len(text)) if mode != "chat" else None),
                            prompt_tokens=len(ids), events=recorder.events)


def generate(models: Models, prompt: str, *, decoder: str, config: DreamConfig | ThresholdConfig | CodilaConfig,
             seed: int | None = None, system: str | None = None, on_step: OnStep = no_op,
             batcher: Any = None, on_row: Any = None, messages: list[dict] | None = None,
             language: Any = None) -> GenerationResult:
    """Decode one prompt; ``language`` (languages.Language) is what the syntax report checks it as. With ``batcher`` (decoding/batch.py::StepBatcher, shared by a server's requests)
    the decode joins the running batch as one row at its next step and leaves it when done;
    ``on_row(batcher, row)`` is told the row (so a caller can cancel it). ``messages``: a whole
    conversation for a chat model (engine/prompts.py::encode_prompt)."""
    import torch

    from codila_cli.decoding.metrics import MetricsRecorder

    if models.dlm.block_diffusion:  # a cache per row: decoded alone, not in the shared batch
        batcher = None
    ids, mode = _prepare(models, prompt, config, system, messages)
    dlm = models.dlm
    seed = secrets.randbelow(2**31) if seed is None else seed
    if batcher is None:
        torch.manual_seed(seed)
    gen = torch.Generator(device=dlm.device).manual_seed(seed)
    recorder = MetricsRecorder()

    def tee(event):
        recorder(event)
        on_step(event)

    t0 = time.perf_counter()
    if batcher is None:
        res = _decode(models, dlm, models.ar, ids, decoder=decoder, config=config, gen=gen, on_step=tee,
                      raw=mode == "raw")
    else:
        from codila_cli.decoding.batch import RowAR, RowDLM

        with batcher.row(on_row) as row:
            ar = RowAR(models.ar, batcher, row) if models.ar is not None else None
            res = _decode(models, RowDLM(batcher, row, dlm), ar, ids, decoder=decoder, config=config, gen=gen,
                          on_step=tee, raw=mode == "raw")
    return _result(models, prompt, mode, ids, res, decoder=decoder, config=config, seed=seed, recorder=recorder,
                   wall=time.perf_counter() - t0, language=language)


@dataclass
class BatchOutcome:
    results: list[GenerationResult]
    batched_forwards: int  # DLM forwards the hardware ran (shared by the rows when batched)
    wall_seconds: float
    batched: bool = True  # False: the rows were decoded one after another (batching_pays)
    ar_forwards: int | None = None  # AR forwards the hardware ran (None: every row's own)

    @classmethod
    def one_after_another(cls, results: list[GenerationResult], wall_seconds: float) -> BatchOutcome:
        """Rows decoded in turn: the hardware ran every row's forwards."""
        return cls(results, sum(r.metrics["dlm_forwards"] for r in results), wall_seconds, batched=False)

    def summary(self) -> dict:
        tokens = sum(r.metrics.get("tokens", 0) for r in self.results)
        row_ar = sum(r.metrics.get("ar_forwards", 0) for r in self.results)
        return {"rows": len(self.results), "batched": self.batched, "batched_dlm_forwards": self.batched_forwards,
                "row_dlm_forwards": sum(r.metrics.get("dlm_forwards", 0) for r in self.results),
                "batched_ar_forwards": row_ar if self.ar_forwards is None else self.ar_forwards,
                "row_ar_forwards": row_ar,
                "tokens": tokens, "wall_seconds": round(self.wall_seconds, 4),
                "tokens_per_second": round(tokens / self.wall_seconds, 2) if self.wall_seconds > 0 else 0.0}


def batching_pays(models: Models) -> bool:
    """Whether ``gen -n`` should decode its samples together rather than one after another: on a GPU,
    where one forward serves N rows for about the price of one. On a CPU the stacked forwards cost
    about what the rows' own forwards cost (the DLM's are compute-bound there), and the rows' threads
    share the cores: 8 prompts of the bundled default ran at 0.85× (session 23), 1.06× since the rows
    are packed (benchmarks/batch_library.py, docs/serve.md): no gain worth a change. A server batches on a CPU all the same, for what it gives every client: a short
    request does not wait behind long ones."""
    return getattr(models.dlm.device, "type", str(models.dlm.device)) != "cpu"


def generate_many(models: Models, prompts: list[str], *, decoder: str, config: Any, seeds: list[int],
                  system: str | None = None, on_step: OnStep = no_op, batched: bool = True) -> BatchOutcome:
    """Decode several prompts (or one prompt several times) together: each step's model calls run as
    stacked forwards (decoding/batch.py). Row i uses ``seeds[i]`` and makes the decisions ``generate``
    makes with that seed. ``on_step`` receives row 0's events (the live view follows one row).
    ``batched`` False decodes the rows one after another instead."""
    import torch

    from codila_cli.decoding.batch import RowAR, run_batched
    from codila_cli.decoding.metrics import MetricsRecorder

    if len(prompts) != len(seeds) or not prompts:
        raise ValueError("generate_many needs one seed per prompt and at least one prompt")
    if not batched or len(prompts) == 1 or models.dlm.block_diffusion:
        t0 = time.perf_counter()
        results = [generate(models, p, decoder=decoder, config=config, seed=s, system=system,
                            on_step=on_step if i == 0 else no_op) for i, (p, s) in enumerate(zip(prompts, seeds))]
        return BatchOutcome.one_after_another(results, time.perf_counter() - t0)
    prepared = [_prepare(models, p, config, system) for p in prompts]
    dlm = models.dlm
    recorders = [MetricsRecorder() for _ in prompts]
    walls = [0.0] * len(prompts)

    def row(r: int, row_dlm: Any, batcher: Any, row_id: int) -> Any:
        gen = torch.Generator(device=dlm.device).manual_seed(seeds[r])
        rec = recorders[r]

        def tee(event):
            rec(event)
            if r == 0:
                on_step(event)

        t = time.perf_counter()
        ar = RowAR(models.ar, batcher, row_id) if models.ar is not None else None
        out = _decode(models, row_dlm, ar, prepared[r][0], decoder=decoder, config=config, gen=gen, on_step=tee,
                      raw=prepared[r][1] == "raw")
        walls[r] = time.perf_counter() - t
        return out

    t0 = time.perf_counter()
    outs, batcher = run_batched(dlm, len(prompts), row)
    wall = time.perf_counter() - t0
    results = [_result(models, p, mode, ids, res, decoder=decoder, config=config, seed=s, recorder=rec, wall=w)
               for p, (ids, mode), res, s, rec, w in zip(prompts, prepared, outs, seeds, recorders, walls)]
    return BatchOutcome(results, batcher.batched_forwards, wall, ar_forwards=batcher.ar_calls)
