"""One ``codila eval`` run around the runner: which settings, which models, where the rows go, and the
warnings worth giving before a long run starts. Nothing here prints; the command renders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codila_cli.errors import UsageError
from codila_cli.ui.terminal import say


@dataclass(frozen=True)
class EvalPlan:
    settings: list  # eval.settings.Setting
    dlm: str
    ar: str | None
    infill: bool


def is_infill(benchmark: str) -> bool:
    """The he-infill benchmarks, and a user's task file whose tasks have a ``suffix``."""
    from codila_cli.eval.benchmarks import is_user_file, load_user_tasks

    if is_user_file(benchmark) and Path(benchmark).expanduser().is_file():
        return load_user_tasks(Path(benchmark).expanduser())[0].kind == "infill"
    return benchmark.startswith("he-infill")


def need_extras() -> None:
    """matplotlib draws pareto.png: missing, it is a usage error before anything decodes."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("codila eval needs matplotlib (for pareto.png), which is not installed",
                         hint="pip install 'codila[eval]'")


def choose_settings(*, benchmark: str, labels: list[str], sweep: bool, dlm: str | None, ar: str | None,
                    max_new_tokens: int) -> EvalPlan:
    """The settings to run (``--setting``s, the paper's grid with ``--sweep``, else what `codila gen` runs
    by default) and the models; every setting must fit the benchmark (dreamon:… for he-infill-*)."""
    from codila_cli.engine.models import default_ar, default_dlm, default_infill_dlm
    from codila_cli.eval.settings import EXAMPLES, INFILL_GRID, PAPER_GRID, parse_setting, recommended_label
    from codila_cli.helper_card import recommended_decoding

    infill = is_infill(benchmark)
    labels = list(labels) + ((INFILL_GRID if infill else PAPER_GRID) if sweep else [])
    if infill:
        labels = labels or INFILL_GRID[:1]
    ar_name = ar or (default_ar() if dlm is None else None)
    if not labels:  # what `codila gen` runs by default: CoDiLA with the helper's recommendation, else dream
        labels = [recommended_label(recommended_decoding(ar_name)) if ar_name else PAPER_GRID[0]]
    try:
        parsed = [parse_setting(s, max_new_tokens=max_new_tokens) for s in labels]
    except ValueError as exc:
        raise UsageError(str(exc), hint=f"a setting is DECODER:key=value,…, e.g. {EXAMPLES[-1]} "
                         "(docs/evaluation.md, Settings)") from None
    wrong = [p.label for p in parsed if (p.decoder == "dreamon") != infill]
    if wrong:
        raise UsageError(f"setting {wrong[0]!r} does not fit {benchmark}", hint=(
            f"infill benchmarks take dreamon:… settings (e.g. {', '.join(INFILL_GRID[::2])})" if infill
            else "dreamon:… settings are for the he-infill-single / he-infill-multi benchmarks"))
    if any(p.config.needs_helper for p in parsed) and not ar_name:
        raise UsageError("codila settings need an AR helper", hint="pass --ar")
    return EvalPlan(parsed, dlm or (default_infill_dlm() if infill else default_dlm()), ar_name, infill)


def prepare_output(output: Path) -> None:
    """Check, before the models load and the run starts, that the output directory can be written;
    it is created with the run's first row (a refused run leaves no empty directory)."""
    from codila_cli.atomic import creatable_dir_problem

    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory",
                         hint="give a directory (it is created if missing)")
    problem = creatable_dir_problem(output)
    if problem:
        raise UsageError(f"cannot write --output {output}: {problem}",
                         hint="give a directory you can write to (it is created if missing)")


def run_warnings(models: Any, tasks: list, settings: list, *, max_new_tokens: int) -> list[str]:
    """What to tell the user before the run: tasks that do not fit the context, and (a codila setting) what
    helper_card.py::helper_warnings says of the helper."""
    from codila_cli.helper_card import helper_warnings

    long = too_long_warning(models, tasks, settings, max_new_tokens=max_new_tokens)
    return [*([long] if long else []), *(helper_warnings(models) if any(s.config.needs_helper for s in settings) else [])]


def too_long_warning(models: Any, tasks: list, settings: list, *, max_new_tokens: int) -> str | None:
    """A warning naming the tasks whose prompt and canvas do not fit the model's context, or None."""
    from codila_cli.eval.runner import too_long

    long = [t.task_id for t in tasks if any(too_long(models, t, p) for p in settings)]
    if not long:
        return None
    one = len(long) == 1
    return (f"{len(long)} of {len(tasks)} tasks {'does' if one else 'do'} not fit the model's context of "
            f"{models.dlm.context_length} tokens with --max-new-tokens {max_new_tokens} "
            f"({', '.join(long[:3])}{', …' if len(long) > 3 else ''}); {'it counts' if one else 'they count'} as "
            f"failed (status too-long). Lower --max-new-tokens to include {'it' if one else 'them'}.")


class PartialRows:
    """``rows.rank<R>.partial.jsonl``: every finished row, flushed as it comes, so an interrupted run
    keeps its work; :meth:`discard` removes it once the results are safely written."""

    def __init__(self, output: Path, rank: int) -> None:
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create --output {output}: {exc.strerror or exc}",
                             hint="give a directory you can write to") from None
        self.path = output / f"rows.rank{rank}.partial.jsonl"
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 -- held open for the run, closed by close()
        self.rows: list[dict] = []

    @property
    def count(self) -> int:
        return len(self.rows)

    def write(self, row: dict) -> None:
        self._fh.write(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}) + "\n")
        self._fh.flush()
        self.rows.append(row)

    def close(self) -> None:
        self._fh.close()

    def discard(self) -> None:
        self.close()
        self.path.unlink()


def need_jail(unsafe: bool, *, quiet: bool = False, limits: Any = None) -> None:
    """Refuse, before any model loads, to run generated code where no jail exists (unless ``unsafe``); with
    a jail, warn about each of ``limits`` it cannot enforce here (issue 53: said, not assumed)."""

    from codila_cli.eval.jail import detect, limit_gaps

    jail = detect()
    if jail.kind != "none":
        for gap in limit_gaps(limits) if limits is not None and not quiet else ():
            say(f"Warning: {gap}\n")
        return
    if not unsafe:
        raise UsageError(f"no jail to run generated code in: {jail.why}",
                         hint="install bubblewrap (apt install bubblewrap), or pass --unsafe-local-exec to run the "
                              "programs without one (docs/evaluation.md)")
    if not quiet:
        say(f"Warning: running generated code without a jail ({jail.why}): --unsafe-local-exec\n")

