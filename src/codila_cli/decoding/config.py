"""Frozen, validated decoder settings, and the one table of knobs they are read from.

Each knob (decoding/knobs.py::Knob) is declared once below: name, type, range, default, help, its eval
key, whether a helper may recommend it. The dataclasses take their defaults from the table, and the
config-file schema, the helper card's keys, eval's setting strings, the ``-v`` report, the flags' help
and docs/settings.md are derived from it. Each field maps 1:1 to a ``codila gen`` flag (``Knob.option``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar

from codila_cli.decoding.knobs import Knob, KnobTable, check_positive, check_stop, exact_problem, from_given

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
CONVENTIONS = ("codila", "fast-dllm")
CACHES = ("none", "prefix", "dual")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_CANVAS = 100_000
CODILA_INFILL_TAU = 0.5  # `codila infill --decoder codila`'s threshold when --tau is not given

_SAMPLING = (
    Knob("temperature", float, 0.0, "Token sampling temperature, 0 = argmax.", lo=0, hi=100, model=True),
    Knob("top_p", float, None, "Nucleus filter before sampling and confidence.", optional=True, lo=0, hi=1,
         open_lo=True, model=True),
    Knob("top_k", int, None, "Top-k filter before sampling and confidence.", optional=True, lo=1, model=True),
)
_ALG = Knob("alg", str, "entropy", "confidence rule for which slots to reveal (origin: dream only).", choices=ALGS,
            short="alg", model=True)
_BLOCK_SIZE = Knob("block_size", int, 4, "block size B.", lo=1, hi=256, short="B", letter="-B", recommend=True, show=True,
                   grid=True)
_EXACT = Knob("exact", bool, None, "the tokens of one step at a time in fewer sequential forwards (FreeDave: each "
              "checks up to 8 drafted steps, that many rows of compute; temperature 0).", optional=True, short="exact",
              default_text="on with CUDA in fp32; off on a CPU and in 16 bits, where it is slower (docs/decoders.md)")
_TAU = Knob("tau", float, None, "dynamic mode, mean-entropy threshold in nats.", optional=True, lo=0, hi=100,
            short="tau", default_text="static")

GEN_DECODERS = ("dream", "threshold", "codila", "llada", "block")  # decoding/registry.py maps each to its config

GEN_KNOBS = KnobTable(
    Knob("decoder", str, "auto", "auto = codila when an AR helper is configured, else the DLM's own sampler "
         "(dream; llada for a LLaDA model; block for a block-diffusion model such as SDAR).",
         choices=("auto", *GEN_DECODERS)),
    Knob("max_new_tokens", int, 128, "Canvas length (generated tokens).", lo=1, hi=MAX_CANVAS, model=True),
    Knob("tokens_per_step", int, None, "exactly K tokens per DLM forward.", optional=True, lo=1, hi=MAX_CANVAS,
         short="K", letter="-K"),
    Knob("steps", int, None, "Dream's step schedule (llada: forwards in all, an equal share per block).",
         optional=True, lo=1, hi=MAX_CANVAS, short="steps", default_text="max-new-tokens", model=True),
    Knob("alg_temp", float, None, "sample positions from softmax(conf/alg_temp).", optional=True, lo=0),
    Knob("eps", float, 1e-3, "the end of Dream's time schedule (no flag).", lo=0, hi=1, open_lo=True, open_hi=True,
         flag="", env=False),
    _EXACT,
    Knob("exact_steps", bool, False, "one DLM forward per step, as the official loop (the same tokens; codila "
         "otherwise skips forwards after steps that reveal nothing)."),
    *_SAMPLING,
    Knob("threshold", float, 0.9, "commit every slot with p >= this.", lo=0, hi=1, open_lo=True, short="t",
         show=True),
    Knob("block_length", int, 32, "block length (llada: semi-autoregressive blocks; it must divide "
         "--max-new-tokens).", lo=1, hi=MAX_CANVAS, short="block", show=True, grid=True),
    Knob("remasking", str, "low_confidence", "which masked slots a step reveals: the step's quota of the most "
         "probable (low_confidence), of random ones, from the first masked slot on (sequential), or every slot "
         "above --threshold when they are at least the quota (dynamic: SDAR's default; a family with its own "
         "threshold rule runs that, docs/models.md).",
         choices=("low_confidence", "random", "dynamic", "sequential"), short="remask"),
    Knob("cfg_scale", float, 0.0, "unsupervised classifier-free guidance w (0 = off; each forward also runs "
         "the prompt masked: u + (w + 1)(c - u)).", lo=0, hi=100, short="cfg"),
    _BLOCK_SIZE,
    _TAU,
    Knob("candidate_blocks", int, 10, "window of blocks with masks to choose from.", lo=1, hi=MAX_CANVAS,
         short="W", recommend=True, show=True),
    Knob("parallel_blocks", int, 1, "blocks written per DLM forward (static).", lo=1, hi=16, short="P"),
    Knob("conditioning", str, "soft", "'soft' or 'topk:K' (the K largest entries of each marginal).",
         pattern=(r"soft|topk:[1-9][0-9]*", "soft | topk:K"), short="cond", recommend=True),
    Knob("ar_verify", bool, False, "verification mode (DLM order, AR disagreement penalised).", short="verify"),
    Knob("verify_penalty", float, 0.5, "--ar-verify: confidence factor on disagreement.", lo=0, hi=1),
    Knob("cache", str, "none", "approximate KV cache none|prefix|dual.", choices=CACHES, short="cache",
         recommend=True, show=True, inert_when=("ar_verify", True)),
    Knob("cache_blocks", int, None, "--cache: the cache window in blocks of B slots.", optional=True, lo=1, hi=4096,
         short="cb", recommend=True, default_text="the candidate window", inert_when=("cache", "none")),
    Knob("convention", str, "codila", "codila, or fast-dllm (the reference code's rules, token for token; "
         "docs/decoders.md, Parity).", choices=CONVENTIONS, short="conv", flag="--threshold-convention"),
    Knob("entropy_steps", int, None, "fast-dllm convention with --cache prefix|dual: Fast-dLLM's cached entropy "
         "mode with this many forwards (a multiple of the blocks) instead of the threshold.", optional=True, lo=1,
         hi=MAX_CANVAS, short="esteps"),
    Knob("ar_context", int, 0, "committed tokens left of the block the AR also reads.", lo=0, hi=MAX_CANVAS,
         short="ctx", recommend=True, show=True),
    Knob("ar_temperature", float, 0.0, "AR sampling temperature, 0 = greedy.", lo=0, hi=100, short="arT",
         default_text="--temperature", follows="temperature"),
    Knob("ar_repetition_penalty", float, 1.0, "penalty (CTRL) on ids already in the text for the AR's choices, "
         "1 = off.", lo=1, hi=10, short="rp", recommend=True, show=True),
    Knob("ar_syntax_guard", bool, False, "the AR may not choose a token Python would reject whatever follows (a "
         "stray closing bracket, a line break in a string, a wrong indent, `return x = y`, a header without ':', "
         "an end with something open; raw prompts).", short="sg", recommend=True),
    Knob("ar_no_repeat_ngram", int, 0, "the AR may not repeat an n-gram of ids the completion already holds.",
         off=0, lo=2, hi=64, short="ng", recommend=True),
    _ALG,
    Knob("early_stop", bool, True, "stop decoding at end-of-text (--no-early-stop decodes the whole canvas)."),
    Knob("stop", tuple, (), "End the output before the first generated line that starts with this text, e.g. "
         "--stop 'def ' --stop 'if __name__' (repeatable); decoding ends there too.", env=False),
    Knob("device", str, "auto", "auto, cpu, cuda, cuda:N, mps.", pattern=(r"auto|cpu|mps|cuda(:\d+)?", "auto | cpu | cuda | cuda:N | mps"),
         section="runtime"),
    Knob("dtype", str, "auto", "auto (bf16 on CUDA; on a CPU fp32, but bf16 for checkpoints stored in bf16 that "
         "are 2 GiB or more, or where a probe of the model's own shapes finds bf16 faster on this CPU, cached; "
         "bf16 with --quantize), float32, bfloat16, float16.", choices=DTYPES,
         section="runtime"),
    panels={"Decoding": ("decoder", "exact", "max_new_tokens", "temperature", "top_p", "top_k", "block_size", "tau", "stop"),
            "CoDiLA helper": ("candidate_blocks", "parallel_blocks", "conditioning", "ar_verify", "verify_penalty",
                              "cache_blocks", "ar_context", "ar_temperature", "ar_repetition_penalty",
                              "ar_syntax_guard", "ar_no_repeat_ngram"),
            "Runtime": ("device", "dtype")},
)

INFILL_KNOBS = KnobTable(
    Knob("initial_masks", int, 4, "Masks the middle starts with (n0; 0 = an empty middle, as DreamOn's loop).",
         lo=0, hi=4096, short="n0"),
    Knob("max_middle_tokens", int, 64, "Longest middle the model may write.", lo=1, hi=4096, short="max"),
    Knob("steps", int, None, "Cap on DLM forwards.", optional=True, lo=1, hi=MAX_CANVAS,
         default_text="4 x max-middle-tokens"),
    Knob("tokens_per_step", int, 1, "slots DreamOn commits per forward.", lo=1, hi=4096, short="K", flag=""),
    Knob("expand_budget", int, None, "Most <|expand|> steps (one mask becomes two).", optional=True, lo=0,
         short="exp", default_text="--max-middle-tokens, as DreamOn's evaluation generator"),
    Knob("broadcast_delete", bool, True, "a delete also removes every masked slot to its right (no flag).",
         flag="", env=False),
    replace(_ALG, help="confidence rule for which slots to reveal.", flag="",
            default_text="the DLM's generation_config.json, else entropy", choices=ALGS[1:]),
    *(replace(k, default_text="the DLM's generation_config.json, else " + ("0" if k.default == 0 else "none"),
              flag=None if k.name != "top_k" else "") for k in _SAMPLING),
    replace(_BLOCK_SIZE, help="codila: block size.", recommend=False),
    replace(_TAU, help="codila: mean-entropy threshold (nats).", default_text=f"{CODILA_INFILL_TAU:g} with --decoder codila"),
    replace(_EXACT, help="DreamOn's steps" + _EXACT.help.removeprefix("the tokens of one step at a time")),
)

_g, _i = GEN_KNOBS.default, INFILL_KNOBS.default  # gen's / infill's knobs (and eval's settings) defaults


_check_positive = partial(check_positive, limit=MAX_CANVAS)  # a count in 1 … limit (or None)


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is drawn from a marginal: ``--temperature``, ``--top-p``, ``--top-k``."""

    temperature: float = _g("temperature")
    top_p: float | None = _g("top_p")
    top_k: int | None = _g("top_k")

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be between 0 and 100, got {self.temperature}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top-k must be >= 1, got {self.top_k}")


@dataclass(frozen=True)
class DreamConfig:
    """Dream's ``diffusion_generate`` (arXiv 2508.15487; the model's ``generation_utils.py``).

    ``steps``: Dream's float schedule (about L/steps tokens per step, remainder in the last step).
    ``tokens_per_step``: codila's exact static schedule, K tokens per DLM forward (the last may be fewer).
    At most one of the two may be set; with neither, steps = max_new_tokens.
    """

    max_new_tokens: int = _g("max_new_tokens")
    steps: int | None = _g("steps")
    tokens_per_step: int | None = _g("tokens_per_step")
    alg: str = _g("alg")
    alg_temp: float | None = _g("alg_temp")
    eps: float = _g("eps")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = _g("early_stop")
    stop: tuple[str, ...] = _g("stop")
    exact_steps: bool = _g("exact_steps")
    exact: bool | None = _g("exact")  # None: on where it pays (engine/generate.py)
    needs_helper: ClassVar[bool] = False  # whether the decoder runs the AR helper (codila; infill with tau)

    def draws(self) -> bool:
        """Whether a decode draws at random (so two seeds may give two texts): origin draws its positions."""
        return self.sampling.temperature > 0 or self.alg_temp not in (None, 0) or self.alg == "origin"

    def __post_init__(self) -> None:
        _check_positive("max-new-tokens", self.max_new_tokens)
        check_stop(self.stop)
        _check_positive("steps", self.steps)
        _check_positive("tokens-per-step", self.tokens_per_step)
        if self.steps is not None and self.tokens_per_step is not None:
            raise ValueError("give either --steps or --tokens-per-step, not both")
        if self.alg not in ALGS:
            raise ValueError(f"alg must be one of {', '.join(ALGS)}, got {self.alg!r}")
        if self.alg_temp is not None and self.alg_temp < 0:
            raise ValueError(f"alg-temp must be >= 0, got {self.alg_temp}")
        if not (0.0 < self.eps < 1.0):
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if self.exact and (problem := exact_problem(self)):
            raise ValueError(problem)


@dataclass(frozen=True)
class ThresholdConfig:
    """Fast-dLLM confidence-threshold parallel decoding (arXiv 2505.22618)."""

    max_new_tokens: int = _g("max_new_tokens")
    block_length: int = _g("block_length")
    threshold: float = _g("threshold")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = _g("early_stop")
    stop: tuple[str, ...] = _g("stop")
    cache: str = _g("cache")
    convention: str = _g("convention")  # or "fast-dllm": the reference code's rules (decoding/threshold.py)
    entropy_steps: int | None = _g("entropy_steps")  # fast-dllm with a cache: its cached entropy mode
    needs_helper: ClassVar[bool] = False

    def draws(self) -> bool:
        return self.sampling.temperature > 0

    def __post_init__(self) -> None:
        _check_positive("max-new-tokens", self.max_new_tokens)
        check_stop(self.stop)
        _check_positive("block-length", self.block_length)
        if self.cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {self.cache!r}")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"threshold convention must be one of {', '.join(CONVENTIONS)}, got {self.convention!r}")
        if self.convention == "fast-dllm" and self.max_new_tokens % self.block_length:
            raise ValueError("the fast-dllm convention needs --max-new-tokens to be a multiple of --block-length "
                             "(without a cache its quota of slots per step; with one, Fast-dLLM's block loop "
                             "asserts it)")
        if not (0.0 < self.threshold <= 1.0):
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.entropy_steps is not None:
            _check_positive("entropy-steps", self.entropy_steps)
            blocks = -(-self.max_new_tokens // self.block_length)
            if self.convention != "fast-dllm" or self.cache == "none":
                raise ValueError("entropy steps are Fast-dLLM's cached entropy mode: they need the fast-dllm "
                                 "convention and a cache (prefix or dual)")
            if self.entropy_steps % blocks:
                raise ValueError(f"entropy steps ({self.entropy_steps}) must be a multiple of the number of "
                                 f"blocks ({blocks})")


@dataclass(frozen=True)
class CodilaConfig:
    """CoDiLA (arXiv 2603.20216; docs/codila.md).

    ``tau`` None = static parallelism (K = B per block); a float = dynamic parallelism with entropy
    threshold τ (nats). ``conditioning``: "soft" or "topk:K". ``ar_context``: the AR also reads up to
    that many committed tokens left of the block (0 = only the soft block, the paper's formula).
    ``ar_repetition_penalty``: CTRL's penalty on ids already in the text, applied to the AR's choices
    (1 = off; decoding/soft_ar.py). ``ar_syntax_guard``: the AR may not choose a token that makes the
    text invalid Python whatever follows (the rules of decoding/syntax_guard.py; raw completion
    prompts only). ``ar_no_repeat_ngram``: n > 0, the AR may not choose an id that repeats an n-gram
    of ids the completion already holds (0 = off). ``cache_blocks``: with a cache, the cache window spans this many
    B-slot blocks (None = the W candidate blocks); with W = 1 a window of several blocks is what lets
    the cache skip work (one refresh per window instead of one per block).
    """

    max_new_tokens: int = _g("max_new_tokens")
    block_size: int = _g("block_size")
    tau: float | None = _g("tau")
    candidate_blocks: int = _g("candidate_blocks")
    parallel_blocks: int = _g("parallel_blocks")
    conditioning: str = _g("conditioning")
    ar_temperature: float = _g("ar_temperature")
    ar_context: int = _g("ar_context")
    ar_repetition_penalty: float = _g("ar_repetition_penalty")
    ar_syntax_guard: bool = _g("ar_syntax_guard")
    ar_no_repeat_ngram: int = _g("ar_no_repeat_ngram")
    ar_verify: bool = _g("ar_verify")
    verify_penalty: float = _g("verify_penalty")
    alg: str = _g("alg")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = _g("early_stop")
    stop: tuple[str, ...] = _g("stop")
    cache: str = _g("cache")
    cache_blocks: int | None = _g("cache_blocks")
    needs_helper: ClassVar[bool] = True  # the AR helper writes every block

    def __post_init__(self) -> None:
        _check_positive("max-new-tokens", self.max_new_tokens)
        check_stop(self.stop)
        _check_positive("block-size", self.block_size, limit=256)
        _check_positive("cache-blocks", self.cache_blocks, limit=4096)
        if self.cache_blocks is not None and self.cache == "none":
            raise ValueError("--cache-blocks sets the window of a cache: add --cache prefix or --cache dual")
        if self.cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {self.cache!r}")
        if self.cache != "none" and self.ar_verify:
            raise ValueError("--cache works with the static and dynamic CoDiLA schedules, not --ar-verify")
        _check_positive("candidate-blocks", self.candidate_blocks)
        _check_positive("parallel-blocks", self.parallel_blocks, limit=16)
        if self.tau is not None and not (0.0 <= self.tau <= 100.0):
            raise ValueError(f"tau must be between 0 and 100 nats, got {self.tau}")
        if self.conditioning != "soft":
            head, _, k = self.conditioning.partition(":")
            if head != "topk" or not k.isdigit() or int(k) < 1:
                raise ValueError(f"conditioning must be 'soft' or 'topk:K' with K >= 1, got {self.conditioning!r}")
        if not (0.0 <= self.ar_temperature <= 100.0):
            raise ValueError(f"ar-temperature must be between 0 and 100, got {self.ar_temperature}")
        if self.ar_no_repeat_ngram != 0 and not 2 <= self.ar_no_repeat_ngram <= 64:
            raise ValueError(f"ar-no-repeat-ngram must be 0 (off) or between 2 and 64, got {self.ar_no_repeat_ngram}")
        if not (1.0 <= self.ar_repetition_penalty <= 10.0):
            raise ValueError(f"ar-repetition-penalty must be between 1 and 10, got {self.ar_repetition_penalty}")
        if not (0 <= self.ar_context <= MAX_CANVAS):
            raise ValueError(f"ar-context must be >= 0, got {self.ar_context}")
        if self.alg not in ALGS[1:]:
            raise ValueError(f"alg must be one of {', '.join(ALGS[1:])}, got {self.alg!r}")
        if not (0.0 <= self.verify_penalty <= 1.0):
            raise ValueError(f"verify-penalty must be in [0, 1], got {self.verify_penalty}")
        if self.ar_verify and self.tau is not None:
            raise ValueError("--ar-verify replaces the block schedule; do not combine it with --tau")

    def draws(self) -> bool:
        """Static CoDiLA's helper writes every token (the DLM's temperature is never used); dynamic
        CoDiLA and verification also commit DLM tokens, drawn at the DLM's temperature."""
        if self.ar_verify:
            return self.sampling.temperature > 0
        return self.ar_temperature > 0 or (self.tau is not None and self.sampling.temperature > 0)

    @property
    def topk(self) -> int | None:
        return None if self.conditioning == "soft" else int(self.conditioning.split(":")[1])


@dataclass(frozen=True)
class InfillConfig:
    """DreamOn variable-length infilling (arXiv 2602.01326; docs/infill.md), optionally with CoDiLA blocks (``tau``).

    ``initial_masks`` n0 slots start the middle; a predicted expand turns one mask into two (at most ``expand_budget``
    times: by default ``max_middle_tokens``, DreamOn's evaluation generator's rule); a predicted delete (end-of-text)
    removes its slot, and with ``broadcast_delete`` every masked slot to its right too. The middle never exceeds
    ``max_middle_tokens``. ``steps`` caps DLM forwards (default 4·max_middle_tokens). ``exact``: decoding/freedave.py.
    """

    initial_masks: int = _i("initial_masks")
    max_middle_tokens: int = _i("max_middle_tokens")
    steps: int | None = _i("steps")
    tokens_per_step: int = _i("tokens_per_step")
    expand_budget: int | None = _i("expand_budget")  # None: max_middle_tokens (DreamOn's rule)
    broadcast_delete: bool = _i("broadcast_delete")
    alg: str = _i("alg")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    block_size: int = _i("block_size")
    tau: float | None = _i("tau")  # set (with an AR helper) = CoDiLA dynamic mode on the middle
    exact: bool | None = _i("exact")  # None: on where it pays (engine/generate.py::exact_pays)

    HELPER_ONLY: ClassVar[tuple[str, ...]] = ("block_size", "tau")  # what only CoDiLA on the middle reads

    @classmethod
    def from_given(cls, given: Mapping[str, Any], *, helper: bool) -> InfillConfig:
        """The config of the values ``given`` by knob name (None or absent: the table's default). With the
        AR helper τ defaults to CODILA_INFILL_TAU; without it τ is off (DreamOn alone)."""
        tau = given.get("tau")
        return from_given(INFILL_KNOBS, cls, given, tau=(CODILA_INFILL_TAU if tau is None else tau) if helper else None)

    @property
    def budget(self) -> int:
        """Expansions allowed: ``expand_budget``, or ``max_middle_tokens`` when it is None."""
        return self.max_middle_tokens if self.expand_budget is None else self.expand_budget

    @property
    def needs_helper(self) -> bool:
        """CoDiLA on the middle (``tau`` set): the AR helper writes the low-entropy blocks."""
        return self.tau is not None

    def context_room(self, context_length: int) -> int:
        """Tokens of a ``context_length`` context left for the prefix and suffix around the longest middle."""
        return context_length - self.max_middle_tokens - 2

    def room_problem(self, context_length: int) -> str | None:
        """Why this fill cannot run in a ``context_length`` context (under 16 tokens left for the prefix
        and suffix), or None; the CLI and the server word their own error around it."""
        if self.context_room(context_length) >= 16:
            return None
        return (f"a middle of up to {self.max_middle_tokens} tokens leaves no room for context "
                f"(the model's context is {context_length} tokens)")

    def __post_init__(self) -> None:
        _check_positive("max-middle-tokens", self.max_middle_tokens, limit=4096)
        if not 0 <= self.initial_masks <= self.max_middle_tokens:
            raise ValueError(f"initial-masks must be between 0 and max-middle-tokens ({self.max_middle_tokens}), "
                             f"got {self.initial_masks}")
        _check_positive("steps", self.steps)
        _check_positive("tokens-per-step", self.tokens_per_step, limit=4096)
        _check_positive("block-size", self.block_size, limit=256)
        if self.expand_budget is not None and self.expand_budget < 0:
            raise ValueError("expand-budget must be >= 0")
        if self.alg not in ALGS[1:]:
            raise ValueError(f"alg must be one of {', '.join(ALGS[1:])}, got {self.alg!r}")
        if self.tau is not None and not (0.0 <= self.tau <= 100.0):
            raise ValueError(f"tau must be between 0 and 100 nats, got {self.tau}")
        if self.exact and (problem := exact_problem(self) or self.tau is not None and "--exact runs DreamOn's own "
                           "steps, and CoDiLA's blocks are the helper's writes (drop --decoder codila or --exact)"):
            raise ValueError(problem)

    def draws(self) -> bool:
        return self.sampling.temperature > 0
