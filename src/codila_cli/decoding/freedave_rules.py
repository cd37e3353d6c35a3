"""What a step rule of decoding/freedave.py (FreeDave) returns, and the leads it measures. Each deterministic
sampler keeps its rule beside its loop (decoding/dream.py::DreamRule, llada.py::LladaRule, block.py::BlockRule):
for a canvas [N] and the logits of some rows of it, what the next step commits and whether every comparison
behind that choice clears a tolerance (a decision read from a batched forward counts only then)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a rule runs (llada.py and block.py import this with their configs)
    import torch


@dataclass(frozen=True)
class Decision:
    """What one schedule step commits: canvas positions (the sequence's, prompt included) and tokens, in the
    reference's commit order; ``robust``: every comparison cleared the tolerance."""

    step: int
    positions: torch.Tensor
    tokens: torch.Tensor
    robust: bool
    block: tuple[int, int] | None = None  # the event's block (generated-slot offsets), as the reference's


@dataclass
class View:
    """Logits [hi − lo, V] of canvas rows [lo, hi) (sequence positions) from one forward."""

    lo: int
    hi: int
    logits: torch.Tensor

    def covers(self, lo: int, hi: int) -> bool:
        return self.lo <= lo and hi <= self.hi

    def rows(self, lo: int, hi: int) -> torch.Tensor:
        return self.logits[lo - self.lo : hi - self.lo]


def lead(values: torch.Tensor, k: int) -> float:
    """How far the k-th largest of ``values`` is above the (k+1)-th (inf when there is none)."""
    import torch

    if k >= values.numel():
        return float("inf")
    top = torch.topk(values.double(), k + 1).values
    return float(top[k - 1] - top[k])


def token_lead(logits: torch.Tensor) -> float:
    """The smallest lead of a row's top logit over its second, over rows [k, V]."""
    import torch

    if logits.shape[0] == 0 or logits.shape[-1] < 2:
        return float("inf")
    top = torch.topk(logits.double(), 2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


class OnCanvas:
    """A step rule whose state is the canvas [N] itself (Dream, LLaDA, the block decoders)."""

    @staticmethod
    def tokens(x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def size(x: torch.Tensor) -> int:
        return x.shape[0]

    @staticmethod
    def after(x: torch.Tensor, d: Decision) -> torch.Tensor:
        y = x.clone()
        y[d.positions] = d.tokens.to(y.dtype)
        return y


def filters_clear(logits: torch.Tensor, sampling: object, tol: float, *, top_k_first: bool = False) -> bool:
    """Whether the top-p / top-k filters of ``sampling`` keep the same tokens of every row of ``logits`` [k, V]
    under a change of less than ``tol`` (decoding/marginals.py::filter_lead); no check for a decision read
    from the reference's own arithmetic (``tol`` = −inf)."""
    if tol == float("-inf"):
        return True
    from codila_cli.decoding.marginals import filter_lead

    return filter_lead(logits, sampling, top_k_first=top_k_first) > tol
