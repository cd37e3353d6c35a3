"""Frozen, validated decoder settings. Each field maps 1:1 to a `codila gen` flag (docs/flags.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
CONVENTIONS = ("codila", "fast-dllm")
CACHES = ("none", "prefix", "dual")
MAX_CANVAS = 100_000


def _check_positive(name: str, value: int | None, *, limit: int = MAX_CANVAS) -> None:
    if value is not None and not (1 <= value <= limit):
        raise ValueError(f"{name} must be between 1 and {limit}, got {value}")


def _check_stop(stop: tuple[str, ...]) -> None:
    if not isinstance(stop, tuple):
        raise ValueError(f"stop must be a tuple of line prefixes, got {type(stop).__name__}")  # noqa: TRY004 -- config errors are ValueErrors
    for prefix in stop:
        if not prefix or "\n" in prefix or "\r" in prefix:
            raise ValueError(f"stop: each prefix is the non-empty start of one line, got {prefix!r}")


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is drawn from a marginal: ``--temperature``, ``--top-p``, ``--top-k``."""

    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None

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

    max_new_tokens: int = 128
    steps: int | None = None
    tokens_per_step: int | None = None
    alg: str = "entropy"
    alg_temp: float | None = None
    eps: float = 1e-3
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = True
    stop: tuple[str, ...] = ()  # --stop: a generated line starting with one of these ends the output
    exact_steps: bool = False  # --exact-steps: one forward per step, as the official loop (same tokens)

    def __post_init__(self) -> None:
        _check_positive("max-new-tokens", self.max_new_tokens)
        _check_stop(self.stop)
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


@dataclass(frozen=True)
class ThresholdConfig:
    """Fast-dLLM confidence-threshold parallel decoding (arXiv 2505.22618)."""

    max_new_tokens: int = 128
    block_length: int = 32
    threshold: float = 0.9
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = True
    stop: tuple[str, ...] = ()  # --stop: a generated line starting with one of these ends the output
    cache: str = "none"
    convention: str = "codila"  # or "fast-dllm": the reference code's rules (decoding/threshold.py)
    entropy_steps: int | None = None  # fast-dllm with a cache: its cached entropy mode, this many forwards in all

    def __post_init__(self) -> None:
        _check_positive("max-new-tokens", self.max_new_tokens)
        _check_stop(self.stop)
        _check_positive("block-length", self.block_length)
        if self.cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {self.cache!r}")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"threshold convention must be one of {', '.join(CONVENTIONS)}, got {self.convention!r}")
        if self.convention == "fast-dllm" and self.cache == "none" and self.max_new_tokens % self.block_length:
            raise ValueError("the fast-dllm convention without a cache needs --max-new-tokens to be a multiple of "
                             "--block-length (its quota of slots per step)")
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

    max_new_tokens: int = 128
    block_size: int = 4
    tau: float | None = None
    candidate_blocks: int = 10
    parallel_blocks: int = 1
    conditioning: str = "soft"
    ar_temperature: float = 0.0
    ar_context: int = 0
    ar_repetition_penalty: float = 1.0
    ar_syntax_guard: bool = False
    ar_no_repeat_ngram: int = 0
    ar_verify: bool = False
    verify_penalty: float = 0.5
    alg: str = "entropy"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = True
    stop: tuple[str, ...] = ()  # --stop: a generated line starting with one of these ends the output
    cache: str = "none"
    cache_blocks: int | None = None

    def __post_init__(self) -> None:
        _check_positive("max-new-tokens", self.max_new_tokens)
        _check_stop(self.stop)
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

    @property
    def topk(self) -> int | None:
        return None if self.conditioning == "soft" else int(self.conditioning.split(":")[1])


@dataclass(frozen=True)
class InfillConfig:
    """DreamOn variable-length infilling (arXiv 2602.01326; docs/infill.md), optionally with CoDiLA blocks (``tau``).

    ``initial_masks`` n0 slots start the middle; a predicted expand turns one mask into two (at most
    ``expand_budget`` times: by default ``max_middle_tokens``, DreamOn's evaluation generator's rule); a predicted delete (end-of-text) removes its
    slot, and with ``broadcast_delete`` every masked slot to its right too. The middle never exceeds
    ``max_middle_tokens``. ``steps`` caps DLM forwards (default 4·max_middle_tokens).
    """

    initial_masks: int = 4
    max_middle_tokens: int = 64
    steps: int | None = None
    tokens_per_step: int = 1
    expand_budget: int | None = None  # None: max_middle_tokens (DreamOn's rule)
    broadcast_delete: bool = True
    alg: str = "entropy"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    block_size: int = 4
    tau: float | None = None  # set (with an AR helper) = CoDiLA dynamic mode on the middle

    @property
    def budget(self) -> int:
        """Expansions allowed: ``expand_budget``, or ``max_middle_tokens`` when it is None."""
        return self.max_middle_tokens if self.expand_budget is None else self.expand_budget

    def __post_init__(self) -> None:
        _check_positive("initial-masks", self.initial_masks, limit=4096)
        _check_positive("max-middle-tokens", self.max_middle_tokens, limit=4096)
        _check_positive("steps", self.steps)
        _check_positive("tokens-per-step", self.tokens_per_step, limit=4096)
        _check_positive("block-size", self.block_size, limit=256)
        if self.initial_masks > self.max_middle_tokens:
            raise ValueError("initial-masks must not exceed max-middle-tokens")
        if self.expand_budget is not None and self.expand_budget < 0:
            raise ValueError("expand-budget must be >= 0")
        if self.alg not in ALGS[1:]:
            raise ValueError(f"alg must be one of {', '.join(ALGS[1:])}, got {self.alg!r}")
        if self.tau is not None and not (0.0 <= self.tau <= 100.0):
            raise ValueError(f"tau must be between 0 and 100 nats, got {self.tau}")


SCHEDULES = ("default", "end-after-entry", "pad-scan", "left-to-right")


@dataclass(frozen=True)
class PlanConfig:
    """SDDC (docs/plan.md): contract, then every unit canvas denoised together, then assembly.

    ``commit``: None = "single" (one token per active canvas per iteration), else the threshold γ_u
    (every masked slot with confidence ≥ γ_u, at least one per active canvas).
    """

    max_units: int = 4
    def_slots: int = 3
    use_slots: int = 3
    contract_schedule: str = "default"
    pad_scale: float = 1.25
    min_canvas: int = 8
    min_unit_tokens: int = 8
    attention: str = "coupled"
    commit: float | None = None
    budget_menu: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 192, 256)
    max_iterations: int = 2000
    defines: tuple[str, ...] = ()
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self) -> None:
        _check_positive("max-units", self.max_units, limit=32)
        import keyword

        for name in self.defines:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise ValueError(f"defines: {name!r} is not a Python identifier")
            if len(name) > 64:
                raise ValueError(f"defines: {name[:20]!r}… is longer than 64 characters")
        if len(set(self.defines)) != len(self.defines):
            raise ValueError("defines: a name is listed twice")
        if len(self.defines) > self.max_units:
            raise ValueError(f"defines: {len(self.defines)} names but only {self.max_units} units (raise max-units)")
        _check_positive("def-slots", self.def_slots, limit=16)
        _check_positive("use-slots", self.use_slots, limit=16)
        _check_positive("min-canvas", self.min_canvas, limit=4096)
        if not (0 <= self.min_unit_tokens <= 4096):
            raise ValueError(f"min-unit-tokens must be between 0 and 4096, got {self.min_unit_tokens}")
        _check_positive("max-iterations", self.max_iterations)
        if self.contract_schedule not in SCHEDULES:
            raise ValueError(f"contract-schedule must be one of {', '.join(SCHEDULES)}")
        if not (0.1 <= self.pad_scale <= 20.0):
            raise ValueError(f"pad-scale must be between 0.1 and 20, got {self.pad_scale}")
        if self.attention not in ("coupled", "isolated"):
            raise ValueError("attention must be 'coupled' or 'isolated'")
        if self.commit is not None and not (0.0 < self.commit <= 1.0):
            raise ValueError(f"commit threshold must be in (0, 1], got {self.commit}")
