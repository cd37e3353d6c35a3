"""``codila train STAGE``'s options, checked before anything loads: which stage takes which option,
in what range, and what a stage needs from the run directory. Raises UsageError (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codila_cli.errors import UsageError

MODEL_STAGES = ("arinit", "dlm", "sft", "ar", "tasks")  # `codila train align` has options of its own


def _only(stage: str, stages: tuple[str, ...], flag: str) -> None:
    if stage not in stages:
        names = " and ".join(stages) if len(stages) < 3 else ", ".join(stages[:-1]) + " and " + stages[-1]
        raise UsageError(f"{flag} applies to the {names} stage{'s' if len(stages) > 1 else ''} only",
                         hint=f"drop {flag} for this stage" if len(stages) > 1 else
                         f"drop {flag}, or train the {stages[0]} stage")


def stage_options(stage: str, *, shape: str = "base", init: Path | None = None, frontier: float | None = None,
                  batch: int | None = None, lr: float | None = None, bare_body: str | None = None,
                  seed: int | None = None) -> dict[str, Any]:
    """The keyword arguments of ``stages.stage_<stage>`` for the flags given (None = the stage's own)."""
    from codila_cli.train.networks import AR_SHAPES

    extra: dict[str, Any] = {}
    if shape not in AR_SHAPES:
        raise UsageError(f"--shape must be one of {', '.join(AR_SHAPES)}, got {shape!r}", hint="see `codila train --help`")
    if stage == "ar":
        extra["shape"] = shape
    elif shape != "base":
        raise UsageError("--shape applies to the ar stage only", hint="drop --shape, or train the ar stage")
    if init is not None:
        _only(stage, ("sft", "ar", "tasks"), "--init")
        if not (init / "model.safetensors").is_file():
            raise UsageError(f"--init {init} has no model.safetensors", hint="point at an exported checkpoint directory")
        extra["init"] = init
    if frontier is not None:
        if stage != "sft":
            raise UsageError("--frontier applies to the sft stage only", hint="drop --frontier for this stage")
        if not 0.0 <= frontier <= 1.0:
            raise UsageError(f"--frontier must be between 0 and 1, got {frontier}", hint="e.g. --frontier 0.75")
        extra["frontier"] = frontier
    if bare_body is not None:
        from codila_cli.train.data import BARE_BODIES

        _only(stage, ("sft", "ar"), "--bare-body")
        if bare_body not in BARE_BODIES:
            raise UsageError(f"--bare-body must be one of {', '.join(BARE_BODIES)}, got {bare_body!r}",
                             hint="e.g. --bare-body code")
        extra["bare_body"] = bare_body
    if batch is not None:
        if not 1 <= batch <= 4096:
            raise UsageError(f"--batch must be between 1 and 4096, got {batch}", hint="e.g. --batch 32")
        extra["batch"] = batch
    if lr is not None:
        if not 0.0 < lr <= 1.0:
            raise UsageError(f"--lr must be in (0, 1], got {lr}", hint="e.g. --lr 3e-4")
        extra["lr"] = lr
    if seed is not None:
        if not 0 <= seed < 2**32:
            raise UsageError(f"--seed must be between 0 and 2**32 - 1, got {seed}", hint="e.g. --seed 19")
        extra["seed"] = seed
    return extra


def check_run_dir(stage: str, run_dir: Path) -> None:
    """A stage's inputs exist: the tokenizer needs the corpus, a model stage the tokenizer."""
    if stage == "tokenizer" and not (run_dir / "corpus" / "train.jsonl").is_file():
        raise UsageError(f"no corpus in {run_dir}", hint=f"run `codila train corpus --run-dir {run_dir}` first")
    if stage in MODEL_STAGES and not (run_dir / "tokenizer" / "tokenizer.json").is_file():
        raise UsageError(f"no tokenizer in {run_dir}", hint=f"run `codila train tokenizer --run-dir {run_dir}` first")


def check_stage_paths(stage: str, *, site: Path | None, reuse: Path | None) -> None:
    """``--site`` (corpus) is a directory; ``--reuse`` (tokenizer) is a checkpoint with a tokenizer."""
    if site is not None:
        _only(stage, ("corpus",), "--site")
        if not site.is_dir():
            raise UsageError(f"--site {site} is not a directory",
                             hint="pip install --no-deps --target DIR -r scripts/corpus-packages.txt")
    if reuse is not None:
        _only(stage, ("tokenizer",), "--reuse")
        missing = [f for f in ("tokenizer.json", "tokenizer_config.json") if not (reuse / f).is_file()]
        if missing:
            raise UsageError(f"--reuse {reuse} has no {' or '.join(missing)}",
                             hint="point at a checkpoint directory, e.g. the bundled DLM (codila models)")


def export_decoding(pairs: list[str]) -> dict | None:
    """``--decoding KEY=VALUE`` of ``codila train export`` (helper_card.parse_pairs); None when none is given."""
    from codila_cli.helper_card import parse_pairs

    try:
        return parse_pairs(pairs) or None
    except ValueError as exc:
        from codila_cli.decoding.config import GEN_KNOBS

        raise UsageError(f"{exc}: not a recommendable CoDiLA setting",
                         hint=f"KEY is one of {', '.join(GEN_KNOBS.recommendable())}; B8.KEY=VALUE sets it for "
                              "block size 8 only (docs/settings.md)") from None
