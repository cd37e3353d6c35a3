"""SDDC: Self-Decomposing Diffusion for Code (Shao et al., Oct 2026; docs/plan.md).

1. Contract: a fixed template ``@unit k role=… budget=… def=… use=…`` per entry slot, template tokens
   committed and each field value a masked slot restricted to legal tokens (role words, budget numbers,
   identifier pieces, end-of-text = empty), decoded one slot per forward under a contract schedule.
2. Canvases: entry k gets ``# unit k`` (binding marker, removed at assembly) + a code stub
   (``def name(`` / ``class Name``) committed, then ceil(pad_scale · budget) masks (length-scaled padding).
   End-of-text is barred from a canvas's first ``min_unit_tokens`` slots (like ``min_new_tokens`` in AR
   generation), so a unit cannot end before it has a body.
3. All canvases denoised together: per forward, in each active canvas, the single most confident slot
   ("single") or every slot with confidence ≥ γ_u (at least one). ``isolated`` attention lets a canvas
   see only the prompt, the contract and itself (a pairwise mask; positions restart after the contract).
4. Assembly: markers and padding removed, units joined in index order.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

import torch

from codila_cli.contract import ROLES, Contract, ContractError, Entry, parse_contract, single_unit
from codila_cli.decoding.events import OnStep, StepEvent, no_op
from codila_cli.decoding.marginals import confidence, sample
from codila_cli.decoding.plan_config import PlanConfig

IDENT_PIECE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$|^[0-9]+$|^,$")


@dataclass(frozen=True)
class Slot:
    pos: int  # offset in the contract token list
    entry: int  # 1-based entry slot
    field: str  # role | budget | def | use
    allowed: torch.Tensor  # [V] bool


class ContractTemplate:
    """Token layout of a contract with ``max_units`` entry slots; shared by decoding and training."""

    def __init__(self, tokenizer, specials, config: PlanConfig, vocab_rows: int) -> None:
        self.tok, self.sp, self.cfg, self.V = tokenizer, specials, config, vocab_rows
        self.enc = lambda s: tokenizer.encode(s, add_special_tokens=False)
        role_ids = {r: self.enc(r) for r in ROLES}
        budget_ids = {b: self.enc(str(b)) for b in config.budget_menu}
        given = max((len(self.enc(d)) for d in config.defines), default=0)  # user-given names always fit
        self.n = {"role": max(map(len, role_ids.values())), "budget": max(map(len, budget_ids.values())),
                  "def": max(config.def_slots, given), "use": config.use_slots}
        self.role_ids, self.budget_ids = role_ids, budget_ids
        pieces = torch.zeros(vocab_rows, dtype=torch.bool)
        for i in range(min(len(tokenizer), vocab_rows)):
            if IDENT_PIECE.match(tokenizer.decode([i])):
                pieces[i] = True

        def allow(ids) -> torch.Tensor:
            a = torch.zeros(vocab_rows, dtype=torch.bool)
            a[sorted(set(ids))] = True
            return a

        eos = [specials.eos]
        self.allowed = {"role": allow([t for v in role_ids.values() for t in v] + eos),
                        "budget": allow([t for v in budget_ids.values() for t in v] + eos),
                        "def": pieces | allow(eos), "use": pieces | allow(eos)}

    def layout(self, values: dict[tuple[int, str], list[int]] | None = None) -> tuple[list[int], list[Slot]]:
        """Template ids (values filled where given, padded with end-of-text; else masks) and the value slots."""
        ids: list[int] = []
        slots: list[Slot] = []
        for k in range(1, self.cfg.max_units + 1):
            for text, fname in ((f"@unit {k} role=", "role"), (" budget=", "budget"), (" def=", "def"), (" use=", "use")):
                ids += self.enc(text)
                vals = (values or {}).get((k, fname))
                for j in range(self.n[fname]):
                    slots.append(Slot(len(ids), k, fname, self.allowed[fname]))
                    if vals is None:
                        ids.append(self.sp.mask)
                    else:
                        ids.append(vals[j] if j < len(vals) else self.sp.eos)
            ids += self.enc("\n")
        ids += self.enc("@end\n")
        return ids, slots

    def values_of(self, contract: Contract) -> dict[tuple[int, str], list[int]]:
        """Slot values for a known contract (training data): absent entries are all end-of-text."""
        out: dict[tuple[int, str], list[int]] = {}
        for k in range(1, self.cfg.max_units + 1):
            e = contract.entries[k - 1] if k <= len(contract.entries) else None
            if e is None:
                for f_ in ("role", "budget", "def", "use"):
                    out[(k, f_)] = []
                continue
            near = min(self.budget_ids, key=lambda b: abs(b - e.budget))
            out[(k, "role")] = self.role_ids[e.role]
            out[(k, "budget")] = self.budget_ids[near]
            out[(k, "def")] = self.enc(",".join(e.defs))[: self.cfg.def_slots]
            out[(k, "use")] = self.enc(",".join(e.uses))[: self.cfg.use_slots]
        return out

    def allowed_now(self, ids: list[int], slots: list[Slot], i: int) -> torch.Tensor:
        """Legal tokens for slot ``i`` given what is committed: a function, class, method or helper entry
        must name something, so its first ``def`` slot may not be end-of-text."""
        s = slots[i]
        allowed = s.allowed
        if s.field == "def" and s.pos == min(x.pos for x in slots if x.entry == s.entry and x.field == "def"):
            role = self.tok.decode([ids[x.pos] for x in slots if x.entry == s.entry and x.field == "role"
                                    and ids[x.pos] not in (self.sp.mask, self.sp.eos)]).strip()
            if role in ("function", "class", "method", "helper"):
                allowed = allowed.clone()
                allowed[self.sp.eos] = False
        return allowed

    def given(self, defines: tuple[str, ...]) -> dict[tuple[int, str], list[int]]:
        """Fixed values for a contract whose names the user gave: entry k defines ``defines[k-1]``
        (its role, budget and uses stay for the model); entries beyond them are empty."""
        out: dict[tuple[int, str], list[int]] = {}
        for k in range(1, self.cfg.max_units + 1):
            if k <= len(defines):
                out[(k, "def")] = self.enc(defines[k - 1])  # the def field is sized to fit (__init__)
            else:
                out.update({(k, f_): [] for f_ in ("role", "budget", "def", "use")})
        return out

    def choose(self, logits: torch.Tensor, slots: list[Slot], entry: int, fname: str, *,
               allow_empty: bool = True) -> dict[int, int]:
        """Pick a role (or "no unit", unless ``allow_empty`` is False) or a budget from the menu by the
        summed log-probabilities of its tokens over the field's slots; returns {slot index: token}.
        Choosing "no unit" empties the entry."""
        eos = self.sp.eos
        mine = [i for i, s in enumerate(slots) if s.entry == entry and s.field == fname]
        table = self.role_ids if fname == "role" else self.budget_ids
        options = [list(v) for v in table.values()] + ([[]] if fname == "role" and allow_empty else [])
        logp = torch.log_softmax(logits[[slots[i].pos for i in mine]].masked_fill(
            ~self.allowed[fname].to(logits.device), float("-inf")), dim=-1)
        padded = [o[: len(mine)] + [eos] * (len(mine) - len(o)) for o in options]
        scores = torch.stack([sum(logp[r, t] for r, t in enumerate(o)) for o in padded])
        best = padded[int(scores.argmax())]
        writes = dict(zip(mine, best))
        if fname == "role" and all(t == eos for t in best):  # no unit here: the other fields are empty too
            writes.update({i: eos for i, s in enumerate(slots) if s.entry == entry and s.field != "role"})
        return writes

    def read(self, ids: list[int], slots: list[Slot]) -> tuple[Contract, list[str]]:
        """Decode filled slots into a Contract; entries that do not parse are dropped with a warning."""
        fields: dict[tuple[int, str], list[int]] = {}
        for s in slots:
            fields.setdefault((s.entry, s.field), []).append(ids[s.pos])
        entries: list[Entry] = []
        warnings: list[str] = []
        eos = self.sp.eos
        for k in range(1, self.cfg.max_units + 1):
            text = lambda f_, k=k: self.tok.decode([t for t in fields[(k, f_)] if t != eos]).strip()
            if not text("role"):
                continue  # an empty entry slot
            line = (f"@unit 1 role={text('role')} budget={text('budget')} "
                    f"def={_unkeyword(text('def'))} use={_unkeyword(text('use'))}\n@end\n")
            try:
                entry = parse_contract(line).entries[0]
            except ContractError as exc:
                warnings.append(f"unit {k} of the plan was left out: {exc.message.removeprefix('contract line 1: ')}")
                continue
            seen = {d for e in entries for d in e.defs}
            if entry.defs and set(entry.defs) <= seen:
                warnings.append(f"unit {k} of the plan was left out: {', '.join(entry.defs)} "
                                f"{'is' if len(entry.defs) == 1 else 'are'} already written by an earlier unit")
                continue
            entries.append(entry)
        if not entries:
            return Contract(()), warnings
        return Contract(tuple(Entry(i + 1, e.role, e.budget, e.defs, e.uses) for i, e in enumerate(entries))), warnings


def _unkeyword(names: str) -> str:
    """A name the model wrote that is a Python keyword (``is``, ``class``) gets PEP 8's trailing underscore."""
    import keyword

    return ",".join(n + "_" if keyword.iskeyword(n) else n for n in names.split(","))


def contract_order(slots: list[Slot], masked: list[int], conf: torch.Tensor, schedule: str,
                   filled: dict[int, int], eos: int) -> int:
    """Which masked contract slot to commit now (an index into ``masked``)."""
    if schedule == "left-to-right":
        return min(range(len(masked)), key=lambda i: slots[masked[i]].pos)
    if schedule == "end-after-entry":  # finish the lowest open entry first, confidence order inside it
        low = min(slots[m].entry for m in masked)
        return max((i for i in range(len(masked)) if slots[masked[i]].entry == low), key=lambda i: float(conf[i]))
    if schedule == "pad-scan":  # decide role slots from the last entry backwards until one is present
        roles = [i for i in range(len(masked)) if slots[masked[i]].field == "role"]
        present_after = any(slots[s].field == "role" and v != eos for s, v in filled.items())
        if roles and not present_after:
            return max(roles, key=lambda i: slots[masked[i]].entry)
    return int(conf.argmax())


@dataclass
class PlanResult:
    contract: Contract
    contract_source: str  # "model", "user" or "fallback"
    units: list[str]  # assembled code per unit (marker and padding removed)
    program: str
    iterations: int
    contract_iterations: int
    seconds: float
    warnings: list[str] = field(default_factory=list)


MAIN_STUB = 'if __name__ == "__main__":\n    '  # an unnamed main unit: the script's entry code


def _header(e: Entry) -> tuple[str, str]:
    """(binding marker removed at assembly, code stub kept as the unit's start). Every unit gets a
    stub: ``def name(`` (function, helper, a named main), ``class Name``, ``    def name(self``
    (method), and for a main unit without a name (the one-piece fallback too) the script guard."""
    name = e.defs[0] if e.defs else ""
    if not name:
        return f"# unit {e.index}\n", MAIN_STUB
    stub = {"class": f"class {name}", "method": f"    def {name}(self"}.get(e.role, f"def {name}(")
    return f"# unit {e.index}\n", stub


def _check_fits(dlm, head: list[int], config: PlanConfig, enc) -> None:
    """With --defines, the fewest tokens the plan can take is known before the contract is written:
    the prompt, the shortest contract naming those units, and each unit's marker, stub and smallest
    canvas. Refuse at once when that does not fit the context (not after decoding the contract)."""
    from codila_cli.errors import UsageError

    n = len(config.defines)
    lines = [f"@unit {i} role=function budget={min(config.budget_menu)} def={d}" for i, d in enumerate(config.defines, 1)]
    need = len(head) + len(enc("\n".join(lines) + "\n@end\n")) + sum(
        len(enc(f"# unit {i}\n")) + len(enc(f"def {d}(")) + config.min_canvas for i, d in enumerate(config.defines, 1))
    if need > dlm.context_length:
        raise UsageError(f"{n} units cannot fit the model's context of {dlm.context_length} tokens: the prompt, the "
                         f"contract and {n} canvases of at least {config.min_canvas} tokens need {need} or more",
                         hint="name fewer units in --defines (or shorten the prompt)")


def decode_plan(dlm, prompt_ids: list[int], *, config: PlanConfig, contract: Contract | None = None,
                generator: torch.Generator | None = None, on_step: OnStep = no_op) -> PlanResult:
    sp, tok = dlm.specials, dlm.tokenizer
    t0, f0 = time.perf_counter(), dlm.forwards
    warnings: list[str] = []
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    head = ([sp.bos] if sp.bos is not None else []) + list(prompt_ids) + enc("\n# contract\n")
    source = "user"
    if contract is None and config.defines:
        _check_fits(dlm, head, config, enc)
    if contract is None:
        tpl = ContractTemplate(tok, sp, config, dlm.vocab_rows)
        ids, slots = tpl.layout(tpl.given(config.defines) if config.defines else None)
        filled: dict[int, int] = {}
        step = 0
        while True:
            masked = [i for i, s in enumerate(slots) if ids[s.pos] == sp.mask]
            if not masked:
                break
            logits = dlm.logits(torch.tensor([head + ids], device=dlm.device), rows=(len(head), len(head) + len(ids)))[0]
            rows = torch.stack([logits[slots[i].pos].masked_fill(~tpl.allowed_now(ids, slots, i).to(logits.device),
                                                                 float("-inf")) for i in masked])
            probs, x0 = sample(rows, config.sampling, generator)
            j = contract_order(slots, masked, confidence(probs, x0, "maskgit_plus"), config.contract_schedule,
                               filled, sp.eos)
            s = slots[masked[j]]
            if s.field in ("role", "budget"):  # a categorical choice: the whole field at once, always legal
                writes = tpl.choose(logits, slots, s.entry, s.field, allow_empty=s.entry > len(config.defines))
            else:
                writes = {masked[j]: int(x0[j])}
            for si, t in writes.items():
                ids[slots[si].pos] = t
                filled[si] = t
            on_step(StepEvent(step, tuple(slots[si].pos for si in writes), tuple(writes.values()), "dlm", None,
                              dlm.forwards - f0, 0, time.perf_counter() - t0, tuple(ids), row=0))
            step += 1
        contract, warn = tpl.read(ids, slots)
        warnings += warn
        source = "model"
        if not contract.entries:
            warnings.append("the model planned no usable unit, so the program was written as one piece")
            contract, source = single_unit(max(config.budget_menu)), "fallback"
    contract_iters = dlm.forwards - f0
    head = head + enc(contract.text())
    # canvases: marker + stub committed, then length-scaled masks (shrunk to fit the context if needed)
    fixed_of = [enc(_header(e)[0]) + enc(_header(e)[1]) for e in contract.entries]
    lengths = [max(config.min_canvas, math.ceil(config.pad_scale * e.budget)) for e in contract.entries]
    room = dlm.context_length - len(head) - sum(len(f) for f in fixed_of)
    if room < config.min_canvas * len(lengths):
        from codila_cli.errors import UsageError

        raise UsageError(f"the contract has {len(lengths)} units; they do not fit the model's context of "
                         f"{dlm.context_length} tokens after the prompt and contract", hint="lower --max-units")
    if sum(lengths) > room:
        scale = room / sum(lengths)
        lengths = [max(config.min_canvas, int(n * scale)) for n in lengths]
        warnings.append(f"each unit got {scale:.0%} of the length the plan asked for, to fit the model's context")
    spans, seq = [], list(head)
    for e, fixed, n in zip(contract.entries, fixed_of, lengths):
        start = len(seq)
        seq += fixed + [sp.mask] * n
        spans.append((start, start + len(fixed), start + len(fixed) + n))
    x = torch.tensor([seq], device=dlm.device)
    pair, pos = None, None
    if config.attention == "isolated":
        N, P = len(seq), len(head)
        pair = torch.zeros(N, N, dtype=torch.bool, device=dlm.device)
        pair[:, :P] = True
        pos = torch.arange(N, device=dlm.device)
        for a, _, b in spans:
            pair[a:b, a:b] = True
            pos[a:b] = torch.arange(P, P + (b - a), device=dlm.device)
        pos = pos.unsqueeze(0)
    active = [True] * len(spans)
    step = 0
    while any(active) and dlm.forwards - f0 < config.max_iterations:
        logits = dlm.logits(x, pair_mask=pair, position_ids=pos)[0]
        for k, (a, m0, b) in enumerate(spans):
            if not active[k]:
                continue
            canvas = x[0, m0:b]
            idx = (canvas == sp.mask).nonzero().flatten()
            rows = logits[m0 + idx]
            rows[:, [t for t in (sp.mask, sp.bos, sp.expand) if t is not None]] = float("-inf")  # never code
            early = idx < config.min_unit_tokens  # a unit may not end before it has min_unit_tokens tokens
            if bool(early.any()):
                rows[early, sp.eos] = float("-inf")
            probs, x0 = sample(rows, config.sampling, generator)
            conf = confidence(probs, x0, "maskgit_plus")
            pick = conf >= config.commit if config.commit is not None else torch.zeros_like(conf, dtype=torch.bool)
            pick[conf.argmax()] = True
            canvas[idx[pick]] = x0[pick]
            stop = (canvas == sp.eos).nonzero().flatten()
            if len(stop) and not bool((canvas[: int(stop[0])] == sp.mask).any()):
                canvas[canvas == sp.mask] = sp.eos  # the unit ended: the rest is padding
            if not bool((canvas == sp.mask).any()):
                active[k] = False
            on_step(StepEvent(step, tuple(int(i) for i in idx[pick]), tuple(int(t) for t in x0[pick]), "dlm",
                              (a, b), dlm.forwards - f0, 0, time.perf_counter() - t0, tuple(canvas.tolist()), row=k + 1))
        step += 1
    units = []
    for e, (a, m0, b) in zip(contract.entries, spans):
        _, stub = _header(e)
        body = x[0, m0:b].tolist()
        cut = next((i for i, t in enumerate(body) if t in (sp.eos, sp.mask)), len(body))
        units.append((stub + tok.decode(body[:cut], skip_special_tokens=True)).rstrip() + "\n")
    program = "\n\n".join(u.rstrip("\n") for u in units if u.strip()) + "\n"
    return PlanResult(contract, source, units, program, dlm.forwards - f0, contract_iters,
                      time.perf_counter() - t0, warnings)
