"""From shifted DLM logits to processed marginals π, sampled tokens and confidence scores.

Follows Dream's ``generation_utils.py`` (the model's remote code): temperature divides the logits before
top-p / top-k; filtered entries get the dtype minimum; every confidence (top-1 probability, margin,
negative entropy) is computed on the processed, renormalised π. Entropies are in nats.
"""

from __future__ import annotations

import torch

from codila_cli.decoding.config import SamplingConfig


def process_logits(logits: torch.Tensor, s: SamplingConfig, *, top_k_first: bool = False) -> torch.Tensor:
    """[M, V] fp32 logits -> tempered, top-p/top-k filtered logits [M, V]: Dream's order (top-p, then
    top-k), or with ``top_k_first`` SDAR's (top-k, then top-p over the survivors renormalised: its
    ``sample_with_temperature_topk_topp``; the two differ when both are set)."""
    if s.temperature > 0:
        logits = logits / s.temperature
    filters = (_top_k, _top_p) if top_k_first else (_top_p, _top_k)
    for f in filters:
        logits = f(logits, s)
    return logits


def filter_lead(logits: torch.Tensor, s: SamplingConfig, *, top_k_first: bool = False) -> float:
    """How near [M, V] logits are to making :func:`process_logits`'s filters keep other tokens (inf without a
    filter), in its order: top-k's lead of each row's k-th logit over its (k+1)-th, top-p's distance of each
    row's cumulative probabilities from ``top_p``. A logit moved by less keeps every row's survivors, and so
    the confidences computed from them (decoding/freedave.py reads a decision from a batch only then)."""
    out = float("inf")
    if s.temperature > 0:
        logits = logits / s.temperature
    for f in (_top_k, _top_p) if top_k_first else (_top_p, _top_k):
        if logits.shape[0] and f is _top_p and s.top_p is not None and s.top_p < 1.0:
            cum = torch.softmax(torch.sort(logits, descending=True, dim=-1).values, dim=-1).cumsum(dim=-1)
            out = min(out, float((cum.double() - s.top_p).abs().min()))
        elif logits.shape[0] and f is _top_k and s.top_k is not None and s.top_k < logits.shape[-1]:
            top = torch.topk(logits.double(), s.top_k + 1, dim=-1).values
            out = min(out, float((top[:, -2] - top[:, -1]).min()))
        logits = f(logits, s)
    return out


def _top_p(logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    if s.top_p is None or s.top_p >= 1.0:
        return logits
    sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)  # filtered entries weigh 0: the survivors' mass
    drop = cum > s.top_p
    drop[..., 1:] = drop[..., :-1].clone()  # keep the first token that crosses top_p
    drop[..., 0] = False
    return logits.masked_fill(drop.scatter(-1, idx, drop), torch.finfo(logits.dtype).min)


def _top_k(logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    if s.top_k is None or s.top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def entropy(probs: torch.Tensor, logits: torch.Tensor | None = None, *, x0: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] -> [...] Shannon entropy in nats.

    Given the logits z that ``probs`` = softmax(z) came from, H = logsumexp(z) − Σ_v p_v·z_v, and with
    the argmax ``x0`` logsumexp(z) = z[x0] − log p[x0] (softmax(z)_k = exp(z_k − logsumexp z)): one
    vocabulary-wide pass instead of four (the sampler's largest cost per DLM step on the small models;
    benchmarks/perf.py). Rows with banned ids at −inf (0·−inf = nan in the sum) are redone with those
    ids clamped to the dtype's minimum (the DLM's own mask column is already finite: models/dream.py);
    rounding below 0 is clamped away.
    """
    if logits is None:
        return -(probs * torch.log(probs + 1e-10)).sum(-1)
    dot = torch.linalg.vecdot(probs, logits)
    bad = torch.isnan(dot)
    if bool(bad.any()):
        dot[bad] = torch.linalg.vecdot(probs[bad], logits[bad].clamp_min(torch.finfo(logits.dtype).min))
    if x0 is None:
        lse = torch.logsumexp(logits, -1)
    else:
        k = x0.unsqueeze(-1)
        lse = logits.gather(-1, k).squeeze(-1) - probs.gather(-1, k).squeeze(-1).log()
    return (lse - dot).clamp_min(0)


def sample(logits: torch.Tensor, s: SamplingConfig, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Processed π [M, V] and the chosen tokens [M]: argmax at T = 0, a draw from π otherwise."""
    probs, x0, _ = sample_scored(logits, s, gen, None)
    return probs, x0


def sample_scored(logits: torch.Tensor, s: SamplingConfig, gen: torch.Generator | None,
                  alg: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`sample` and :func:`confidence` in one pass: (π [M, V], tokens [M], score [M] or None when
    ``alg`` is None). The entropy score reuses the processed logits (see :func:`entropy`)."""
    z = process_logits(logits, s)
    probs = torch.softmax(z, dim=-1)
    if s.temperature > 0:
        x0, top = torch.multinomial(probs, 1, generator=gen).squeeze(-1), None
    else:
        x0 = top = probs.max(-1).indices  # the first maximum, as argmax; max(dim) is the faster kernel on CPU
    return probs, x0, None if alg is None else confidence(probs, x0, alg, logits=z, argmax=top)


def confidence(probs: torch.Tensor, x0: torch.Tensor, alg: str, *, logits: torch.Tensor | None = None,
               argmax: torch.Tensor | None = None) -> torch.Tensor:
    """[M] score, larger = more certain: maskgit_plus = p(x0); topk_margin = p1 - p2; entropy = -H as the
    official loops compute it, Σ_v p_v·log(p_v + 1e-10). That formula keeps near-certain slots apart:
    H = logsumexp(z) − Σ p·z (:func:`entropy`, the cheaper form codila uses for its own block choice)
    rounds to exactly 0 for them in fp32, so at low temperature without top-p a tie would be broken
    where the official code sees none. ``logits`` / ``argmax`` are accepted for the other callers' sake."""
    if alg == "maskgit_plus":
        return probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    raise ValueError(f"no confidence for alg {alg!r}")


def first_stop(canvas: torch.Tensor, *, mask_id: int, stop_ids: tuple[int, ...]) -> int | None:
    """Offset of the first committed stop token if every slot before it is committed, else None."""
    is_stop = torch.zeros_like(canvas, dtype=torch.bool)
    for sid in stop_ids:
        is_stop |= canvas == sid
    hits = is_stop.nonzero().flatten()
    if len(hits) == 0:
        return None
    first = int(hits[0])
    return first if not bool((canvas[:first] == mask_id).any()) else None
