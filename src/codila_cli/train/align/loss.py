"""CoDiLA's AR objective at real scale (Hersche et al., arXiv 2603.20216, §3.5 and Eq. 2).

For a clean window x_0 [n] the frozen DLM sees a block-masked x_t; for each scored block of B
positions s … s+B−1 the helper reads

    [ctx…, <think>, e_1 … e_B, </think>, y_1 … y_{B−1}]      e_j = Σ_{v∈S} π_j(v)·E_AR[v]

and is scored, teacher-forced, on the block's true tokens y_1 … y_B (its last B output rows). π_j is
the DLM's marginal of token s+j−1 at temperature 1 over the ids S both tokenizers share, i.e. the
softmax of (hidden row s+j−2) · W_head[S]ᵀ: Dream's shift (row i−1 predicts token i) is applied
here, once, by picking the hidden rows. A committed (unmasked) block position is fed one-hot, which
is exactly E_AR[x_0].

Memory: the DLM runs once per row batch and returns hidden states [b, n, d] (bf16 on a GPU);
only the rows of the chosen blocks are projected onto S, in chunks of ``CHUNK`` rows, and straight
into the helper's embedding space (:class:`SoftEmbed`), so no [b, n, V] tensor ever exists (at
Dream-Coder-7B × 2,048 tokens × 152k ids one row batch of 8 would be ~10 GB in fp32). The backward
pass recomputes each chunk's π instead of keeping it. With ``--marginals-cache`` (cache.py) the blocks'
π is truncated to its top k ids (:func:`block_topk`) and read from disk when another run wrote it.

Weighting (``weighting``): ``nelbo`` is Eq. 2, the masked-diffusion NELBO: every masked token of a
row at masking rate t counts with weight 1/t, summed over the row's masked blocks and divided by the
row length. Only k blocks per row are scored, drawn uniformly (with replacement) from the blocks that
hold masks, so each carries the factor (blocks with masks)/k: an unbiased estimate of the full sum.
``mean`` is the plain mean CE over scored masked tokens (the bundled pair's recipe: lower variance;
with block masking at rate t the expected count of masked blocks grows like t, which cancels most of
the 1/t). Frontier blocks (left-to-right masks, not the NELBO's forward process) count with weight 1
under both. Every normaliser is a constant of the batch shape, so the loss of a batch split over
ranks or micro-batches averages to exactly the loss of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK = 256  # block rows projected onto the shared vocabulary at a time
WEIGHTINGS = ("nelbo", "mean")


@dataclass(frozen=True)
class PairIds:
    """What the objective needs to know of the pair's token layout."""

    mask: int  # the DLM's mask id
    open_ids: tuple[int, ...]  # the helper's <think> (one special token, or the literal's pieces)
    close_ids: tuple[int, ...]
    shared: torch.Tensor  # S [|S|] long, sorted: the DLM's ids of the pairs
    contiguous: bool  # S == 0 … |S|−1 (the real Dream/Qwen3 pair): views instead of gathers
    ar_shared: torch.Tensor | None = None  # the helper's ids of the same pairs (models/token_map.py); None: S
    to_ar: torch.Tensor | None = None  # [V_dlm] DLM id -> helper id, the unpaired -> ``ar_fill``; None: identity
    ar_fill: int = 0  # the helper id an unpaired DLM token is fed as (its end-of-text; never scored)
    shifted: bool = True  # Dream's shift: hidden row i − 1 gives token i (LLaDA's row i gives token i)

    def helper_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """DLM ids -> the helper's ids (the same ids unless a TokenMap bridges two vocabularies)."""
        if self.to_ar is None:
            return ids
        mapped = self.to_ar.to(ids.device)[ids]
        return torch.where(mapped >= 0, mapped, self.ar_fill)


class SoftEmbed(torch.autograd.Function):
    """e = softmax(h · W_Sᵀ) · E_S, chunk by chunk. h [k, d_dlm] and W_S [|S|, d_dlm] are frozen; the
    gradient reaches only E_S [|S|, d_ar] (dE_S = πᵀ · de, π recomputed per chunk in backward)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, head_s: torch.Tensor, emb_s: torch.Tensor, chunk: int) -> torch.Tensor:
        ctx.save_for_backward(h, head_s)
        ctx.chunk = chunk
        ctx.emb_shape, ctx.emb_dtype = emb_s.shape, emb_s.dtype
        out = torch.empty(h.shape[0], emb_s.shape[1], dtype=torch.float32, device=h.device)
        e = emb_s.float()
        with torch.autocast(h.device.type, enabled=False):  # π and its embedding in fp32 under bf16 autocast
            for i in range(0, h.shape[0], chunk):
                pi = torch.softmax((h[i : i + chunk] @ head_s.T).float(), dim=-1)
                out[i : i + chunk] = pi @ e
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, head_s = ctx.saved_tensors
        grad_e = torch.zeros(ctx.emb_shape, dtype=torch.float32, device=grad.device)
        with torch.autocast(h.device.type, enabled=False):
            for i in range(0, h.shape[0], ctx.chunk):
                pi = torch.softmax((h[i : i + ctx.chunk] @ head_s.T).float(), dim=-1)
                grad_e += pi.T @ grad[i : i + ctx.chunk].float()
        return None, None, grad_e.to(ctx.emb_dtype), None


def final_hidden(model, ids: torch.Tensor) -> torch.Tensor:
    """The DLM's final-norm hidden states [b, n, d] under full (bidirectional) attention, without the
    vocabulary projection (native engine or transformers)."""
    full = {"full_attention": None}
    if hasattr(model, "hidden_states"):
        return model.hidden_states(ids, attention_mask=full)[0]
    return model.model(input_ids=ids, attention_mask=full, use_cache=False).last_hidden_state


@dataclass(frozen=True)
class RowPlan:
    """One row's forward process and the blocks it scores."""

    masked: torch.Tensor  # [n] bool: the positions masked in x_t
    starts: tuple[int, ...]  # the scored blocks' first positions (>= 1)
    weight: float  # per masked token of every scored block
    context: tuple[int, ...]  # committed left-context tokens each block's helper reads


def plan_row(n: int, *, block: int, blocks: int, gen: torch.Generator, frontier: bool, ctx_max: int,
             ctx_prob: float, weighting: str, eps: float = 1e-3) -> RowPlan:
    """Draw one row's masks (block masking at rate t ~ U(eps, 1): tokens at rate t plus whole grid
    blocks with probability t; or frontier masks) and its scored blocks, from the row's own generator."""
    col = torch.arange(n)
    if frontier:
        lo = min(8, n - block - 1)
        s = int(lo + 1 + torch.randint(n - block - lo, (1,), generator=gen))
        u = 1.0 if float(torch.rand(1, generator=gen)) < 0.5 else 0.5 + 0.5 * float(torch.rand(1, generator=gen))
        masked = (col >= s) & (torch.rand(n, generator=gen) < u)
        masked |= (col >= s) & (col < s + block)
        starts, weight = (s,), 1.0
    else:
        t = eps + (1 - eps) * float(torch.rand(1, generator=gen))
        masked = torch.rand(n, generator=gen) < t
        nblocks = (n - 1) // block
        whole = (torch.rand(nblocks, generator=gen) < t).repeat_interleave(block)
        masked[1 : 1 + len(whole)] |= whole
        masked[0] = False
        has = masked[1 : 1 + nblocks * block].view(nblocks, block).any(-1).nonzero().flatten()
        pool = has if len(has) else torch.arange(nblocks)
        pick = pool[torch.randint(len(pool), (blocks,), generator=gen)]
        starts = tuple(1 + int(c) * block for c in pick)
        weight = len(has) / (blocks * t) if weighting == "nelbo" else 1.0
    context = []
    for s in starts:
        c = 0
        if ctx_max > 0 and float(torch.rand(1, generator=gen)) < (1.0 if frontier else ctx_prob):
            left = masked[max(0, s - ctx_max) : s]
            holes = left.nonzero().flatten()
            c = len(left) - (int(holes[-1]) + 1 if len(holes) else 0)
        context.append(c)
    return RowPlan(masked, starts, weight, tuple(context))


def normaliser(plans: list[RowPlan], *, n: int, block: int, weighting: str, frontier: bool) -> float:
    """The loss's denominator: a constant of the batch shape (see the module docstring)."""
    if weighting == "nelbo" and not frontier:
        return len(plans) * (n - 1)
    return sum(len(p.starts) for p in plans) * block


def _layout(x0: torch.Tensor, plans: list[RowPlan], *, block: int):
    """(masked [b, n], rows [m], cols [m, B]): the rows' masks and the positions of their scored blocks."""
    device = x0.device
    masked = torch.stack([p.masked for p in plans]).to(device)
    rows = torch.tensor([r for r, p in enumerate(plans) for _ in p.starts], device=device)
    cols = torch.tensor([s for p in plans for s in p.starts], device=device)[:, None] + torch.arange(block, device=device)
    return masked, rows, cols


def _block_hidden(dlm, x0: torch.Tensor, masked: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, *,
                  mask: int, shifted: bool = True) -> torch.Tensor:
    """hidden [m, B, d] of the scored blocks: the DLM on x_t under no-grad, row i−1 for token i (Dream's
    shift; row i for a model without it, LLaDA)."""
    xt = torch.where(masked, torch.full_like(x0, mask), x0)
    with torch.no_grad():
        return final_hidden(dlm, xt)[rows[:, None], cols - 1 if shifted else cols]


def block_topk(dlm, x0: torch.Tensor, plans: list[RowPlan], *, ids: PairIds, block: int, head_s: torch.Tensor,
               k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely shared ids of each scored position and their probabilities renormalised over
    the k, rounded to float16 (what ``--marginals-cache`` stores): (idx [m, B, k] long into S,
    probs [m, B, k] float32)."""
    hidden = _block_hidden(dlm, x0, *_layout(x0, plans, block=block), mask=ids.mask, shifted=ids.shifted)
    m = hidden.shape[0]
    h = hidden.reshape(m * block, -1)
    idx = torch.empty(m * block, k, dtype=torch.long, device=h.device)
    probs = torch.empty(m * block, k, dtype=torch.float32, device=h.device)
    with torch.no_grad(), torch.autocast(h.device.type, enabled=False):
        for i in range(0, h.shape[0], CHUNK):
            pi = torch.softmax((h[i : i + CHUNK] @ head_s.T).float(), dim=-1)
            top, where = pi.topk(k, dim=-1)
            probs[i : i + CHUNK] = (top / top.sum(-1, keepdim=True)).half().float()
            idx[i : i + CHUNK] = where
    return idx.view(m, block, k), probs.view(m, block, k)


def alignment_loss(dlm, ar, x0: torch.Tensor, plans: list[RowPlan], *, ids: PairIds, block: int,
                   weighting: str, frontier: bool, head_s: torch.Tensor, ar_embedding: torch.Tensor,
                   banned: torch.Tensor | None = None,
                   topk: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The scalar loss of a row batch x0 [b, n] under its plans. ``dlm``: the frozen DLM network;
    ``ar``: the helper (or its DDP wrapper: its forward is what gets called); ``head_s`` = W_head[S]
    of the DLM, ``ar_embedding`` = E_AR (trainable); ``banned`` [V_ar] bool: helper outputs outside S.
    ``topk``: the blocks' truncated marginals (:func:`block_topk`, cache.py); the DLM is then not run."""
    n = x0.shape[1]
    device = x0.device
    masked, rows, cols = _layout(x0, plans, block=block)
    m = len(rows)
    emb_s = (ar_embedding[: len(ids.shared)] if ids.contiguous and ids.ar_shared is None else
             ar_embedding[(ids.shared if ids.ar_shared is None else ids.ar_shared).to(device)])
    if topk is None:
        hidden = _block_hidden(dlm, x0, masked, rows, cols, mask=ids.mask, shifted=ids.shifted)
        soft = SoftEmbed.apply(hidden.reshape(m * block, -1), head_s, emb_s, CHUNK).view(m, block, -1)
    else:  # Σ_{top-k} π̂(v)·E_AR[v]
        idx, probs = (t.to(device) for t in topk)
        soft = (probs[..., None] * emb_s[idx].float()).sum(-2)
    tgt = x0[rows[:, None], cols]  # [m, B] DLM ids
    tgt_ar = ids.helper_ids(tgt)  # what the helper reads and is scored on
    blk_masked = masked[rows[:, None], cols]
    soft = torch.where(blk_masked[..., None], soft, ar_embedding[tgt_ar].float())  # committed: one-hot
    dtype = ar_embedding.dtype
    open_e = ar_embedding[torch.tensor(ids.open_ids, device=device)].expand(m, -1, -1)
    close_e = ar_embedding[torch.tensor(ids.close_ids, device=device)].expand(m, -1, -1)
    body = torch.cat([open_e, soft.to(dtype), close_e, ar_embedding[tgt_ar[:, :-1]]], dim=1)
    ctx_len = [c for p in plans for c in p.context]
    C = max(ctx_len, default=0)
    if C == 0:
        out = ar(inputs_embeds=body, use_cache=False, logits_to_keep=block).logits
    else:  # left-pad the contexts so every row ends at the same place; pads are masked out
        starts = [s for p in plans for s in p.starts]
        ctx = torch.zeros(m, C, body.shape[-1], dtype=dtype, device=device)
        attn = torch.ones(m, C + body.shape[1], dtype=torch.long, device=device)
        for j, (r, s, c) in enumerate(zip(rows.tolist(), starts, ctx_len)):
            if c:
                ctx[j, C - c :] = ar_embedding[ids.helper_ids(x0[r, s - c : s])]
            attn[j, : C - c] = 0
        position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
        out = ar(inputs_embeds=torch.cat([ctx, body], 1), attention_mask=attn, position_ids=position_ids,
                 use_cache=False, logits_to_keep=block).logits
    out = out[:, -block:].float()
    if banned is not None:
        out = out.masked_fill(banned[: out.shape[-1]].to(device), torch.finfo(out.dtype).min)
    ce = F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt_ar.reshape(-1), reduction="none").view(m, block)
    in_s = torch.zeros(max(int(ids.shared[-1]) + 1, int(tgt.max()) + 1), dtype=torch.bool, device=device)
    in_s[ids.shared.to(device)] = True
    weight = torch.tensor([p.weight for p in plans for _ in p.starts], device=device)[:, None]
    scored = (blk_masked & in_s[tgt]).float() * weight
    return (ce * scored).sum() / normaliser(plans, n=n, block=block, weighting=weighting, frontier=frontier)
