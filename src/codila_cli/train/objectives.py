"""Training losses: causal LM, masked diffusion with Dream's shift, CoDiLA alignment of the AR helper.

All take ``x0`` [B, L] int64 (position 0 is always bos and never masked) and a ``torch.Generator``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_lm_loss(model, x0: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x0, use_cache=False).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x0[:, 1:].reshape(-1))


def diffusion_loss(model, x0: torch.Tensor, *, mask_id: int, gen: torch.Generator, t: torch.Tensor | None = None,
                   eps: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-diffusion NELBO (MDLM/LLaDA/Dream): t ~ U(eps, 1) per row, each position masked with prob t,
    cross-entropy on masked positions weighted by 1/t, averaged over all B·L positions.

    Dream's shift: the raw logit row i-1 predicts token i, so the loss reads ``logits[:, :-1]`` against
    ``x0[:, 1:]`` (the same alignment as a causal LM, with bidirectional attention).
    Returns (weighted loss, unweighted mean CE over masked tokens).
    """
    b, n = x0.shape
    if t is None:
        t = eps + (1 - eps) * torch.rand(b, generator=gen)
    masked = torch.rand(b, n, generator=gen) < t[:, None]
    masked[:, 0] = False
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    logits = model(input_ids=xt, attention_mask={"full_attention": None}, use_cache=False).logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x0[:, 1:].reshape(-1), reduction="none").view(b, n - 1)
    m = masked[:, 1:].float()
    weighted = (ce * m / t[:, None]).sum() / (b * (n - 1))
    plain = (ce * m).sum() / m.sum().clamp_min(1)
    return weighted, plain


def block_mask(b: int, n: int, *, t: torch.Tensor, block: int, gen: torch.Generator) -> torch.Tensor:
    """Token-level masking at rate t plus whole contiguous blocks, so the AR sees fully masked blocks."""
    masked = torch.rand(b, n, generator=gen) < t[:, None]
    nblocks = (n - 1) // block
    pick = torch.rand(b, nblocks, generator=gen) < t[:, None]
    span = pick.repeat_interleave(block, dim=1)
    masked[:, 1 : 1 + span.shape[1]] |= span
    masked[:, 0] = False
    return masked


def codila_alignment_loss(dlm, ar, x0: torch.Tensor, *, mask_id: int, think_open: int, think_close: int,
                          shared: torch.Tensor, block: int, blocks_per_row: int, gen: torch.Generator,
                          eps: float = 1e-3) -> torch.Tensor:
    """CoDiLA AR objective (§3.5): frozen DLM marginals on block-masked x_t → soft tokens
    ``[<think>, e_1..e_B, </think>]`` → teacher-forced log-likelihood of the block's true tokens,
    Committed (unmasked) block positions are one-hot. The paper weights the NELBO by 1/t; here a fixed
    number of blocks that hold masks is drawn per row, which already scales the expected count of
    scored blocks like 1/t would, so the loss is a plain average per target token (lower variance).
    """
    b, n = x0.shape
    t = eps + (1 - eps) * torch.rand(b, generator=gen)
    masked = block_mask(b, n, t=t, block=block, gen=gen)
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    with torch.no_grad():
        raw = dlm(input_ids=xt, attention_mask={"full_attention": None}, use_cache=False).logits.float()
        logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)  # shifted: row i predicts token i
        pi = torch.softmax(logits[..., shared], dim=-1)  # [b, n, |shared|]
    onehot = torch.zeros_like(pi)
    pos = torch.searchsorted(shared, x0.clamp_max(int(shared[-1])))
    ok = shared[pos.clamp_max(len(shared) - 1)] == x0
    onehot.scatter_(2, pos.clamp_max(len(shared) - 1).unsqueeze(-1), 1.0)
    pi = torch.where(masked.unsqueeze(-1), pi, onehot)
    # choose blocks_per_row blocks per row that contain at least one mask (else any block)
    nblocks = (n - 1) // block
    starts = []
    for r in range(b):
        has = masked[r, 1 : 1 + nblocks * block].view(nblocks, block).any(-1).nonzero().flatten()
        pool = has if len(has) else torch.arange(nblocks)
        choice = pool[torch.randint(len(pool), (blocks_per_row,), generator=gen)]
        starts += [(r, 1 + int(c) * block) for c in choice]
    rows = torch.tensor([s[0] for s in starts])
    cols = torch.tensor([s[1] for s in starts])[:, None] + torch.arange(block)
    pi_blk = pi[rows[:, None], cols]  # [m, B, |shared|]
    tgt = x0[rows[:, None], cols]  # [m, B]
    valid = ok[rows[:, None], cols]
    emb = ar.get_input_embeddings().weight
    soft = pi_blk.to(emb.dtype) @ emb[shared]  # [m, B, d]
    m = soft.shape[0]
    inp = torch.cat([emb[think_open].expand(m, 1, -1), soft, emb[think_close].expand(m, 1, -1),
                     emb[tgt[:, :-1]]], dim=1)  # [m, 2B+1, d]
    out = ar(inputs_embeds=inp, use_cache=False).logits[:, block + 1 :].float()  # predicts tgt[0..B-1]
    ce = F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1), reduction="none").view(m, block)
    w = valid.float()
    return (ce * w).sum() / w.sum().clamp_min(1)
