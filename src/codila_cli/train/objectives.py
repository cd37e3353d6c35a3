"""Training losses: causal LM, masked diffusion with Dream's shift, DreamOn infilling (CoDiLA's
alignment objective is train/align/loss.py).

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


def dreamon_batch(rows: list[list[int]], *, bos: int, eos: int, mask: int, expand: int, newline: int,
                  seq_len: int, gen: torch.Generator, max_deletes: int = 16, merge_prob: float = 0.5,
                  eps: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DreamOn training examples (arXiv 2602.01326, its training recipe) from token rows (each a code sample without bos).

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
