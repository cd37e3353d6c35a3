"""Block diffusion with an exact KV cache (SDAR, arXiv 2510.06303; the official ``block_diffusion_generate``
of JetAstra/SDAR ``generate.py``), and CoDiLA inside each block.

Blocks of B tokens are aligned to absolute positions from 0, the prompt included: the canvas is the prompt
then masks up to a whole number of blocks (a few slots past max_new_tokens: the caller keeps the limit,
engine/generate.py::_decode_blocks). The
prompt's whole blocks are prefilled once (models/sdar.py::prefill); then, block by block, starting with the
one that holds the prompt's end:

* up to ``steps`` + 1 forwards of the block alone against the cache (logits [1, B, V], no shift). Each
  draws x0 per slot (temperature, top-k, top-p, then one categorical draw per row; codila: argmax at T 0,
  where the official code divides by zero) with p(x0) as confidence, and reveals a quota (B // steps, the
  first B % steps steps one more) of masked slots: ``low_confidence`` the most confident; ``dynamic``
  (SDAR's default, "low_confidence_dynamic") every slot above ``threshold`` when they are at least the
  quota, else the most confident; ``random`` at random; ``sequential`` from the first masked slot on. The
  ranking runs on the block's own row [B], −inf outside the masked slots (the official layout).
* once nothing is masked, one more forward appends the block's keys and values (models/sdar.py::extend).

With a ``writer`` (CoDiLA, docs/codila.md) each block's first forward gives the marginals from which the AR
helper writes the block (static, tau None), or its longest low-entropy prefix (dynamic; else the block's
own step). Intended differences: the mask is never chosen; a quota larger than the masked slots left
never reaches past them (the official top-k then picks −inf slots and rewrites the prompt's or the
block's committed tokens); early stop after a block that holds an end-of-text token.

Other families' block samplers differ from SDAR's in a few rules (:class:`BlockRules`), which the model's
family row carries (models/families.py; each family's module says which and why).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from codila_cli.decoding.config import GEN_KNOBS, MAX_CANVAS, SamplingConfig, exact_problem
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.decoding.freedave_rules import OnCanvas

if TYPE_CHECKING:
    import torch

    from codila_cli.decoding.base import DecodeResult
    from codila_cli.decoding.freedave_rules import Decision, View

_g = GEN_KNOBS.default


@dataclass(frozen=True)
class BlockConfig:
    """``--decoder block``. ``block_length``: the commands make it the model's trained block size when
    nobody set it (:meth:`fitted`); ``steps`` None = the block length (one slot per forward);
    ``threshold``: ``--remasking dynamic``'s."""

    max_new_tokens: int = _g("max_new_tokens")
    block_length: int = _g("block_length")
    steps: int | None = _g("steps")
    remasking: str = _g("remasking")
    threshold: float = _g("threshold")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = _g("early_stop")
    stop: tuple[str, ...] = _g("stop")
    exact: bool | None = _g("exact")  # decoding/freedave.py (None: on where it pays)
    needs_helper: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_block_settings(self)
        if self.exact and (problem := exact_problem(self)):
            raise ValueError(problem)

    def draws(self) -> bool:
        return self.sampling.temperature > 0 or self.remasking == "random"

    @classmethod
    def for_codila(cls, cfg: Any) -> BlockConfig:
        """The block schedule CoDiLA runs on a block-diffusion model: blocks of its -B slots, its length,
        sampling and stops (decoding/config.py::CodilaConfig ``cfg``)."""
        return cls(max_new_tokens=cfg.max_new_tokens, block_length=cfg.block_size, sampling=cfg.sampling,
                   early_stop=cfg.early_stop, stop=cfg.stop)

    def fitted(self, fixed: Collection[str], trained: int | None) -> BlockConfig:
        """This config with the model's ``trained`` block size when nobody set the block length (it is not
        in ``fixed``, the knobs a flag, variable, config file or request gave)."""
        return self if "block_length" in fixed or trained is None else replace(self, block_length=trained)


def check_block_settings(cfg: Any) -> None:
    """The checks LLaDA's and SDAR's configs share: lengths and steps in range, a remasking rule the knob
    table names, a threshold in (0, 1] (a ValueError naming the flag)."""
    for name, value in (("max-new-tokens", cfg.max_new_tokens), ("block-length", cfg.block_length),
                        ("steps", cfg.steps)):
        if value is not None and not 1 <= value <= MAX_CANVAS:
            raise ValueError(f"{name} must be between 1 and {MAX_CANVAS}, got {value}")
    choices = GEN_KNOBS["remasking"].choices
    if cfg.remasking not in choices:
        raise ValueError(f"remasking must be one of {', '.join(choices)}, got {cfg.remasking!r}")
    if not 0.0 < cfg.threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {cfg.threshold}")


def _sample(logits: torch.Tensor, s: SamplingConfig, gen: Any, rules: BlockRules) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 and p(x0) per row of ``logits`` [n, V]. SDAR's order: temperature, top-k, top-p, softmax, one
    categorical draw per row (argmax at T 0). ``gumbel`` (LLaDA's sampling rule): x0 = argmax of
    exp(l) / (−log U)^T with U uniform over the block's [n, V] in float64, p(x0) under softmax(l)."""
    import torch

    from codila_cli.decoding.marginals import process_logits

    if rules.draw == "gumbel":  # top-k / top-p (codila's, not that sampler's) filter the logits first, as LLaDA's
        if s.top_k is not None or s.top_p is not None:
            logits = process_logits(logits, replace(s, temperature=0.0))
        if s.temperature > 0:
            noise = torch.rand(logits.shape, dtype=torch.float64, generator=gen, device=logits.device)
            x0 = (logits.double().exp() / (-torch.log(noise)) ** s.temperature).argmax(-1)
        else:
            x0 = logits.argmax(-1)
        return x0, torch.softmax(logits.double(), dim=-1).gather(-1, x0[:, None]).squeeze(-1)
    probs = torch.softmax(process_logits(logits, s, top_k_first=True), dim=-1)
    x0 = torch.multinomial(probs, 1, generator=gen).squeeze(-1) if s.temperature > 0 else probs.argmax(-1)
    return x0, probs.gather(-1, x0[:, None]).squeeze(-1)


def _reveal(conf: torch.Tensor, masked: torch.Tensor, quota: int, cfg: BlockConfig, gen: Any,
            rules: BlockRules) -> torch.Tensor:
    """The block slots [k] this step reveals (``conf`` [n] p(x0), ``masked`` [n] bool)."""
    import torch

    quota = min(quota, int(masked.sum()))
    if cfg.remasking == "sequential":
        return masked.nonzero().flatten()[:quota]
    if cfg.remasking == "random":
        conf = torch.rand(conf.shape, generator=gen, device=conf.device)
    row = torch.where(masked, conf.double() if rules.draw == "gumbel" else conf.float(), float("-inf"))
    if cfg.remasking == "dynamic" and rules.dynamic == "top1":  # the most confident, and all at the threshold
        best = torch.zeros_like(masked)
        best[int(row.argmax())] = True
        return (best | (row >= cfg.threshold)).nonzero().flatten()
    if cfg.remasking == "dynamic" and int((row > cfg.threshold).sum()) >= quota:
        return (row > cfg.threshold).nonzero().flatten()
    return torch.topk(row, quota).indices


@dataclass(frozen=True)
class BlockRules:
    """Where a family's official block sampler departs from SDAR's (the defaults); a family row carries its
    own (models/families.py::Family.block_rules). ``draw``: "categorical" or "gumbel" (:func:`_sample`);
    ``quota_of``: the steps share the block's B slots ("block") or its masked slots ("masked": a block that
    holds the prompt's end has fewer); ``cut_last``: the last block ends at the token limit (else whole
    blocks are decoded and the limit is kept afterwards); ``extend_after_end``: the block that ends the
    text is appended to the cache (one more forward) before stopping; ``dynamic``: ``--remasking
    dynamic`` reveals every slot above the threshold when they are at least the quota ("quota"), or the
    most confident slot and every slot at or above the threshold ("top1")."""

    draw: str = "categorical"
    quota_of: str = "block"
    cut_last: bool = False
    extend_after_end: bool = True
    dynamic: str = "quota"


def decode_block(dlm: Any, prompt_ids: list[int], *, config: BlockConfig, generator: Any = None,
                 on_step: OnStep = no_op, writer: Any = None, tau: float | None = None,
                 fill: Any = None) -> DecodeResult:
    """``fill(canvas, rule, forward)``: fills each block instead of the step loop below, under the block's
    step rule (:class:`BlockRule`) and ``forward(canvases [d, N], spans)``: the block's logits per canvas
    (decoding/freedave.py)."""

    from codila_cli.decoding.base import Canvas
    from codila_cli.decoding.marginals import first_stop

    rules = getattr(getattr(dlm, "family", None), "block_rules", None) or BlockRules()
    B = config.block_length
    P, steps = len(prompt_ids), config.steps or B
    total = P + config.max_new_tokens if rules.cut_last else -(-(P + config.max_new_tokens) // B) * B
    c = Canvas.start(prompt_ids=prompt_ids, config=replace(config, max_new_tokens=total - P), dlm=dlm,
                     ar=writer.ar if writer is not None else None, on_step=on_step)
    first = P // B
    past = dlm.prefill(c.x[:, : first * B], B) if first else None
    for b in range(first, -(-total // B)):
        lo, hi = b * B, min((b + 1) * B, total)
        m = B if rules.quota_of == "block" else int((c.x[0, lo:hi] == c.mask_id).sum())
        quotas = [m // steps + (k < m % steps) for k in range(steps)]
        k = 0
        if fill is not None:
            rule = BlockRule(config, rules, lo, hi, quotas, c.mask_id, (max(lo, P) - P, hi - P))
            fill(c, rule, lambda xs, spans, past=past, lo=lo, hi=hi: list(dlm.block_logits(xs[:, lo:hi], lo, past)))
        while bool((masked := c.x[0, lo:hi] == c.mask_id).any()):  # the official loop ends within steps + 1
            k += 1
            logits = dlm.block_logits(c.x[:, lo:hi], lo, past)[0]  # [n, V]
            if writer is not None and _ar_writes(c, writer, logits, masked, lo, tau, generator):
                continue
            x0, p = _sample(logits, config.sampling, generator, rules)
            if c.wants_proposals:
                c.propose(masked.nonzero().flatten() + lo - P, x0[masked])
            # past the schedule (a helper's writes took steps; a block's masked count under the steps), one a step
            picked = _reveal(p, masked, max(1, quotas[min(k - 1, steps - 1)]), config, generator, rules)
            c.commit(picked + lo - P, x0[picked], source="dlm", block=(max(lo, P) - P, hi - P))
        ended = c.early_stop and first_stop(c.gen, mask_id=c.mask_id, stop_ids=c.stop_ids) is not None
        if rules.extend_after_end or not ended:  # the text ends in this block: no cache append (the rules say)
            past = dlm.extend(c.x[:, lo:hi], lo, past)
        if c.done():
            break
    return c.result()


def decode_block_codila(dlm: Any, prompt_ids: list[int], *, config: Any, writer: Any, generator: Any = None,
                        on_step: OnStep = no_op) -> DecodeResult:
    """CoDiLA (decoding/config.py::CodilaConfig ``config``) on a block-diffusion model: blocks of its -B
    slots, the helper writing each (static) or its low-entropy prefix (``--tau``)."""
    return decode_block(dlm, prompt_ids, config=BlockConfig.for_codila(config), generator=generator,
                        on_step=on_step, writer=writer, tau=config.tau)


def _ar_writes(c: Any, writer: Any, logits: torch.Tensor, masked: torch.Tensor, lo: int, tau: float | None,
               gen: Any) -> bool:
    """CoDiLA in the block: the AR writes the block's masked slots from the marginals (every one when
    ``tau`` is None; else the longest low-entropy prefix, k >= 2); False when it writes nothing."""
    import torch

    from codila_cli.decoding.marginals import entropy

    probs = torch.softmax(logits, dim=-1)
    slots = masked.nonzero().flatten()
    if tau is not None:
        h = entropy(probs, logits)[slots]
        k = next((n for n in range(len(slots), 1, -1) if float(h[:n].mean()) <= tau), 0)
        if k < 2:
            return False
        slots = slots[:k]
    start, end = int(slots[0]), int(slots[-1]) + 1
    forced = [None if bool(masked[i]) else int(c.x[0, lo + i]) for i in range(start, end)]
    out = writer.write(probs[start:end], forced, generator=gen)
    P = c.prompt_len
    keep = [i for i in range(start, end) if bool(masked[i])]
    c.commit(torch.tensor(keep, device=c.x.device) + lo - P, out[[i - start for i in keep]].to(c.x.device),
             source="ar", block=(lo + start - P, lo + end - P))
    return True


@dataclass
class BlockRule(OnCanvas):
    """decoding/block.py's steps inside one block [lo, hi) at T 0: step k reveals its quota (at least one)
    by the family's rules (decoding/block.py::BlockRules) from the block's own logits."""

    config: Any
    rules: Any
    lo: int
    hi: int
    quotas: list[int]
    mask_id: int
    block: tuple[int, int]

    def rows(self, x: torch.Tensor, step: int) -> tuple[int, int] | None:
        return (self.lo, self.hi) if bool((x[self.lo : self.hi] == self.mask_id).any()) else None

    def decide(self, x: torch.Tensor, view: View, step: int, tol: float) -> Decision | None:
        from codila_cli.decoding.freedave_rules import Decision, filters_clear, lead, token_lead
        from codila_cli.decoding.marginals import process_logits

        masked = x[self.lo : self.hi] == self.mask_id
        if not bool(masked.any()) or not view.covers(self.lo, self.hi):
            return None
        cfg, rules = self.config, self.rules
        logits = view.rows(self.lo, self.hi)
        x0, p = _sample(logits, cfg.sampling, None, rules)
        quota = max(1, self.quotas[min(step, len(self.quotas) - 1)])
        picked = _reveal(p, masked, quota, cfg, None, rules)
        conf = (p.double() if rules.draw == "gumbel" else p.float())[masked]
        quota = min(quota, int(masked.sum()))
        if cfg.remasking == "sequential":
            robust = True
        elif cfg.remasking == "dynamic":
            robust = bool(((conf - cfg.threshold).abs() > tol).all()) and lead(conf, 1 if rules.dynamic == "top1"
                                                                              else quota) > tol
        else:
            robust = lead(conf, quota) > tol
        # the logits x0 is the argmax of (T 0): filtered in the order _sample filters them; the confidences
        # (all but sequential's) read the filters' survivors of every masked row
        order = {"top_k_first": rules.draw != "gumbel"}
        z = process_logits(logits, replace(cfg.sampling, temperature=0.0), **order)
        robust = robust and token_lead(z[picked]) > tol and (cfg.remasking == "sequential" or filters_clear(
            logits[masked], replace(cfg.sampling, temperature=0.0), tol, **order))
        return Decision(step, picked + self.lo, x0[picked], robust, block=self.block)
