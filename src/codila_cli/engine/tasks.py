"""Infilling (DreamOn, optionally with the CoDiLA helper) and planning (SDDC) on loaded models."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from codila_cli.decoding.events import OnStep, no_op
from codila_cli.engine.models import Models
from codila_cli.errors import UsageError
from codila_cli.models.tokens import encode_text


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
        return self.syntax_after.checked and self.syntax_before.valid and not self.syntax_after.valid


def refuse_unsupported(dlm: Any, task: str) -> None:
    """A UsageError when the DLM's family row says ``task`` ("infill", "plan") does not run it."""
    family = getattr(dlm, "family", None)
    if family is None or (family.plan if task == "plan" else family.infill != "no"):
        return
    how = ("it writes left to right, block by block, against a cache of the blocks before, so infill, plan and the "
           "whole-canvas decoders do not run it") if family.block_diffusion else f"codila {task} does not run that family"
    raise UsageError(f"{dlm.name} is a {family.name} model: {how}",
                     hint="`codila models` lists what each family supports; codila gen runs every family")


def context_cut(dlm: Any, prefix: str, suffix: str, *, config: Any) -> tuple[list[int], list[int], dict]:
    """The prefix's and suffix's token ids cut to the model's context around the fill point (2/3 of the
    room for the prefix), and the cut: ``prefix_tokens``/``suffix_tokens`` given, ``prefix_kept``/``suffix_kept``."""
    tok = dlm.tokenizer
    p_ids, s_ids = encode_text(tok, prefix), encode_text(tok, suffix)
    problem = config.room_problem(dlm.context_length)
    if problem:
        raise UsageError(problem, hint="ask for a shorter middle")
    room = config.context_room(dlm.context_length)
    cut = {"prefix_tokens": len(p_ids), "suffix_tokens": len(s_ids), "prefix_kept": len(p_ids), "suffix_kept": len(s_ids)}
    if len(p_ids) + len(s_ids) > room:
        keep_s = min(len(s_ids), max(room // 3, room - len(p_ids)))
        keep_p = room - keep_s
        p_ids, s_ids = p_ids[len(p_ids) - keep_p :], s_ids[:keep_s]
        cut.update(prefix_kept=len(p_ids), suffix_kept=len(s_ids))
    return p_ids, s_ids, cut


def infill_tokens(models: Models, prefix: str, suffix: str, *, config: Any, seed: int | None = None,
                  on_step: OnStep = no_op, batcher: Any = None, on_row: Any = None) -> tuple[Any, dict, int]:
    """DreamOn (or CoDiLA) decoding of the middle between two texts; returns (InfillResult, context cut, seed).

    Prefix and suffix are cut to the model's context around the fill point (2/3 of the room for the prefix).
    ``batcher``/``on_row``: decode as one row of a shared batch (engine/generate.py::generate).
    """
    import torch

    from codila_cli.decoding.dreamon import decode_dreamon
    from codila_cli.engine.generate import exact_pays

    dlm = models.dlm
    refuse_unsupported(dlm, "infill")
    p_ids, s_ids, cut = context_cut(dlm, prefix, suffix, config=config)
    seed = secrets.randbelow(2**31) if seed is None else seed
    if batcher is None:
        torch.manual_seed(seed)
    gen = torch.Generator(device=dlm.device).manual_seed(seed)
    writer = None
    if config.needs_helper:
        if models.ar is None:
            raise UsageError("CoDiLA infill needs an AR helper, and none is loaded", hint="load one with the DLM (--ar)")
        from codila_cli.decoding.bridged import make_writer

        # the helper samples at the same temperature as DreamOn's own steps (greedy at 0)
        writer = make_writer(models.ar, models.bridge, temperature=config.sampling.temperature)
    def fill(dlm: Any) -> Any:
        if exact_pays(dlm, "dreamon", config):  # FreeDave: DreamOn's steps in fewer sequential forwards
            from codila_cli.decoding.freedave import fill_exact

            return fill_exact(dlm, prefix_ids=p_ids, suffix_ids=s_ids, config=config, on_step=on_step)
        return decode_dreamon(dlm, prefix_ids=p_ids, suffix_ids=s_ids, config=config, writer=writer, generator=gen,
                              on_step=on_step)

    if batcher is None:
        return fill(dlm), cut, seed
    from codila_cli.decoding.batch import RowAR, RowDLM

    with batcher.row(on_row) as row:
        if writer is not None:
            writer.ar = RowAR(models.ar, batcher, row)
        res = fill(RowDLM(batcher, row, dlm))
    return res, cut, seed


def infill(models: Models, src: Any, region: Any, *, config: Any, seed: int | None = None,
           instruction: str | None = None, on_step: OnStep = no_op) -> InfillOutcome:
    """Fill ``region`` of ``src`` (infill_files.Source) with DreamOn decoding (CoDiLA when the config needs the helper)."""
    from codila_cli.infill_files import patch, place_middle, split
    from codila_cli.syntax import check_code

    prefix, suffix = split(src, region)
    view_prefix = (src.rules.comment_line(f"Instruction: {instruction.strip()}") + "\n" if instruction else "") + prefix
    res, cut, seed = infill_tokens(models, view_prefix, suffix, config=config, seed=seed, on_step=on_step)
    tok = models.dlm.tokenizer
    middle = place_middle(src, region, tok.decode(res.middle, skip_special_tokens=True))
    new_text = patch(src, region, middle)
    before = len(prefix)
    metrics = {"dlm_forwards": res.dlm_forwards, "ar_forwards": res.ar_forwards, "steps": res.steps,
               "middle_tokens": len(res.middle), "expansions": res.expansions, "deletions": res.deletions,
               "tokens_per_step": (len(res.middle) + res.deletions + res.expansions) / res.dlm_forwards
               if res.dlm_forwards else 0.0, "wall_seconds": res.seconds, "truncated": res.truncated,
               "load_seconds": round(models.load_seconds, 3),
               "dlm_rows": res.dlm_rows, "freedave": res.freedave}
    return InfillOutcome(middle, new_text, seed, metrics, check_code(src.text, language=src.language),
                         check_code(new_text, language=src.language, span=(before, before + len(middle))), cut)


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
    refuse_unsupported(dlm, "plan")
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
