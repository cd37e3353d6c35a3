"""The AR helper writing one block from soft embeddings (CoDiLA, Hersche et al., arXiv 2603.20216, §3.3).

For block positions j = 1..m with bridged marginals π_j over the shared ids S:

    e_j = Σ_{v∈S} π_j(v) · E_AR[v]            [m, |S|] @ [|S|, d] -> [m, d]   (fp32, cast to the AR dtype)
    input = [ctx tokens…, E(<think>), e_1 … e_m, E(</think>)]

then m tokens are written left to right with a KV cache: one prefill, then one cached step per token.
The K/V of the ``<think>`` prefix are computed once per run and reused by every block.
Outputs are restricted to S; a position already committed on the canvas is fed one-hot and forced.

``repetition_penalty`` ρ > 1 (CTRL, Keskar et al. 2019; the Hugging Face ``repetition_penalty``): before
each greedy or sampled choice, the logit z_v of every id v already in the text (``seen``: prompt and
committed canvas left of the block, plus the block's own tokens so far) becomes z_v / ρ if z_v > 0 else
z_v · ρ. ρ = 1 is off.
"""

from __future__ import annotations

import torch

from codila_cli.models.tokens import VocabBridge


class SoftBlockWriter:
    def __init__(self, ar, bridge: VocabBridge, *, temperature: float = 0.0, topk: int | None = None,
                 repetition_penalty: float = 1.0) -> None:
        self.ar = ar
        self.repetition_penalty = repetition_penalty
        self.bridge = bridge
        self.temperature = temperature
        self.topk = topk
        device = ar.embedding.device
        self.shared = bridge.shared_ids.to(device)
        self.table = ar.embedding[self.shared]  # [|S|, d] in the AR's dtype, gathered once per run
        self._open_kv: list | None = None  # K/V of the <think> prefix, computed once and reused per block
        self.allowed = bridge.ar_allowed[: ar.vocab_rows].to(device)
        index = torch.full((max(bridge.dlm_vocab_rows, ar.vocab_rows),), -1, dtype=torch.long)
        index[bridge.shared_ids] = torch.arange(len(bridge.shared_ids))
        self.index = index.to(device)  # DLM id -> column in S (or -1)

    def condition(self, pi: torch.Tensor, forced: list[int | None]) -> torch.Tensor:
        """π over the DLM vocab [m, V] (fp32) -> π over S [m, |S|]; forced rows one-hot; optional top-k."""
        q = self.bridge.restrict(pi)
        if self.topk is not None and self.topk < q.shape[-1]:
            vals, cols = torch.topk(q, self.topk, dim=-1)
            q = torch.zeros_like(q).scatter_(-1, cols, vals)
            q = q / q.sum(-1, keepdim=True).clamp_min(1e-12)
        for j, tok in enumerate(forced):
            if tok is not None:
                q[j] = 0.0
                col = int(self.index[tok]) if tok < len(self.index) else -1
                if col >= 0:
                    q[j, col] = 1.0
        return q

    def write(self, pi: torch.Tensor, forced: list[int | None], *, context: list[int] | None = None,
              seen: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Tokens [m] (DLM ids) for one block; ``pi`` [m, V_dlm] raw DLM marginals; ``seen`` [n] the
        ids of the text before the block (read only when repetition_penalty != 1)."""
        emb = self.ar.embedding
        q = self.condition(pi, forced)
        soft = q.to(emb.dtype) @ self.table  # [m, d]: one matmul per block
        open_e, close_e = self.ar.wrapper_embeddings()
        if context:
            parts = [emb[torch.tensor(context, device=emb.device)], open_e, soft, close_e]
            logits, cache = self.ar.forward(inputs_embeds=torch.cat(parts).unsqueeze(0), cache=None)
        else:  # the <think> prefix is the same for every block: reuse its K/V
            logits, cache = self.ar.forward(inputs_embeds=torch.cat([soft, close_e]).unsqueeze(0),
                                            cache=self._think_cache(open_e))
        penalise = self.repetition_penalty != 1.0
        if penalise:
            hit = torch.zeros(len(self.allowed), dtype=torch.bool, device=emb.device)
            if seen is not None and len(seen):
                ids = seen.to(emb.device)
                hit[ids[ids < len(hit)]] = True
        out: list[int] = []
        for j, tok in enumerate(forced):
            if tok is None:
                z = logits[0].float()
                if penalise:
                    rho = self.repetition_penalty
                    z = torch.where(hit, torch.where(z > 0, z / rho, z * rho), z)
                z = z.masked_fill(~self.allowed, float("-inf"))
                if self.temperature > 0:
                    tok = int(torch.multinomial(torch.softmax(z / self.temperature, -1), 1, generator=generator))
                else:
                    tok = int(z.argmax())
            out.append(tok)
            if penalise and tok < len(hit):
                hit[tok] = True
            if j + 1 < len(forced):
                nxt = emb[torch.tensor([[tok]], device=emb.device)]
                logits, cache = self.ar.forward(inputs_embeds=nxt, cache=cache)
        return torch.tensor(out, dtype=torch.long)

    def _think_cache(self, open_e: torch.Tensor):
        """A fresh KV cache holding the K/V of ``<think>`` (computed on first use, not counted per block)."""
        from codila_cli.models.native import new_cache

        if self._open_kv is None:
            _, cache = self.ar.forward(inputs_embeds=open_e.unsqueeze(0), cache=None)
            self.ar.forwards -= 1  # a one-off cost of the run, not of any block
            self._open_kv = [(layer.keys, layer.values) for layer in cache.layers]
        cache = new_cache(self.ar.model)
        for i, (k, v) in enumerate(self._open_kv):
            cache.update(k, v, i)
        return cache

    def verify(self, pi: torch.Tensor, proposal: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        """AR top-1 for each slot of W blocks at once, teacher-forced on ``proposal``.

        pi [W, B, V], proposal [W, B] DLM top-1 (committed tokens where ``forced``) -> AR top-1 [W, B].
        One batched forward, no cache.
        """
        W, B, _ = pi.shape
        emb = self.ar.embedding
        q = torch.stack([self.condition(pi[w], [int(t) if f else None for t, f in zip(proposal[w], forced[w])])
                         for w in range(W)])
        soft = q.to(emb.dtype) @ self.table
        open_e, close_e = self.ar.wrapper_embeddings()
        seq = torch.cat([open_e.expand(W, -1, -1), soft, close_e.expand(W, -1, -1), emb[proposal[:, :-1]]], dim=1)
        self.ar.forwards += 1
        with torch.inference_mode():
            logits = self.ar.model(inputs_embeds=seq, use_cache=False).logits[:, -B:].float()
        return logits.masked_fill(~self.allowed, float("-inf")).argmax(-1)
