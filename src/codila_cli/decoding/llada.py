"""LLaDA's ``generate`` (Nie et al. 2025, "Large Language Diffusion Models", arXiv 2502.09992, §2.4 and
Appendix B; the official ``generate.py`` of ML-GSAI/LLaDA): semi-autoregressive blocks, low-confidence or
random remasking, optional unsupervised classifier-free guidance.

Canvas ``x`` [1, P + L]: prompt then L masks, cut into L / block_length blocks decoded left to right, each
in ``steps / blocks`` forwards. A block's masked count m is spread evenly over its forwards (m // s each,
the first m % s forwards one more: LLaDA's linear schedule). Per forward:

* logits [1, N, V] of the whole canvas (no shift: row i is token i); with ``cfg_scale`` w > 0 a second
  row with the prompt masked runs in the same forward, and the logits are u + (w + 1)·(c − u);
* x0 = argmax of the logits, at T > 0 with Gumbel noise in float64: exp(l) / (−log U)^T, U uniform of the
  logits' full shape (the official order of random draws);
* confidence p(x0) under softmax(logits) (``low_confidence``) or a uniform per position (``random``),
  −inf outside the block's masked slots; the top-k on that sequence-long row [N] picks the slots (ties
  and draws depend on that layout, as in the official loop). codila adds SDAR's two rules (decoding/block.py):
  ``dynamic``, every slot above ``threshold`` when they are at least the quota, and ``sequential``, the
  quota from the block's first masked slot on.

Every forward runs while a slot is masked, as in the official loop (a forward whose quota is 0 still draws
its noise at T > 0). Intended differences (docs/decoders.md, "Parity"): the mask token is never chosen (its
logit is the fp32 minimum); the forwards the official loop still runs once nothing is masked (the last
block's zero-quota forwards, when it has more forwards than masked slots) are skipped: they cannot change
the output, and ``dlm_forwards`` counts the forwards that ran; early stop once a stop token is committed
with nothing masked before it (``early_stop``); a prompt that holds the mask id is refused (the official
loop would fill it as a canvas slot, and return masks where it could not).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from codila_cli.decoding.config import GEN_KNOBS, SamplingConfig, exact_problem
from codila_cli.decoding.events import OnStep, no_op
from codila_cli.decoding.freedave_rules import OnCanvas

if TYPE_CHECKING:  # torch is imported where decoding runs: the config is read by --help, which must not load it
    import torch

    from codila_cli.decoding.base import DecodeResult
    from codila_cli.decoding.freedave_rules import Decision, View

_g = GEN_KNOBS.default


@dataclass(frozen=True)
class LladaConfig:
    """``--decoder llada``: LLaDA's sampler. ``steps`` None = max_new_tokens (one token per forward);
    ``block_length`` must divide max_new_tokens and the blocks must divide ``steps``, as the official
    code asserts (:meth:`tiling_problem` says why not; the commands refuse before decoding). ``sampling``: the temperature is the Gumbel noise's; top-p / top-k (codila's, not the
    official sampler's) filter the logits first."""

    max_new_tokens: int = _g("max_new_tokens")
    steps: int | None = _g("steps")
    block_length: int = _g("block_length")
    remasking: str = _g("remasking")
    threshold: float = _g("threshold")  # --remasking dynamic's
    cfg_scale: float = _g("cfg_scale")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    early_stop: bool = _g("early_stop")
    stop: tuple[str, ...] = _g("stop")
    exact: bool | None = _g("exact")  # decoding/freedave.py (None: on where it pays)
    needs_helper: ClassVar[bool] = False

    def __post_init__(self) -> None:
        from codila_cli.decoding.block import check_block_settings

        check_block_settings(self)
        if not 0.0 <= self.cfg_scale <= 100.0:
            raise ValueError(f"cfg-scale must be between 0 and 100, got {self.cfg_scale}")
        if self.exact and (problem := exact_problem(self)):
            raise ValueError(problem)

    def draws(self) -> bool:
        return self.sampling.temperature > 0 or self.remasking == "random"

    def tiling_problem(self) -> str | None:
        """Why LLaDA's blocks cannot run these lengths (None: they can). The official generate asserts
        both rules; codila refuses rather than decode a ragged last block."""
        if self.max_new_tokens % self.block_length:
            return (f"LLaDA's blocks must tile the canvas: --block-length {self.block_length} does not divide "
                    f"--max-new-tokens {self.max_new_tokens}")
        blocks = self.max_new_tokens // self.block_length
        steps = self.steps if self.steps is not None else self.max_new_tokens
        if steps % blocks:
            return f"LLaDA shares --steps evenly among its {blocks} blocks: {steps} is not a multiple of {blocks}"
        return None

    def fitted(self, fixed: Collection[str]) -> LladaConfig:
        """This config with blocks that tile the canvas when nobody set the block length (it is not in
        ``fixed``, the knobs a flag, variable, config file or request gave): the largest power of two
        up to it that divides max_new_tokens (``--max-new-tokens 48``: 16, not 32)."""
        if "block_length" in fixed or not self.max_new_tokens % self.block_length:
            return self
        return replace(self, block_length=math.gcd(self.max_new_tokens, self.block_length))


def _logits(dlm: Any, x: torch.Tensor, prompt_len: int, cfg_scale: float, mask_id: int,
            rows: tuple[int, int] | None) -> torch.Tensor:
    """[1, n, V] fp32 logits of the canvas (rows ``rows`` only when given), guided when cfg_scale > 0."""
    import torch

    if cfg_scale <= 0:
        return dlm.logits(x, rows=rows)
    uncond = x.clone()
    uncond[:, :prompt_len] = mask_id
    cond, un = dlm.logits(torch.cat([x, uncond]), rows=rows).chunk(2)
    return un + (cfg_scale + 1) * (cond - un)


def check_llada(dlm: Any, prompt_ids: list[int], config: LladaConfig) -> None:
    """What LLaDA's sampler refuses before decoding: blocks that do not tile the canvas, a mask in the prompt."""
    if (problem := config.tiling_problem()) is not None:
        raise ValueError(problem)
    if dlm.specials.mask in prompt_ids:
        from codila_cli.errors import UsageError

        at = prompt_ids.index(dlm.specials.mask)
        raise UsageError(f"the prompt holds the mask token (id {dlm.specials.mask}) at token {at}; LLaDA's sampler "
                         "would fill it as if it were part of the answer",
                         hint="remove the mask token from the prompt's ids")


def decode_llada(dlm: Any, prompt_ids: list[int], *, config: LladaConfig, generator: torch.Generator | None = None,
                 on_step: OnStep = no_op) -> DecodeResult:
    import torch

    from codila_cli.decoding.base import Canvas
    from codila_cli.decoding.marginals import process_logits

    check_llada(dlm, prompt_ids, config)
    c = Canvas.start(prompt_ids=prompt_ids, config=config, dlm=dlm, on_step=on_step)
    P, L, B = c.prompt_len, config.max_new_tokens, config.block_length
    blocks = L // B
    per_block = (config.steps if config.steps is not None else L) // blocks
    temp = config.sampling.temperature
    filtered = config.sampling.top_p is not None or config.sampling.top_k is not None
    whole = temp > 0 or config.remasking == "random"  # the draws span the whole canvas: so must the logits
    for b in range(blocks):
        lo, hi = P + b * B, P + (b + 1) * B
        m = int((c.x[0, lo:hi] == c.mask_id).sum())
        quota = [m // per_block + (k < m % per_block) for k in range(per_block)]
        for k in range(per_block):
            rows = None if whole else (lo, hi)
            logits = _logits(dlm, c.x, P, config.cfg_scale, c.mask_id, rows)[0]  # [n, V]
            if filtered:  # codila's top-p / top-k on the raw logits (the temperature is the noise's)
                logits = process_logits(logits, replace(config.sampling, temperature=0.0))
            start = 0 if whole else lo
            if temp > 0:
                noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator, device=logits.device)
                x0 = (logits.double().exp() / (-torch.log(noise)) ** temp).argmax(-1)
            else:
                x0 = logits.argmax(-1)
            if config.remasking != "random":
                conf = torch.softmax(logits, dim=-1).gather(-1, x0[:, None]).squeeze(-1)
            else:
                conf = torch.rand((1, c.x.shape[1]), generator=generator, device=logits.device)[0]
            block_x0, block_conf = x0[lo - start : hi - start], conf[lo - start : hi - start]
            masked = c.x[0, lo:hi] == c.mask_id
            row = torch.full((c.x.shape[1],), float("-inf"), device=logits.device)
            row[lo:hi] = torch.where(masked, block_conf.float(), float("-inf"))
            if c.wants_proposals:
                c.propose(masked.nonzero().flatten() + lo - P, block_x0[masked])
            if config.remasking == "dynamic" and int((row > config.threshold).sum()) >= quota[k]:
                picked = (row > config.threshold).nonzero().flatten()
            elif config.remasking == "sequential":
                picked = (masked.nonzero().flatten() + lo)[: quota[k]]
            else:
                picked = torch.topk(row, quota[k]).indices if quota[k] else row[:0].long()
            if len(picked):
                c.commit(picked - P, x0[picked - start], source="dlm", block=(lo - P, hi - P))
            if c.done():
                return c.result()
    return c.result()


@dataclass
class LladaRule(OnCanvas):
    """decoding/llada.py's loop at T 0 (low-confidence or sequential remasking, no guidance): block b's
    step k reveals its quota of the block's most confident masked slots (rows of that block only)."""

    config: Any
    prompt_len: int
    mask_id: int

    def _at(self, step: int) -> tuple[int, int, int, int] | None:
        """(step, lo, hi, quota) of the first step from ``step`` with a quota, or None past the last."""
        cfg, P = self.config, self.prompt_len
        B = cfg.block_length
        blocks = cfg.max_new_tokens // B
        per = (cfg.steps if cfg.steps is not None else cfg.max_new_tokens) // blocks
        for i in range(step, blocks * per):
            b, k = divmod(i, per)
            quota = B // per + (k < B % per)
            if quota:
                return i, P + b * B, P + (b + 1) * B, quota
        return None

    def rows(self, x: torch.Tensor, step: int) -> tuple[int, int] | None:
        at = self._at(step)
        return None if at is None else (at[1], at[2])

    def decide(self, x: torch.Tensor, view: View, step: int, tol: float) -> Decision | None:
        import torch

        from codila_cli.decoding.freedave_rules import Decision, filters_clear, lead, token_lead
        from codila_cli.decoding.marginals import process_logits

        at = self._at(step)
        if at is None or not view.covers(at[1], at[2]):
            return None
        i, lo, hi, quota = at
        cfg = self.config
        logits = view.rows(lo, hi)
        if cfg.sampling.top_p is not None or cfg.sampling.top_k is not None:
            logits = process_logits(logits, replace(cfg.sampling, temperature=0.0))
        x0 = logits.argmax(-1)
        conf = torch.softmax(logits, dim=-1).gather(-1, x0[:, None]).squeeze(-1)
        masked = x[lo:hi] == self.mask_id
        if cfg.remasking == "sequential":
            picked = (masked.nonzero().flatten() + lo)[:quota]
            robust = True
        else:
            row = torch.full((x.shape[0],), float("-inf"), device=logits.device)
            row[lo:hi] = torch.where(masked, conf.float(), float("-inf"))
            picked = torch.topk(row, quota).indices
            robust = (lead(conf.float()[masked], quota) > tol  # and the filters' survivors, which conf reads
                      and filters_clear(view.rows(lo, hi)[masked], cfg.sampling, tol))
        robust = robust and token_lead(logits[picked - lo]) > tol
        P = self.prompt_len
        return Decision(i, picked, x0[picked - lo], robust, block=(lo - P, hi - P))
