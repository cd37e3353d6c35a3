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
                   eps: float = 1e-3, maskable: torch.Tensor | None = None,
                   frontier: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-diffusion NELBO (MDLM/LLaDA/Dream): t ~ U(eps, 1) per row, each position masked with prob t,
    cross-entropy on masked positions weighted by 1/t, averaged over all B·L positions.

    Dream's shift: the raw logit row i-1 predicts token i, so the loss reads ``logits[:, :-1]`` against
    ``x0[:, 1:]`` (the same alignment as a causal LM, with bidirectional attention).
    ``frontier`` [B] (optional): for a row with a value s >= 0, the masks of left-to-right decoding instead:
    nothing left of s is masked, s itself is, and every later position with prob t (the row's weight
    stays 1/t). Rows with -1 keep the plain masks.
    Returns (weighted loss, unweighted mean CE over masked tokens).
    """
    b, n = x0.shape
    if t is None:
        t = eps + (1 - eps) * torch.rand(b, generator=gen)
    masked = torch.rand(b, n, generator=gen) < t[:, None]
    if frontier is not None:
        col = torch.arange(n)[None, :]
        front = frontier[:, None]
        on = front >= 0
        masked = torch.where(on, (masked & (col > front)) | (col == front), masked)
    masked[:, 0] = False
    if maskable is not None:  # only these positions are ever noised (e.g. contract values, unit bodies)
        masked &= maskable
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    logits = model(input_ids=xt, attention_mask={"full_attention": None}, use_cache=False).logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x0[:, 1:].reshape(-1), reduction="none").view(b, n - 1)
    m = masked[:, 1:].float()
    denom = int(maskable[:, 1:].sum()) if maskable is not None else b * (n - 1)
    weighted = (ce * m / t[:, None]).sum() / max(1, denom)
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
                          eps: float = 1e-3, ctx_max: int = 0, ctx_prob: float = 0.5,
                          frontier: bool = False) -> torch.Tensor:
    """CoDiLA AR objective (§3.5): frozen DLM marginals on block-masked x_t → soft tokens
    ``[ctx…, <think>, e_1..e_B, </think>]`` → teacher-forced log-likelihood of the block's true tokens.

    Committed (unmasked) block positions are one-hot. The paper weights the NELBO by 1/t; here a fixed
    number of blocks that hold masks is drawn per row, which already scales the expected count of
    scored blocks like 1/t would, so the loss is a plain average per target token (lower variance).
    With ``ctx_max`` > 0, a share ``ctx_prob`` of the blocks also get their committed left context (the
    true tokens left of the block back to the nearest mask, at most ``ctx_max``), exactly what
    ``--ar-context`` feeds at inference; the rest get none, so both modes are trained.

    ``frontier``: the masks of left-to-right decoding instead (what the helper meets at inference): per
    row a block start s, everything left of s visible, the block masked, and everything right of it
    masked at a rate u (u = 1 for half the rows, else u ~ U(0.5, 1)); one block per row.
    """
    b, n = x0.shape
    if frontier:
        lo = min(8, n - block - 1)
        front = lo + 1 + torch.randint(n - block - lo, (b,), generator=gen)  # block start, 1 + lo .. n - block
        u = torch.where(torch.rand(b, generator=gen) < 0.5, 1.0, 0.5 + 0.5 * torch.rand(b, generator=gen))
        col = torch.arange(n)[None, :]
        masked = (col >= front[:, None]) & (torch.rand(b, n, generator=gen) < u[:, None])
        masked |= (col >= front[:, None]) & (col < front[:, None] + block)
    else:
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
    nblocks = (n - 1) // block
    starts = []
    for r in range(b):
        if frontier:
            starts.append((r, int(front[r])))
            continue
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
    soft = pi_blk.to(emb.dtype) @ emb[shared]  # [m, d]
    m = soft.shape[0]
    body = torch.cat([emb[think_open].expand(m, 1, -1), soft, emb[think_close].expand(m, 1, -1),
                      emb[tgt[:, :-1]]], dim=1)  # [m, 2B+1, d]
    ctx_len = torch.zeros(m, dtype=torch.long)
    if ctx_max > 0:
        for j, (r, s) in enumerate(starts):
            if float(torch.rand(1, generator=gen)) < ctx_prob:
                left = masked[r, max(0, s - ctx_max) : s]
                holes = left.nonzero().flatten()
                ctx_len[j] = len(left) - (int(holes[-1]) + 1 if len(holes) else 0)
    C = int(ctx_len.max())
    if C == 0:
        out = ar(inputs_embeds=body, use_cache=False).logits[:, block + 1 :].float()
    else:  # left-pad the context so every row ends at the same place; pads are masked out
        ctx = torch.zeros(m, C, emb.shape[1], dtype=emb.dtype)
        attn = torch.ones(m, C + body.shape[1], dtype=torch.long)
        for j, (r, s) in enumerate(starts):
            c = int(ctx_len[j])
            if c:
                ctx[j, C - c :] = emb[x0[r, s - c : s]]
            attn[j, : C - c] = 0
        position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
        out = ar(inputs_embeds=torch.cat([ctx, body], 1), attention_mask=attn, position_ids=position_ids,
                 use_cache=False).logits[:, C + block + 1 :].float()
    ce = F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1), reduction="none").view(m, block)
    w = valid.float()
    return (ce * w).sum() / w.sum().clamp_min(1)


def dreamon_batch(rows: list[list[int]], *, bos: int, eos: int, mask: int, expand: int, newline: int,
                  seq_len: int, gen: torch.Generator, max_deletes: int = 16, merge_prob: float = 0.5,
                  eps: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DreamOn training examples (algorithms.md §2.6) from token rows (each a code sample without bos).

    Per row: a random span of whole lines is the middle; 0..max_deletes end-of-text tokens are appended
    to it as delete targets; middle tokens are masked with ratio t ~ U(eps, 1); adjacent masked pairs are
    merged with probability ``merge_prob`` into one slot whose target is ``<|expand|>`` (the second slot
    disappears, later positions shift left). Returns (inputs [B, L], targets [B, L] with -100 where no
    loss, weights [B, L]: 1/t per masked slot, delete targets sharing one slot's weight, all divided by
    the number of middle slots in the batch).
    """
    inputs = torch.full((len(rows), seq_len), eos, dtype=torch.long)
    targets = torch.full((len(rows), seq_len), -100, dtype=torch.long)
    weights = torch.zeros(len(rows), seq_len)
    total_slots = 0
    for r, ids in enumerate(rows):
        lines = [i + 1 for i, t in enumerate(ids) if t == newline]  # token index after each newline
        starts = [0] + [s for s in lines if s < len(ids)]
        a = int(torch.randint(len(starts), (1,), generator=gen))
        b = a + 1 + int(torch.randint(min(6, len(starts) - a), (1,), generator=gen))
        lo = starts[a]
        hi = starts[b] if b < len(starts) else len(ids)
        prefix, middle, suffix = ids[:lo], ids[lo:hi], ids[hi:]
        n_del = int(torch.randint(max_deletes + 1, (1,), generator=gen))
        middle = middle + [eos] * n_del
        t = eps + (1 - eps) * float(torch.rand(1, generator=gen))
        masked = (torch.rand(len(middle), generator=gen) < t).tolist()
        slots_in, slots_tgt, slots_w = [], [], []
        i = 0
        while i < len(middle):
            if masked[i] and i + 1 < len(middle) and masked[i + 1] and float(torch.rand(1, generator=gen)) < merge_prob:
                slots_in.append(mask), slots_tgt.append(expand), slots_w.append(1.0 / t)
                i += 2
                continue
            if masked[i]:
                is_del = middle[i] == eos
                slots_in.append(mask), slots_tgt.append(middle[i])
                slots_w.append((1.0 / t) / max(1, n_del) if is_del else 1.0 / t)
            else:
                slots_in.append(middle[i]), slots_tgt.append(-100), slots_w.append(0.0)
            i += 1
        total_slots += len(slots_in)
        seq = [bos] + prefix + slots_in + suffix + [eos]
        tgt = [-100] * (1 + len(prefix)) + slots_tgt + [-100] * (len(suffix) + 1)
        w = [0.0] * (1 + len(prefix)) + slots_w + [0.0] * (len(suffix) + 1)
        if len(seq) > seq_len:  # keep the middle: cut the far ends of prefix and suffix
            over = len(seq) - seq_len
            cut_suffix = min(over, len(suffix))
            seq, tgt, w = seq[: len(seq) - cut_suffix], tgt[: len(tgt) - cut_suffix], w[: len(w) - cut_suffix]
            over -= cut_suffix
            if over:
                seq, tgt, w = seq[:1] + seq[1 + over :], tgt[:1] + tgt[1 + over :], w[:1] + w[1 + over :]
        n = len(seq)
        inputs[r, :n] = torch.tensor(seq)
        targets[r, :n] = torch.tensor(tgt)
        weights[r, :n] = torch.tensor(w)
    return inputs, targets, weights / max(1, total_slots)  # NELBO per middle slot: E[#masked / t] is constant


def dreamon_loss(model, inputs: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted CE on masked middle slots with Dream's shift (row i-1 predicts slot i)."""
    logits = model(input_ids=inputs, attention_mask={"full_attention": None}, use_cache=False).logits[:, :-1].float()
    tgt = targets[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1).clamp_min(0), reduction="none")
    ce = ce.view_as(tgt) * (tgt != -100)
    return (ce * weights[:, 1:]).sum()
