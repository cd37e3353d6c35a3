"""SDDC's settings (``codila plan``; docs/plan.md): frozen and validated like the decoders' configs in
decoding/config.py, but not knobs of `gen`'s table (plan has its own flags, cli/plan.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from codila_cli.decoding.config import SamplingConfig, _check_positive

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
