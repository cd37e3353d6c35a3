"""SDDC's settings (``codila plan``; docs/plan.md): frozen and validated like the decoders' configs in
decoding/config.py, with their own knob table (``PLAN_KNOBS``): the defaults, ranges, flags and help
of plan's settings are declared there once."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from codila_cli.decoding.config import INFILL_KNOBS, MAX_CANVAS, SamplingConfig, _check_positive
from codila_cli.decoding.knobs import Knob, KnobTable

SCHEDULES = ("default", "end-after-entry", "pad-scan", "left-to-right")
ATTENTION = ("coupled", "isolated")

PLAN_KNOBS = KnobTable(
    Knob("max_units", int, 4, "Entry slots in the contract template.", lo=1, hi=32, env=False),
    Knob("def_slots", int, 3, "identifier slots for what a unit defines (no flag).", lo=1, hi=16, flag="", env=False),
    Knob("use_slots", int, 3, "identifier slots for what a unit uses (no flag).", lo=1, hi=16, flag="", env=False),
    Knob("contract_schedule", str, "default", "the order the contract canvas is unmasked in.", choices=SCHEDULES,
         env=False),
    Knob("pad_scale", float, 1.25, "Canvas length = ceil(pad_scale x budget).", lo=0.1, hi=20, env=False),
    Knob("min_canvas", int, 8, "the shortest unit canvas (no flag).", lo=1, hi=4096, flag="", env=False),
    Knob("min_unit_tokens", int, 8, "No unit may end (end-of-text) before this many tokens.", lo=0, hi=4096,
         env=False),
    Knob("attention", str, "coupled", "coupled (canvases see each other) or isolated.", choices=ATTENTION, env=False),
    Knob("max_iterations", int, 2000, "cap on denoising iterations (no flag).", lo=1, hi=MAX_CANVAS, flag="",
         env=False),
    *(replace(INFILL_KNOBS[n], flag="" if n != "temperature" else None, env=False)
      for n in ("temperature", "top_p", "top_k")),
    panels={"Decoding": ("max_units", "pad_scale", "temperature"),
            "Decoder internals": ("contract_schedule", "min_unit_tokens", "attention")},
)
_p = PLAN_KNOBS.default


@dataclass(frozen=True)
class PlanConfig:
    """SDDC (docs/plan.md): contract, then every unit canvas denoised together, then assembly.

    ``commit``: None = "single" (one token per active canvas per iteration), else the threshold γ_u
    (every masked slot with confidence ≥ γ_u, at least one per active canvas).
    """

    max_units: int = _p("max_units")
    def_slots: int = _p("def_slots")
    use_slots: int = _p("use_slots")
    contract_schedule: str = _p("contract_schedule")
    pad_scale: float = _p("pad_scale")
    min_canvas: int = _p("min_canvas")
    min_unit_tokens: int = _p("min_unit_tokens")
    attention: str = _p("attention")
    commit: float | None = None  # --commit: "single" (None) or γ_u (contract.py::parse_commit)
    budget_menu: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 192, 256)
    max_iterations: int = _p("max_iterations")
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
        if self.attention not in ATTENTION:
            raise ValueError("attention must be 'coupled' or 'isolated'")
        if self.commit is not None and not (0.0 < self.commit <= 1.0):
            raise ValueError(f"commit threshold must be in (0, 1], got {self.commit}")
