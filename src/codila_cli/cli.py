"""codila's command line: thin Typer commands over the library, and the one error boundary.

stdout carries only the payload (code, a patched file, or one JSON document); everything else
(status, syntax report, warnings, ``Error:``/``Hint:``) goes to stderr. torch and transformers are
imported inside the commands, so ``codila --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from codila_cli import __version__
from codila_cli.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, CodilaError, StrictSyntaxError, UsageError

app = typer.Typer(
    name="codila",
    help="Code generation with diffusion language models and CoDiLA local autoregression.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help and parse errors: `codila --help` in about 0.15 s instead of 0.3 s
)

T = TypeVar("T")


class Decoder(str, Enum):
    auto = "auto"
    dream = "dream"
    threshold = "threshold"
    codila = "codila"


class Alg(str, Enum):
    origin = "origin"
    maskgit_plus = "maskgit_plus"
    topk_margin = "topk_margin"
    entropy = "entropy"


class Color(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


def _stderr(color: Color = Color.auto):
    from rich.console import Console

    force = {Color.always: True, Color.never: False}.get(color)
    return Console(stderr=True, highlight=False, force_terminal=force, no_color=color == Color.never or None)


def _quiet_libraries(verbose: bool = False) -> None:
    """Hugging Face / transformers progress bars and warnings stay off unless -v (set before their import)."""
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _peak_memory() -> str:
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024**2)
    out = f"peak RSS {rss:.0f} MiB"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        out += f", peak GPU {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
    return out


def _stderr_is_tty() -> bool:
    """The live view needs a real terminal on stderr (``--color always`` colours, it does not animate)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _fail(exc: CodilaError, *, quiet: bool = False) -> NoReturn:
    err = sys.stderr
    err.write(f"Error: {exc.message}\n")
    if exc.hint and not quiet:
        err.write(f"Hint: {exc.hint}\n")
    err.flush()
    raise typer.Exit(exc.exit_code)


def boundary(fn: Callable[[], T], *, command: str, quiet: bool = False) -> T:
    """Run ``codila <command>``'s body; map every failure to an ``Error:`` line and a documented exit code."""
    debug = os.environ.get("CODILA_DEBUG") == "1"
    try:
        return fn()
    except typer.Exit:
        raise
    except CodilaError as exc:
        if debug:
            raise
        _fail(exc, quiet=quiet)
    except ValueError as exc:  # configuration dataclasses validate with ValueError
        if debug:
            raise
        _fail(UsageError(str(exc), hint=f"see `codila {command} --help` for the allowed values"), quiet=quiet)
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except MemoryError:
        _fail(CodilaError("out of memory", hint="lower --max-new-tokens or use a smaller model"), quiet=quiet)
    except OSError as exc:  # the machine, not codila: a full disk, a permission, a vanished directory
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        _fail(CodilaError(f"{exc.strerror or exc}{where}",
                          hint="check free disk space and permissions, then run the command again"), quiet=quiet)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        if debug:
            raise
        name = type(exc).__name__
        if "OutOfMemoryError" in name:
            _fail(CodilaError(f"the GPU ran out of memory ({exc})",
                              hint="lower --max-new-tokens, use --dtype bfloat16, or --device cpu"), quiet=quiet)
        sys.stderr.write(f"Error: internal error: {name}: {exc}\n")
        if not quiet:
            sys.stderr.write("Hint: set CODILA_DEBUG=1 for the full traceback, and report it\n")
        raise typer.Exit(EXIT_RUNTIME) from None


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"codila {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """codila: diffusion code generation. Results go to stdout; status and errors to stderr."""


def _stdin_ready(timeout: float = 0.2) -> bool:
    """True when stdin has data (or EOF) within ``timeout`` seconds; True where select() cannot tell."""
    try:
        import select

        return bool(select.select([sys.stdin], [], [], timeout)[0])
    except (OSError, ValueError, TypeError, AttributeError):  # not a real file (tests) or not selectable
        return True


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """Argument, `-` (stdin only), -f FILE, or piped stdin placed before the argument."""
    stdin_text = None
    piped = not sys.stdin.isatty() and prompt_file is None
    if piped and prompt not in (None, "-") and not _stdin_ready():
        piped = False  # an open stdin that sends nothing (agents, CI) must not block a prompt given as argument
    if prompt == "-" or piped:
        raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        try:
            stdin_text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"stdin is not valid UTF-8 (byte {exc.start})", hint="pipe UTF-8 text") from None
    if prompt_file is not None:
        if prompt not in (None, "-") and prompt_file:
            raise UsageError("give the prompt as an argument or with --prompt-file, not both",
                             hint="drop one of them")
        try:
            return prompt_file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{prompt_file} is not UTF-8 text", hint="save the prompt file as UTF-8") from None
        except OSError as exc:
            raise UsageError(f"cannot read {prompt_file}: {exc.strerror or exc}",
                             hint="check the path and its permissions") from None
    if prompt == "-":
        return stdin_text or ""
    if stdin_text:
        return stdin_text.rstrip("\n") + ("\n\n" + prompt if prompt else "\n")
    if prompt is None:
        raise UsageError("no prompt given", hint='codila gen "def fib(n):"   or   echo "…" | codila gen')
    return prompt


def _syntax_line(report: Any) -> str:
    if report.valid:
        return "syntax: valid"
    parts = [f"line {e.line} col {e.column}: {e.message or e.kind}" for e in report.errors[:5]]
    more = f" (+{len(report.errors) - 5} more)" if len(report.errors) > 5 else ""
    return f"syntax: {len(report.errors)} problem(s): " + "; ".join(parts) + more


GEN_DEFAULTS: dict[str, Any] = {
    "decoder": "auto", "max_new_tokens": 128, "steps": None, "tokens_per_step": None, "alg": "entropy",
    "temperature": 0.0, "top_p": None, "top_k": None, "block_length": 32, "threshold": 0.9, "block_size": 4,
    "tau": None, "candidate_blocks": 10, "parallel_blocks": 1, "conditioning": "soft", "ar_temperature": 0.0,
    "ar_context": 0, "ar_repetition_penalty": 1.0, "device": "auto", "dtype": "auto", "cache": "none",
    "cache_blocks": None,
}


def _env(key: str) -> str:
    return "CODILA_" + key.upper()


@app.command()
def gen(
    prompt: Annotated[str | None, typer.Argument(help="The prompt; `-` reads stdin. Piped stdin goes before it.")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", "-f", help="Read the prompt from a file.")] = None,
    system: Annotated[str | None, typer.Option("--system", "-s", help="System message (chat models).")] = None,
    dlm: Annotated[str | None, typer.Option("--dlm", "-m", envvar="CODILA_MODEL", help="Diffusion model: alias, repo id or directory. [default: bundled-dlm]")] = None,
    ar: Annotated[str | None, typer.Option("--ar", envvar="CODILA_AR_MODEL", help="AR helper for CoDiLA: alias, repo id or directory. [default: bundled-ar with the bundled DLM]")] = None,
    decoder: Annotated[Decoder | None, typer.Option(envvar=_env("decoder"), show_default=False, help="auto = codila when an AR helper is configured, else dream. [default: auto]")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(envvar=_env("max_new_tokens"), help="Canvas length (generated tokens). [default: 128]")] = None,
    steps: Annotated[int | None, typer.Option(envvar=_env("steps"), help="dream: Dream's step schedule. [default: max-new-tokens]")] = None,
    tokens_per_step: Annotated[int | None, typer.Option("--tokens-per-step", "-K", envvar=_env("tokens_per_step"), help="dream: exactly K tokens per DLM forward.")] = None,
    alg: Annotated[Alg | None, typer.Option(envvar=_env("alg"), show_default=False, help="dream/codila: confidence rule for which slots to reveal. [default: entropy]")] = None,
    alg_temp: Annotated[float | None, typer.Option(help="dream: sample positions from softmax(conf/alg_temp).")] = None,
    temperature: Annotated[float | None, typer.Option(envvar=_env("temperature"), help="Token sampling temperature, 0 = argmax. [default: 0]")] = None,
    top_p: Annotated[float | None, typer.Option(envvar=_env("top_p"), help="Nucleus filter before sampling and confidence.")] = None,
    top_k: Annotated[int | None, typer.Option(envvar=_env("top_k"), help="Top-k filter before sampling and confidence.")] = None,
    block_length: Annotated[int | None, typer.Option(envvar=_env("block_length"), help="threshold: block length. [default: 32]")] = None,
    threshold: Annotated[float | None, typer.Option(envvar=_env("threshold"), help="threshold: commit every slot with p >= this. [default: 0.9]")] = None,
    block_size: Annotated[int | None, typer.Option("--block-size", "-B", envvar=_env("block_size"), help="codila: block size B. [default: the helper's recommendation, else 4]")] = None,
    tau: Annotated[float | None, typer.Option(envvar=_env("tau"), help="codila: dynamic mode, mean-entropy threshold in nats. [default: static]")] = None,
    candidate_blocks: Annotated[int | None, typer.Option(envvar=_env("candidate_blocks"), help="codila: window of blocks with masks to choose from. [default: the helper's recommendation, else 10]")] = None,
    parallel_blocks: Annotated[int | None, typer.Option(envvar=_env("parallel_blocks"), help="codila: blocks written per DLM forward (static). [default: 1]")] = None,
    conditioning: Annotated[str | None, typer.Option(envvar=_env("conditioning"), help="codila: 'soft' or 'topk:K'. [default: soft]")] = None,
    ar_temperature: Annotated[float | None, typer.Option(envvar=_env("ar_temperature"), help="codila: AR sampling temperature, 0 = greedy. [default: --temperature]")] = None,
    ar_context: Annotated[int | None, typer.Option(envvar=_env("ar_context"), help="codila: committed tokens left of the block the AR also reads. [default: the helper's recommendation, else 0]")] = None,
    ar_repetition_penalty: Annotated[float | None, typer.Option(envvar=_env("ar_repetition_penalty"), help="codila: penalty (CTRL) on ids already in the text for the AR's choices, 1 = off. [default: the helper's recommendation, else 1]")] = None,
    ar_verify: Annotated[bool, typer.Option(help="codila: verification mode (DLM order, AR disagreement penalised).")] = False,
    cache: Annotated[str | None, typer.Option(envvar=_env("cache"), help="threshold/codila: approximate KV cache none|prefix|dual. [default: codila: the helper's recommendation, else none; threshold: none]")] = None,
    cache_blocks: Annotated[int | None, typer.Option(envvar=_env("cache_blocks"), help="codila --cache: the cache window in blocks of B slots. [default: the helper's recommendation, else the candidate window]")] = None,
    verify_penalty: Annotated[float, typer.Option(help="codila --ar-verify: confidence factor on disagreement.")] = 0.5,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="End the output before the first generated line that starts with this text, e.g. --stop 'def ' --stop 'if __name__' (repeatable); decoding ends there too.")] = None,
    no_early_stop: Annotated[bool, typer.Option("--no-early-stop", help="Decode the whole canvas even after end-of-text.")] = False,
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model forwards (pays on GPUs; slow first call).")] = False,
    seed: Annotated[int | None, typer.Option(help="Random seed (random when absent; always reported).")] = None,
    num_samples: Annotated[int, typer.Option("--num-samples", "-n", help="Decode N samples (seeds seed, seed+1, …): in one batch on a GPU, one after another on a CPU or with a KV cache, where that is faster; 1–64.")] = 1,
    device: Annotated[str | None, typer.Option(envvar="CODILA_DEVICE", help="auto, cpu, cuda, cuda:N, mps. [default: auto]")] = None,
    dtype: Annotated[str | None, typer.Option(envvar="CODILA_DTYPE", help="auto (bf16 on CUDA; on a CPU fp32, but bf16 for checkpoints stored in bf16 that are 2 GiB or more, or diffusion models on a CPU with AMX), float32, bfloat16, float16. [default: auto]")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the code.")] = False,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Write final text as it is decoded (raw completion, no live view).")] = True,
    strict: Annotated[bool, typer.Option(help="Exit 4 when the result does not parse.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the payload and errors.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Seed, settings and timings on stderr.")] = False,
    color: Annotated[Color, typer.Option(help="Colour on stderr.")] = Color.auto,
) -> None:
    """Generate code from a prompt with a diffusion LM (plain, threshold, or CoDiLA decoding).

    Settings come from flags, then CODILA_* environment variables, then config.toml, then defaults.

    Examples:

        codila gen "def fib(n):"

        codila gen --decoder codila --block-size 4 --tau 0.5 "def is_prime(n):"

        codila gen -n 4 --temperature 0.5 "def parse(line):"

        cat spec.md | codila gen --json > out.json
    """
    flags = {k: v for k, v in locals().items()}

    def body() -> None:
        from codila_cli.config import load_config
        from codila_cli.decoding.config import CodilaConfig, DreamConfig, SamplingConfig, ThresholdConfig
        from codila_cli.runtime import default_ar, default_dlm, generate, is_chat, load_models, recommended_decoding

        _quiet_libraries(verbose)
        user = load_config()
        if not quiet:
            for w in user.warnings:
                sys.stderr.write(f"Warning: {w}\n")

        recommended: dict[str, Any] = {}  # the AR checkpoint's CoDiLA settings, once the helper is known

        def given(key: str, section: str = "gen") -> Any:
            """flag > environment (typer) > user config file > the helper's recommendation; None if none"""
            value = flags.get(key)
            if isinstance(value, Enum):
                value = value.value
            if value is None:
                value = user.get(section, key)
            return recommended.get(key) if value is None else value

        def opt(key: str, section: str = "gen") -> Any:
            value = given(key, section)
            return GEN_DEFAULTS.get(key) if value is None else value

        if not 1 <= num_samples <= 64:
            raise UsageError(f"--num-samples must be between 1 and 64, got {num_samples}",
                             hint="ask for fewer samples, or run codila several times")
        text = read_prompt(prompt, prompt_file)
        if not text.strip():
            raise UsageError("the prompt is empty", hint='give a prompt: codila gen "def fib(n):"')
        sampling = SamplingConfig(temperature=opt("temperature"), top_p=opt("top_p"), top_k=opt("top_k"))
        early = not no_early_stop
        stops = tuple(stop or ())
        dlm_name = dlm or user.get("models", "dlm") or default_dlm()
        ar_name = ar or user.get("models", "ar") or (default_ar() if dlm_name == "bundled-dlm" else None)
        chosen = opt("decoder")
        if chosen not in ("auto", "dream", "threshold", "codila"):
            raise UsageError(f"invalid decoder {chosen!r} in {user.path}", hint="use auto, dream, threshold or codila")
        if chosen == "auto":
            chosen = "codila" if ar_name else "dream"
        if chosen == "codila" and not ar_name:
            raise UsageError("--decoder codila needs an AR helper", hint="pass --ar qwen3-0.6b (or bundled-ar)")
        if chosen == "codila":
            recommended.update(recommended_decoding(ar_name))
            if opt("cache") == "none":  # a recommended cache window is for when a cache is on
                recommended.pop("cache_blocks", None)
        alg_name = opt("alg")
        # the helper writes CoDiLA's tokens, so it samples at --temperature unless told otherwise
        ar_temperature = opt("temperature") if given("ar_temperature") is None else given("ar_temperature")
        # every flag is validated, whichever decoder runs (a bad --block-size is an error even with dream)
        configs: dict[str, Any] = {
            "dream": DreamConfig(max_new_tokens=opt("max_new_tokens"), steps=opt("steps"),
                                 tokens_per_step=opt("tokens_per_step"), alg=alg_name, alg_temp=alg_temp,
                                 sampling=sampling, early_stop=early, stop=stops),
            "threshold": ThresholdConfig(max_new_tokens=opt("max_new_tokens"), block_length=opt("block_length"),
                                         threshold=opt("threshold"), sampling=sampling, early_stop=early,
                                         cache=opt("cache"), stop=stops),
            "codila": CodilaConfig(max_new_tokens=opt("max_new_tokens"), block_size=opt("block_size"), tau=opt("tau"),
                                   candidate_blocks=opt("candidate_blocks"), parallel_blocks=opt("parallel_blocks"),
                                   conditioning=opt("conditioning"), ar_temperature=ar_temperature,
                                   ar_context=opt("ar_context"),
                                   ar_repetition_penalty=opt("ar_repetition_penalty"), ar_verify=ar_verify, verify_penalty=verify_penalty,
                                   alg=alg_name if alg_name != "origin" else "entropy", sampling=sampling,
                                   early_stop=early, stop=stops, cache=opt("cache") if chosen == "codila" else "none",
                                   cache_blocks=opt("cache_blocks") if chosen == "codila" else None),
        }
        cfg = configs[chosen]
        if chosen == "dream" and opt("cache") != "none":
            raise UsageError("--cache needs a block decoder", hint="use --decoder threshold or --decoder codila")
        device_name, dtype_name = opt("device", "runtime"), opt("dtype", "runtime")
        models = load_models(dlm=dlm_name, ar=ar_name if chosen == "codila" else None, device=device_name,
                             dtype=dtype_name, compile=compile_model)
        err = _stderr(color)
        live = _stderr_is_tty() and not (json_out or quiet)
        if system and not quiet and not is_chat(models.dlm.tokenizer):
            sys.stderr.write(f"Warning: {dlm_name} has no chat template, so --system is not a system message: "
                             "the model reads it as plain text before the prompt (stdout does not repeat it)\n")
        if num_samples > 1:
            _gen_many(models, text, chosen=chosen, cfg=cfg, seed=seed, system=system, n=num_samples, live=live,
                      json_out=json_out, strict=strict, quiet=quiet, verbose=verbose, err=err)
            return
        streamer = None
        if stream and not json_out and not live and not is_chat(models.dlm.tokenizer):
            from codila_cli.ui.stream import StdoutStreamer

            streamer = StdoutStreamer(tokenizer=models.dlm.tokenizer, specials=models.dlm.specials, prompt=text,
                                      out=sys.stdout, stop=stops)
        if streamer is not None:
            result = generate(models, text, decoder=chosen, config=cfg, seed=seed, system=system, on_step=streamer)
        elif live:
            from codila_cli.ui.live import LiveView

            with LiveView(tokenizer=models.dlm.tokenizer, mask_id=models.dlm.specials.mask, console=err,
                          block_size=_view_block(chosen, cfg), title=f"codila gen · {chosen}") as view:
                result = generate(models, text, decoder=chosen, config=cfg, seed=seed, system=system, on_step=view)
        else:
            result = generate(models, text, decoder=chosen, config=cfg, seed=seed, system=system)
        if json_out:
            import json

            sys.stdout.write(json.dumps(result.to_json(models=models.describe()), ensure_ascii=False) + "\n")
        elif streamer is not None:
            streamer.finish(result.text)
        else:
            sys.stdout.write(result.text)
        sys.stdout.flush()
        if not quiet:
            err.print(_syntax_line(result.syntax), style="green" if result.syntax.valid else "yellow", markup=False, soft_wrap=True)
            if not result.syntax.valid and not result.metrics["ended"]:
                err.print(f"the model had not finished when the canvas was full (--max-new-tokens "
                          f"{cfg.max_new_tokens}); a larger canvas may complete the code", style="yellow",
                          markup=False, soft_wrap=True)
        if verbose and not quiet:
            m = result.metrics
            err.print(f"seed: {result.seed}  decoder: {chosen}  prompt tokens: {result.prompt_tokens}", markup=False, soft_wrap=True)
            err.print(_settings_line(chosen, cfg, models), markup=False, soft_wrap=True)
            err.print(f"dlm forwards: {m['dlm_forwards']}  ar forwards: {m['ar_forwards']}  tokens: {m['tokens']}  "
                      f"tokens/step: {m['tokens_per_step']:.2f}  tokens/s: {m['tokens_per_second']:.1f}  "
                      f"decode: {m['wall_seconds']:.2f}s  load: {m['load_seconds']:.2f}s  {_peak_memory()}", markup=False, soft_wrap=True)
        if strict and not result.syntax.valid:
            raise StrictSyntaxError("the generated code does not parse (--strict)",
                                    hint="try another --seed, a smaller --block-size or --tokens-per-step")

    boundary(body, command="gen", quiet=quiet)


def _view_block(decoder: str, cfg: Any) -> int | None:
    """The block grid the live view draws: B for codila, the block length for threshold, none for dream."""
    return {"codila": getattr(cfg, "block_size", None), "threshold": getattr(cfg, "block_length", None)}.get(decoder)


def _all_greedy(cfg: Any) -> bool:
    """True when a decode draws nothing at random, so every seed gives the same text: static CoDiLA's
    helper writes every token (the DLM's temperature is never used), the other decoders sample from the
    DLM at --temperature, and dynamic CoDiLA does both."""
    from codila_cli.decoding.config import CodilaConfig

    if isinstance(cfg, CodilaConfig) and not cfg.ar_verify:
        return cfg.ar_temperature == 0 and (cfg.tau is None or cfg.sampling.temperature == 0)
    return cfg.sampling.temperature == 0 and getattr(cfg, "alg_temp", None) in (None, 0)


def _settings_line(chosen: str, cfg: Any, models: Any) -> str:
    """``-v``: the decoder's main settings (a recommended cache included) and where each model runs, in
    what dtype; `--json`'s ``settings`` has every value."""
    if chosen == "codila":
        parts = [f"B={cfg.block_size}", f"W={cfg.candidate_blocks}"] + ([f"tau={cfg.tau:g}"] if cfg.tau is not None else [])
        parts += [f"ctx={cfg.ar_context}", f"rp={cfg.ar_repetition_penalty:g}"]
    elif chosen == "threshold":
        parts = [f"threshold={cfg.threshold:g}", f"block={cfg.block_length}"]
    else:
        parts = [f"K={cfg.tokens_per_step}" if cfg.tokens_per_step else f"steps={cfg.steps or cfg.max_new_tokens}"]
    if hasattr(cfg, "cache"):
        parts.append(f"cache={cfg.cache}" + (f" cb={cfg.cache_blocks}" if getattr(cfg, "cache_blocks", None) else ""))
    where = [f"{role}: {m.name} ({m.device}, {str(m.ckpt.dtype).removeprefix('torch.')})"
             for role, m in (("dlm", models.dlm), ("ar", models.ar)) if m is not None]
    return "settings: " + " ".join(parts) + "  " + "  ".join(where)


def _gen_many(models: Any, text: str, *, chosen: str, cfg: Any, seed: int | None, system: str | None, n: int,
              live: bool, json_out: bool, strict: bool, quiet: bool, verbose: bool, err: Any) -> None:
    """``gen --num-samples N``: one batched decode (on a GPU without a KV cache; otherwise one sample after
    another, which is faster there: runtime.batching_pays); samples on stdout in order, each after a
    comment line."""
    import json
    import secrets

    from codila_cli.runtime import SCHEMA_VERSION, batching_pays, generate_many

    if not quiet and _all_greedy(cfg):
        sys.stderr.write("Warning: with these settings every sample is the same (nothing is sampled); set "
                         "--temperature" + (" and --ar-temperature above 0" if chosen == "codila" else " above 0")
                         + " to get different samples\n")
    base = secrets.randbelow(2**31 - 64) if seed is None else seed
    seeds = [base + i for i in range(n)]
    batched = batching_pays(models, cfg)
    if live:
        from codila_cli.runtime import BatchOutcome, generate
        from codila_cli.ui.live import LiveView

        def view(i: int) -> LiveView:
            return LiveView(tokenizer=models.dlm.tokenizer, mask_id=models.dlm.specials.mask, console=err,
                            block_size=_view_block(chosen, cfg), title=f"codila gen · {chosen} · sample {i + 1} of {n}")

        if batched:  # the view follows sample 1 of the batch
            with view(0) as v:
                out = generate_many(models, [text] * n, decoder=chosen, config=cfg, seeds=seeds, system=system,
                                    on_step=v)
        else:  # one sample after another (generate_many(batched=False)), each in a view of its own
            t0 = time.perf_counter()
            results = []
            for i, s in enumerate(seeds):
                with view(i) as v:
                    results.append(generate(models, text, decoder=chosen, config=cfg, seed=s, system=system, on_step=v))
            out = BatchOutcome.one_after_another(results, time.perf_counter() - t0)
    else:
        out = generate_many(models, [text] * n, decoder=chosen, config=cfg, seeds=seeds, system=system,
                            batched=batched)
    if json_out:
        doc = {"schema_version": SCHEMA_VERSION, "command": "gen", "models": models.describe(),
               "samples": [r.to_json(models=models.describe()) for r in out.results], "batch": out.summary()}
        for sample in doc["samples"]:
            sample.pop("models", None)
            sample.pop("schema_version", None)
        sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        for i, r in enumerate(out.results):
            sys.stdout.write(f"# codila sample {i + 1}/{n} (seed {r.seed})\n{r.text}")
    sys.stdout.flush()
    valid = sum(r.syntax.valid for r in out.results)
    if not quiet:
        unfinished = sum(not r.syntax.valid and not r.metrics["ended"] for r in out.results)
        note = (f"; the model had not finished {unfinished} of them when the canvas was full (--max-new-tokens "
                f"{cfg.max_new_tokens})" if unfinished else "")
        err.print(f"{valid} of {n} samples parse{note}", style="green" if valid == n else "yellow", markup=False,
                  soft_wrap=True)
    if verbose and not quiet:
        b = out.summary()
        how = f"batched dlm forwards: {b['batched_dlm_forwards']}" if out.batched else "one sample after another"
        err.print(f"seeds: {seeds[0]}..{seeds[-1]}  decoder: {chosen}  {how}  row forwards: {b['row_dlm_forwards']}"
                  f"  tokens: {b['tokens']}  tokens/s: {b['tokens_per_second']:.1f}"
                  f"  decode: {b['wall_seconds']:.2f}s  {_peak_memory()}", markup=False, soft_wrap=True)
        err.print(_settings_line(chosen, cfg, models), markup=False, soft_wrap=True)
    if strict and valid < n:
        raise StrictSyntaxError(f"{n - valid} of {n} samples do not parse (--strict)",
                                hint="try other seeds, a smaller --block-size or --tokens-per-step")


config_app = typer.Typer(help="Show where the configuration lives and what it resolves to.", no_args_is_help=True,
                         rich_markup_mode=None)
app.add_typer(config_app, name="config")


@config_app.command("path")
def config_path_cmd() -> None:
    """Print the config file path ($CODILA_CONFIG or the platform config directory)."""
    from codila_cli.config import config_path

    sys.stdout.write(f"{config_path()}\n")


@config_app.command("show")
def config_show(json_out: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False) -> None:
    """Print every setting with its value and source (env > file > helper's recommendation > default)."""

    def body() -> None:
        import json

        from codila_cli.config import load_config
        from codila_cli.info import effective_settings

        user = load_config()
        for w in user.warnings:
            sys.stderr.write(f"Warning: {w}\n")
        rows = effective_settings(user)
        if json_out:
            sys.stdout.write(json.dumps({"schema_version": 1, "command": "config show", "path": str(user.path),
                                         "exists": user.exists, "settings": rows}) + "\n")
            return
        for r in rows:
            sys.stdout.write(f"{r['key']:<26} {r['value']!s:<16} ({r['source']})\n")

    boundary(body, command="config show")


@app.command()
def models(
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the names of available models.")] = False,
) -> None:
    """List model aliases, whether each is in the Hugging Face cache, and the bundled models."""

    def body() -> None:
        import json

        from codila_cli.info import list_models

        rows = list_models()
        if json_out:
            sys.stdout.write(json.dumps({"schema_version": 1, "command": "models", "models": rows}) + "\n")
        elif quiet:
            sys.stdout.write("".join(f"{r['alias']}\n" for r in rows if r["cached"]))
        else:
            sys.stdout.write(f"{'alias':<15} {'kind':<7} {'available':<10} {'size':>9}  repository\n")
            for r in rows:
                size = f"{r['size_bytes'] / 2**20:.1f} MiB" if r["size_bytes"] else "-"
                sys.stdout.write(f"{r['alias']:<15} {r['kind']:<7} {'yes' if r['cached'] else 'no':<10} {size:>9}  {r['repo']}\n")

    boundary(body, command="models")


@app.command()
def doctor(json_out: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False) -> None:
    """Check versions, device, cache, configured models (with the dtype `auto` picks and the memory their
    weights take) and config file; exit 1 if something is missing or the weights do not fit."""

    def body() -> None:
        import json

        from codila_cli.config import load_config
        from codila_cli.info import doctor as run_doctor

        checks, problems = run_doctor(load_config())
        if json_out:
            sys.stdout.write(json.dumps({"schema_version": 1, "command": "doctor", "ok": not problems,
                                         "checks": checks, "problems": problems}) + "\n")
        else:
            for c in checks:
                sys.stdout.write(f"{'ok ' if c['ok'] else 'BAD'} {c['name']:<20} {c['value']}\n")
        for p in problems:
            sys.stderr.write(f"Error: {p}\n")
        if problems:
            sys.stderr.write("Hint: each Error line above says what is wrong and what to try; "
                             "`codila doctor --json` lists every check\n")
            raise typer.Exit(EXIT_RUNTIME)

    boundary(body, command="doctor")


@app.command("eval")
def eval_cmd(
    benchmark: Annotated[str, typer.Option("--benchmark", "-b", help="humaneval, mbpp, heldout, he-infill-single or he-infill-multi.")] = "heldout",
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory for rows.jsonl, summary.md/json, pareto.png (and paired.json).")] = Path("codila-eval"),
    settings: Annotated[list[str] | None, typer.Option("--setting", help="Decoder setting, repeatable: dream:K=4, threshold:0.9, codila:B=4,tau=0.5. [default: what codila gen runs, e.g. codila:B=4,W=1,ctx=96,rp=1.3,cache=prefix,cb=8 on the bundled pair]")] = None,
    sweep: Annotated[bool, typer.Option(help="The paper's grid: dream K=1,2,4,8; threshold; codila B=2,4,8; codila B=4 with τ.")] = False,
    limit: Annotated[int | None, typer.Option(help="First N tasks only.")] = None,
    tasks: Annotated[list[str] | None, typer.Option("--task", help="Task id, repeatable.")] = None,
    data_dir: Annotated[Path | None, typer.Option(envvar="CODILA_DATA", help="Benchmark data directory (mbpp/, human-eval-infilling/).")] = None,
    dlm: Annotated[str | None, typer.Option("--dlm", "-m", envvar="CODILA_MODEL", help="Diffusion model: alias, repo id or directory. [default: bundled-dlm; bundled-infill for he-infill-*]")] = None,
    ar: Annotated[str | None, typer.Option("--ar", envvar="CODILA_AR_MODEL", help="AR helper for codila settings. [default: bundled-ar with the bundled DLM]")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Canvas length per task.")] = 128,
    timeout: Annotated[float, typer.Option(help="Seconds per test program in the sandbox.")] = 10.0,
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model forwards.")] = False,
    seed: Annotated[int, typer.Option(help="Random seed for every task (decoding is greedy unless a setting samples).")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Completion tasks decoded together per DLM forward (1–64).")] = 1,
    no_stop: Annotated[bool, typer.Option("--no-stop", help="Keep the whole completion: no stop lines (by default a completion ends before its next top-level line, as in the Codex paper's HumanEval protocol).")] = False,
    device: Annotated[str, typer.Option(envvar="CODILA_DEVICE", help="auto, cpu, cuda, cuda:N, mps.")] = "auto",
    dtype: Annotated[str, typer.Option(envvar="CODILA_DTYPE", help="auto, float32, bfloat16, float16 (auto: see codila gen --help).")] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the payload and errors.")] = False,
) -> None:
    """Run a benchmark for decoder settings; write JSONL rows, a Markdown summary and a Pareto plot.

    Generated code runs only here, in a sandboxed subprocess (docs/evaluation.md).
    """

    def body() -> None:
        import json

        from codila_cli.eval.benchmarks import load_tasks, select
        from codila_cli.eval.runner import (markdown, paired_quality, paired_section, run_eval, too_long,
                                            write_outputs)
        from codila_cli.eval.sandbox import SandboxLimits
        from codila_cli.eval.settings import INFILL_GRID, PAPER_GRID, parse_setting, recommended_label
        from codila_cli.runtime import default_ar, default_dlm, default_infill_dlm, load_models, recommended_decoding

        if not 1 <= batch_size <= 64:
            raise UsageError(f"--batch-size must be between 1 and 64, got {batch_size}", hint="use e.g. --batch-size 8")
        infill_bench = benchmark.startswith("he-infill")
        labels = list(settings or []) + ((INFILL_GRID if infill_bench else PAPER_GRID) if sweep else [])
        if infill_bench:
            labels = labels or ["dreamon:K=1"]
        ar_name = ar or (default_ar() if dlm is None else None)
        if not labels:  # what `codila gen` runs by default: CoDiLA with the helper's recommendation, else dream
            labels = [recommended_label(recommended_decoding(ar_name)) if ar_name else "dream:K=1"]
        try:
            parsed = [parse_setting(s, max_new_tokens=max_new_tokens) for s in labels]
        except ValueError as exc:
            raise UsageError(str(exc), hint="a setting is DECODER:key=value,…, e.g. codila:B=4,tau=0.5 "
                             "(docs/evaluation.md, Settings)") from None
        wrong = [p.label for p in parsed if (p.decoder == "dreamon") != infill_bench]
        if wrong:
            raise UsageError(f"setting {wrong[0]!r} does not fit {benchmark}", hint=(
                "infill benchmarks take dreamon:… settings (e.g. dreamon:K=1, dreamon:tau=0.5)" if infill_bench
                else "dreamon:… settings are for the he-infill-single / he-infill-multi benchmarks"))
        chosen = select(load_tasks(benchmark, data=data_dir, stop=not no_stop), limit=limit, ids=tasks)
        dlm_name = dlm or (default_infill_dlm() if infill_bench else default_dlm())
        if any(p.decoder == "codila" or getattr(p.config, "tau", None) is not None and p.decoder == "dreamon"
               for p in parsed) and not ar_name:
            raise UsageError("codila settings need an AR helper", hint="pass --ar")
        if output.exists() and not output.is_dir():
            raise UsageError(f"--output {output} exists and is not a directory",
                             hint="give a directory (it is created if missing)")
        try:  # before the models load and the run starts, not after it
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create --output {output}: {exc.strerror or exc}",
                             hint="give a directory you can write to") from None
        limits = SandboxLimits(timeout=timeout, cpu_seconds=max(1, int(timeout)))
        from codila_cli.eval.distributed import device_for, finish, gather_rows, init_from_env

        shard = init_from_env()
        models = load_models(dlm=dlm_name, ar=ar_name, device=device_for(shard, device), dtype=dtype,
                             compile=compile_model)
        long = [t.task_id for t in chosen if any(too_long(models, t, p) for p in parsed)]
        if long and not quiet and shard.main:
            one = len(long) == 1
            sys.stderr.write(f"Warning: {len(long)} of {len(chosen)} tasks {'does' if one else 'do'} not fit the "
                             f"model's context of {models.dlm.context_length} tokens with --max-new-tokens "
                             f"{max_new_tokens} ({', '.join(long[:3])}{', …' if len(long) > 3 else ''}); "
                             f"{'it counts' if one else 'they count'} as failed (status too-long). Lower "
                             f"--max-new-tokens to include {'it' if one else 'them'}.\n")
        from codila_cli.runtime import batching_pays

        if batch_size > 1 and not batching_pays(models) and not quiet and shard.main:
            sys.stderr.write(f"Warning: --batch-size {batch_size} on the CPU: a batch runs slower there than one task "
                             "at a time (same completions; docs/decoders.md, \"Batching\")\n")
        done = [0]
        total = -(-len(chosen) // shard.world) * len(parsed)
        show = not quiet and shard.main and _stderr_is_tty()

        partial = output / f"rows.rank{shard.rank}.partial.jsonl"  # survives an interrupted run
        fh = open(partial, "w", encoding="utf-8")

        def log(row: dict) -> None:
            fh.write(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}) + "\n")
            fh.flush()
            done[0] += 1
            if show:
                sys.stderr.write(f"\r{done[0]}/{total} {row['setting']} {row['task_id']}\x1b[K")

        mine = run_eval(models, chosen, parsed, seed=seed, limits=limits, on_row=log, rank=shard.rank,
                        world=shard.world, batch_size=batch_size)
        fh.close()
        if show:
            sys.stderr.write("\n")
        rows = gather_rows(shard, mine)
        finish()
        if rows is None:  # not rank 0: rank 0 writes everything
            partial.unlink()
            return
        summary = write_outputs(output, rows, title=f"{benchmark} ({len(chosen)} tasks)")
        partial.unlink()  # only once the results are safely written
        sys.stdout.write(markdown(summary) + paired_section(paired_quality(rows)))

    boundary(body, command="eval", quiet=quiet)


class InfillDecoder(str, Enum):
    dreamon = "dreamon"
    codila = "codila"


@app.command()
def infill(
    file: Annotated[str, typer.Argument(help="Python file to fill, or `-` for stdin.")],
    line: Annotated[int | None, typer.Option("--line", "-l", help="Insert new code before line N (last+1 appends).")] = None,
    lines: Annotated[str | None, typer.Option("--lines", help="Replace lines A-B (1-based, inclusive).")] = None,
    instruction: Annotated[str | None, typer.Option("--instruction", "-i", help="What to write (given to the model as a comment above the prefix).")] = None,
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff instead of the file.")] = False,
    in_place: Annotated[bool, typer.Option("--in-place", help="Rewrite the file atomically (refused if it changed meanwhile).")] = False,
    dlm: Annotated[str | None, typer.Option("--dlm", "-m", envvar="CODILA_INFILL_MODEL", help="Infill DLM. [default: bundled-infill]")] = None,
    ar: Annotated[str | None, typer.Option("--ar", envvar="CODILA_AR_MODEL", help="AR helper for --decoder codila.")] = None,
    decoder: Annotated[InfillDecoder, typer.Option(help="dreamon, or codila (DreamOn marginals + AR blocks).")] = InfillDecoder.dreamon,
    tau: Annotated[float, typer.Option(help="codila: mean-entropy threshold (nats).")] = 0.5,
    block_size: Annotated[int, typer.Option("--block-size", "-B", help="codila: block size.")] = 4,
    initial_masks: Annotated[int, typer.Option(help="Masks the middle starts with (n0).")] = 4,
    max_middle_tokens: Annotated[int, typer.Option(help="Longest middle the model may write.")] = 64,
    steps: Annotated[int | None, typer.Option(help="Cap on DLM forwards. [default: 4 x max-middle-tokens]")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 = argmax).")] = 0.0,
    top_p: Annotated[float | None, typer.Option(help="Nucleus filter.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed (random when absent; always reported).")] = None,
    device: Annotated[str, typer.Option(envvar="CODILA_DEVICE", help="auto, cpu, cuda, cuda:N, mps.")] = "auto",
    dtype: Annotated[str, typer.Option(envvar="CODILA_DTYPE", help="auto, float32, bfloat16, float16 (auto: see codila gen --help).")] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object (the middle, the new text, syntax, metrics).")] = False,
    strict: Annotated[bool, typer.Option(help="Exit 4 (and do not write) when the fill introduces syntax errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the payload and errors.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Seed, settings and timings on stderr.")] = False,
) -> None:
    """Fill code into a file; the model chooses how long the fill is (DreamOn expand/delete).

    Where: --line N inserts before line N, --lines A-B replaces them, else a `# codila: fill` line.
    The patched file goes to stdout unless --diff or --in-place.
    """

    def body() -> None:
        import json

        from codila_cli.decoding.config import InfillConfig, SamplingConfig
        from codila_cli.infill_files import find_region, read_source, to_disk, unified_diff, write_in_place
        from codila_cli.runtime import default_ar, default_infill_dlm, infill as run_infill, load_models

        _quiet_libraries(verbose)
        if in_place and file == "-":
            raise UsageError("--in-place needs a file, not stdin", hint="give the file path, or drop --in-place")
        if in_place and json_out:
            raise UsageError("--in-place and --json do not go together", hint="use --json alone to inspect the fill")
        if diff and json_out:
            raise UsageError("--diff and --json do not go together", hint="--json already holds the fill and its span")
        stdin_bytes = None
        if file == "-":
            if sys.stdin.isatty():
                raise UsageError("FILE is `-` but stdin is a terminal", hint="pipe a file: cat a.py | codila infill - --line 3")
            stdin_bytes = sys.stdin.buffer.read()
        src = read_source(file, stdin_bytes=stdin_bytes)
        region = find_region(src, line=line, lines_range=lines)
        cfg = InfillConfig(initial_masks=initial_masks, max_middle_tokens=max_middle_tokens, steps=steps,
                           sampling=SamplingConfig(temperature=temperature, top_p=top_p), block_size=block_size,
                           tau=tau if decoder == InfillDecoder.codila else None)
        dlm_name = dlm or default_infill_dlm()
        ar_name = (ar or (default_ar() if dlm is None else None)) if decoder == InfillDecoder.codila else None
        if decoder == InfillDecoder.codila and not ar_name:
            raise UsageError("--decoder codila needs an AR helper", hint="pass --ar")
        models = load_models(dlm=dlm_name, ar=ar_name, device=device, dtype=dtype)
        if _stderr_is_tty() and not (json_out or quiet):
            from codila_cli.infill_files import split
            from codila_cli.ui.live import InfillView

            before, after = split(src, region)
            with InfillView(prefix=before, suffix=after, tokenizer=models.dlm.tokenizer,
                            mask_id=models.dlm.specials.mask, console=_stderr(Color.auto),
                            title=f"codila infill · {decoder.value}") as view:
                out = run_infill(models, src, region, config=cfg, seed=seed, instruction=instruction, on_step=view)
        else:
            out = run_infill(models, src, region, config=cfg, seed=seed, instruction=instruction)
        name = file if file != "-" else "stdin"
        if strict and out.introduced_errors:
            raise StrictSyntaxError("the fill introduces syntax errors (--strict); nothing was written",
                                    hint="try another --seed or a different region")
        if in_place:
            write_in_place(src, out.new_text)
        if json_out:
            doc = {"schema_version": 1, "command": "infill", "file": name, "region": {
                       "how": region.how, "start_line": region.start + 1, "end_line": region.end},
                   "middle": out.middle, "text": out.new_text, "seed": out.seed, "models": models.describe(),
                   "settings": {k: v for k, v in cfg.__dict__.items() if k != "sampling"},
                   "syntax": out.syntax_after.to_dict(), "syntax_before": out.syntax_before.to_dict(),
                   "introduced_errors": out.introduced_errors, "context": out.context_cut, "metrics": out.metrics}
            sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
        elif diff:
            sys.stdout.write(unified_diff(src, out.new_text, name.lstrip("/")))
        elif not in_place:
            sys.stdout.buffer.write(to_disk(out.new_text, src.newline))
        sys.stdout.flush()
        if not quiet:
            where = f"lines {region.start + 1}-{region.end}" if region.end > region.start else f"before line {region.start + 1}"
            n = out.middle.count("\n")
            sys.stderr.write(f"filled {where} with {n} line(s)" + (f"; wrote {src.path}" if in_place else "") + "\n")
            if out.context_cut["prefix_kept"] < out.context_cut["prefix_tokens"] or out.context_cut["suffix_kept"] < out.context_cut["suffix_tokens"]:
                sys.stderr.write("Warning: the file is longer than the model's context; the model saw the "
                                 f"{out.context_cut['prefix_kept']} prefix and {out.context_cut['suffix_kept']} suffix "
                                 "tokens nearest the fill (the output keeps the whole file)\n")
            status = _syntax_line(out.syntax_after)
            if out.introduced_errors:
                status += " (introduced by the fill)"
            elif not out.syntax_before.valid:
                status += " (the file had syntax errors before the fill)"
            sys.stderr.write(status + "\n")
        if verbose and not quiet:
            m = out.metrics
            sys.stderr.write(f"seed: {out.seed}  dlm forwards: {m['dlm_forwards']}  ar forwards: {m['ar_forwards']}  "
                             f"middle tokens: {m['middle_tokens']}  expansions: {m['expansions']}  deletions: "
                             f"{m['deletions']}  tokens/step: {m['tokens_per_step']:.2f}  decode: {m['wall_seconds']:.2f}s\n")

    boundary(body, command="infill", quiet=quiet)


@app.command()
def plan(
    prompt: Annotated[str | None, typer.Argument(help="What the program should do; `-` reads stdin.")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", "-f", help="Read the prompt from a file.")] = None,
    contract_file: Annotated[Path | None, typer.Option("--contract", help="Use this contract instead of writing one.")] = None,
    show_contract: Annotated[bool, typer.Option("--show-contract", help="Print the contract on stderr.")] = False,
    defines: Annotated[str | None, typer.Option("--defines", help="Comma-separated names, one unit each, in order: the model writes the rest of the contract.")] = None,
    contract_schedule: Annotated[str, typer.Option(help="default, end-after-entry, pad-scan or left-to-right.")] = "default",
    attention: Annotated[str, typer.Option(help="coupled (canvases see each other) or isolated.")] = "coupled",
    commit: Annotated[str, typer.Option(help="'single' (one token per canvas per iteration) or a threshold γ_u in (0, 1].")] = "single",
    pad_scale: Annotated[float, typer.Option(help="Canvas length = ceil(pad_scale x budget).")] = 1.25,
    min_unit_tokens: Annotated[int, typer.Option(help="No unit may end (end-of-text) before this many tokens.")] = 8,
    max_units: Annotated[int, typer.Option(help="Entry slots in the contract template.")] = 4,
    dlm: Annotated[str | None, typer.Option("--dlm", "-m", envvar="CODILA_PLAN_MODEL", help="[default: bundled-plan, else bundled-dlm]")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 = argmax).")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Random seed (random when absent; always reported).")] = None,
    device: Annotated[str, typer.Option(envvar="CODILA_DEVICE", help="auto, cpu, cuda, cuda:N, mps.")] = "auto",
    dtype: Annotated[str, typer.Option(envvar="CODILA_DTYPE", help="auto, float32, bfloat16, float16 (auto: see codila gen --help).")] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object with the contract, units and metrics.")] = False,
    strict: Annotated[bool, typer.Option(help="Exit 4 when the program does not parse.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the payload and errors.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Seed, settings and timings on stderr.")] = False,
) -> None:
    """Write a multi-unit program the SDDC way: contract first, then all units denoised together."""

    def body() -> None:
        import json

        from codila_cli.contract import ContractError, parse_contract
        from codila_cli.decoding.config import PlanConfig, SamplingConfig
        from codila_cli.models.registry import bundled_available
        from codila_cli.runtime import load_models, plan as run_plan

        _quiet_libraries(verbose)
        text = read_prompt(prompt, prompt_file)
        if commit == "single":
            gamma = None
        else:
            try:
                gamma = float(commit)
            except ValueError:
                raise UsageError(f"--commit {commit!r} is neither 'single' nor a number",
                                 hint="e.g. --commit single or --commit 4") from None
        names = tuple(n.strip() for n in defines.split(",")) if defines is not None else ()
        if contract_file is not None and names:
            raise UsageError("--defines and --contract both set the units", hint="name the units in the contract file")
        cfg = PlanConfig(max_units=max_units, contract_schedule=contract_schedule, pad_scale=pad_scale,
                         min_unit_tokens=min_unit_tokens, attention=attention, commit=gamma, defines=names,
                         sampling=SamplingConfig(temperature=temperature))
        user_contract = None
        if contract_file is not None:
            try:
                user_contract = parse_contract(contract_file.read_text(encoding="utf-8"))
            except ContractError as exc:
                raise ContractError(f"{contract_file}: {exc.message}", hint="one line per unit, "
                                    "`@unit N role=R budget=B def=a,b use=c`, then `@end` (docs/plan.md)") from None
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "it is not UTF-8 text"
                raise UsageError(f"cannot read contract {contract_file}: {why}",
                                 hint="check the path and its permissions") from None
        name = dlm or next((n for n in ("bundled-plan", "bundled-dlm") if bundled_available(n)), None)
        if name is None:
            from codila_cli.errors import ModelNotFoundError

            raise ModelNotFoundError("no plan model given and no bundled model is installed", hint="pass --dlm")
        models = load_models(dlm=name, ar=None, device=device, dtype=dtype)
        if _stderr_is_tty() and not (json_out or quiet):
            from codila_cli.ui.live import PlanView

            with PlanView(tokenizer=models.dlm.tokenizer, mask_id=models.dlm.specials.mask,
                          console=_stderr(Color.auto), title="codila plan") as view:
                out = run_plan(models, text, config=cfg, contract=user_contract, seed=seed, on_step=view)
        else:
            out = run_plan(models, text, config=cfg, contract=user_contract, seed=seed)
        if not quiet:
            for w in out["warnings"]:
                sys.stderr.write(f"Warning: {w}\n")
        if show_contract and not quiet:
            sys.stderr.write(out["contract"])
        if json_out:
            doc = {"schema_version": 1, "command": "plan", **{k: v for k, v in out.items() if k != "syntax"},
                   "syntax": out["syntax"].to_dict(), "models": models.describe(),
                   "settings": {k: v for k, v in cfg.__dict__.items() if k != "sampling"}}
            sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(out["text"])
        sys.stdout.flush()
        if not quiet:
            sys.stderr.write(_syntax_line(out["syntax"]) + "\n")
        if verbose and not quiet:
            m = out["metrics"]
            sys.stderr.write(f"seed: {out['seed']}  iterations: {m['iterations']} (contract {m['contract_iterations']})  "
                             f"misbound: {m['misbound']:.0%}  overrun: {m['overrun']:.0%}  all defined: {m['all_defined']}  "
                             f"latency: {m['latency_seconds']:.2f}s\n")
        if strict and not out["syntax"].valid:
            raise StrictSyntaxError("the assembled program does not parse (--strict)",
                                    hint="the program was still written to stdout; try another --seed")

    boundary(body, command="plan", quiet=quiet)


class Stage(str, Enum):
    corpus = "corpus"
    tokenizer = "tokenizer"
    arinit = "arinit"
    dlm = "dlm"
    sft = "sft"
    ar = "ar"
    align = "align"
    tasks = "tasks"
    export = "export"


@app.command()
def train(
    stage: Annotated[Stage, typer.Argument(help="corpus, tokenizer, arinit, dlm, sft, ar, align, tasks, export (in that order).")],
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Where data, checkpoints and logs live.")] = Path("runs/bundled"),
    steps: Annotated[int, typer.Option(help="Optimizer steps for model stages (resumes up to this).")] = 1000,
    data_dir: Annotated[Path | None, typer.Option(envvar="CODILA_DATA", help="Benchmark data for decontamination (shared/data).")] = None,
    init: Annotated[Path | None, typer.Option("--init", help="align: start from this aligned helper directory (re-alignment); sft, tasks: from this Dream checkpoint directory.")] = None,
    shape: Annotated[str, typer.Option("--shape", help="ar: helper shape, base (4.5M) or small (1.9M, session 1).")] = "base",
    frontier: Annotated[float | None, typer.Option("--frontier", help="align, sft: share of left-to-right (frontier) masks, 0..1. [default: 0]")] = None,
    context: Annotated[int | None, typer.Option("--context", help="align: most left-context tokens the helper reads. [default: 48]")] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="model stages: rows per step. [default: the stage's own]")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="model stages: peak learning rate. [default: the stage's own]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar; errors only.")] = False,
) -> None:
    """Train one stage of the bundled models; run it again to resume after an interruption.

    Docs: docs/training.md lists the exact commands that produced the shipped weights.
    """

    def body() -> None:
        import json

        from codila_cli.train import stages

        if steps < 1:
            raise UsageError("--steps must be >= 1", hint="e.g. --steps 200")
        if stage == Stage.corpus:
            out = stages.stage_corpus(run_dir, data_dir=data_dir)
        elif stage == Stage.tokenizer:
            if not (run_dir / "corpus" / "train.jsonl").is_file():
                raise UsageError(f"no corpus in {run_dir}", hint=f"run `codila train corpus --run-dir {run_dir}` first")
            out = stages.stage_tokenizer(run_dir)
        elif stage == Stage.export:
            out = stages.stage_export(run_dir)
        else:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            fn = {"arinit": stages.stage_arinit, "dlm": stages.stage_dlm, "sft": stages.stage_sft,
                  "ar": stages.stage_ar, "align": stages.stage_align, "tasks": stages.stage_tasks}[stage.value]
            extra: dict = {}
            if shape not in stages.AR_SHAPES:
                raise UsageError(f"--shape must be one of {', '.join(stages.AR_SHAPES)}, got {shape!r}",
                                 hint="see `codila train --help`")
            if stage == Stage.ar:
                extra["shape"] = shape
            elif shape != "base":
                raise UsageError("--shape applies to the ar stage only", hint="drop --shape, or train the ar stage")
            if init is not None:
                if stage not in (Stage.align, Stage.tasks, Stage.sft):
                    raise UsageError("--init applies to the sft, align and tasks stages only", hint="drop --init for this stage")
                if not (init / "model.safetensors").is_file():
                    raise UsageError(f"--init {init} has no model.safetensors", hint="point at an exported checkpoint directory")
                extra["init"] = init
            if frontier is not None:
                if stage not in (Stage.align, Stage.sft):
                    raise UsageError("--frontier applies to the align and sft stages only", hint="drop --frontier for this stage")
                if not 0.0 <= frontier <= 1.0:
                    raise UsageError(f"--frontier must be between 0 and 1, got {frontier}", hint="e.g. --frontier 0.75")
                extra["frontier"] = frontier
            if context is not None:
                if stage != Stage.align:
                    raise UsageError("--context applies to the align stage only", hint="drop --context for this stage")
                if not 0 <= context <= 512:
                    raise UsageError(f"--context must be between 0 and 512, got {context}", hint="e.g. --context 96")
                extra["ctx_max"] = context
            if batch is not None:
                if not 1 <= batch <= 4096:
                    raise UsageError(f"--batch must be between 1 and 4096, got {batch}", hint="e.g. --batch 32")
                extra["batch"] = batch
            if lr is not None:
                if not 0.0 < lr <= 1.0:
                    raise UsageError(f"--lr must be in (0, 1], got {lr}", hint="e.g. --lr 3e-4")
                extra["lr"] = lr
            if not (run_dir / "tokenizer" / "tokenizer.json").is_file():
                raise UsageError(f"no tokenizer in {run_dir}", hint=f"run `codila train tokenizer --run-dir {run_dir}` first")
            with Progress(TextColumn(f"[bold]{stage.value}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=_stderr(),
                          disable=quiet, transient=False) as bar:
                task = bar.add_task(stage.value, total=steps, info="")

                def log(r: dict) -> None:
                    info = f"loss {r['loss']:.3f}" + (f"  valid {r['valid']:.3f}" if "valid" in r else "")
                    bar.update(task, completed=r["step"], info=info)

                out = fn(run_dir, steps=steps, on_log=log, **extra)
        sys.stdout.write(json.dumps(out, default=str) + "\n")

    boundary(body, command="train", quiet=quiet)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)  # SIGTERM ends a run like Ctrl-C: exit 130, nothing partial
    try:
        code = app(standalone_mode=False, prog_name="codila")
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        # the parser's own errors (unknown option, a value of the wrong type, a missing argument) carry
        # an exit code and a message: one Error line and a Hint, like codila's own usage errors
        message, exit_code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
        if not callable(message) or not isinstance(exit_code, int):
            raise
        ctx = getattr(exc, "ctx", None)
        text = message()
        if ctx is not None and text == ctx.get_help():  # a bare group (`codila`, `codila config`): its help
            sys.stderr.write(text + "\n")
        else:
            where = ctx.command_path if ctx is not None else "codila"
            sys.stderr.write(f"Error: {text}\nHint: see `{where} --help`\n")
        sys.exit(exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
