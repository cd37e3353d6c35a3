"""The AR helper writing one block from soft embeddings (CoDiLA, Hersche et al., arXiv 2603.20216, §3.3).

For block positions j = 1..m with bridged marginals π_j over the shared ids S:

    e_j = Σ_{v∈S} π_j(v) · E_AR[v]            [m, |S|] @ [|S|, d] -> [m, d]   (fp32, cast to the AR dtype)
    input = [ctx tokens…, E(<think>), e_1 … e_m, E(</think>)]

then m tokens are written left to right with a KV cache: one prefill that also checks a guess for each
slot (see ``write``), then one cached forward from each slot whose guess was wrong. The K/V of the
``<think>`` prefix are computed once per run and reused by every block. With left context, the K/V of
the context tokens are kept after each block; the next block whose context begins with the same ids
(decoding/codila.py::_context keeps the start of the context fixed for n/2 tokens) computes only the
new ids. The AR is causal, so a token's K/V depend only on the ids left of it: the reuse is exact (up
to float summation order).
Outputs are restricted to S; a position already committed on the canvas is fed one-hot and forced.

The helper's token-level heuristics (repetition penalty, n-gram ban, syntax guard) are choice rules
(decoding/rules.py): the writer takes a list of them; each may only lower a logit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from codila_cli.decoding.rules import BlockText, ChoiceRule
from codila_cli.models.native import drop_last
from codila_cli.models.tokens import VocabBridge

_TOP = 8  # candidates per row scored by SoftBlockWriter._choose before it falls back to the full vocabulary
_WIDER = (_TOP, 64, 512)  # the widths it tries in turn
_REDRAWS = 16  # guarded sampling: struck-out draws before the ban is computed over the whole vocabulary


def _bridge_tensors(ar, bridge: VocabBridge) -> tuple:
    """(shared ids S [|S|], E_AR[S] [|S|, d] in the AR's dtype, DLM id -> column in S or −1, the AR ids
    the helper may output) on the AR's device: gathered once per helper and bridge, not per decode."""
    ar = getattr(ar, "_ar", ar)  # a batch row's view (decoding/batch.py::RowAR) shares its helper's
    cache = ar.__dict__.setdefault("_bridge_tensors", {})
    key = id(bridge)
    if key not in cache or cache[key][0] is not bridge:
        device = ar.embedding.device
        shared = bridge.shared_ids.to(device)
        index = torch.full((max(bridge.dlm_vocab_rows, ar.vocab_rows),), -1, dtype=torch.long)
        index[bridge.shared_ids] = torch.arange(len(bridge.shared_ids))
        # a contiguous S (the real Dream / Qwen3 pair: ids 0 … 151664) is a view of the embedding, not
        # a 310 MB copy of it at 7B
        table = ar.embedding[: len(shared)] if bridge.contiguous else ar.embedding[shared]
        cache[key] = (bridge, (shared, table, index.to(device), bridge.ar_allowed[: ar.vocab_rows].to(device)))
    return cache[key][1]


class SoftBlockWriter:
    def __init__(self, ar, bridge: VocabBridge, *, temperature: float = 0.0, topk: int | None = None,
                 guess: bool = True, rules: Sequence[ChoiceRule] = ()) -> None:
        self.ar = ar
        self.rules = tuple(rules)  # decoding/rules.py: each may only lower a logit
        self.guess = guess and temperature == 0  # check guesses in the forward (greedy only; see write)
        self.bridge = bridge
        self.temperature = temperature
        self.topk = topk
        self.shared, self.table, self.index, self.allowed = _bridge_tensors(ar, bridge)
        self.banned = (~self.allowed).nonzero().flatten()  # AR ids the helper may not output
        self._banned_set = set(self.banned.tolist())
        self._open_kv: list | None = None  # K/V of the <think> prefix, computed once and reused per block
        self._ctx_ids: list[int] = []  # the left context whose K/V are in _ctx_kv (positions 0 … n − 1)
        self._ctx_kv: list = []
        self.context_tokens_computed = 0  # context ids run through the AR (the rest came from _ctx_kv)

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

    def embed(self, q: torch.Tensor) -> torch.Tensor:
        """Soft embeddings e = q · E_AR[S]: [..., |S|] (fp32) -> [..., d] in the AR's dtype."""
        return q.to(self.table.dtype) @ self.table

    def write(self, pi: torch.Tensor, forced: list[int | None], *, context: list[int] | None = None,
              text: BlockText | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Tokens [m] (DLM ids) for one block; ``pi`` [m, V_dlm] raw DLM marginals; ``text`` what the
        choice rules read of the text before the block (None: every rule is off for this block).

        Greedy writing checks a guess in the same forward (exact, as speculative decoding with greedy
        acceptance): the guess for slot j is its forced id, else the top id of its soft token. A forward
        fed ``[x_0, g_1 … g_k]`` gives k + 1 rows; row r is the AR's true distribution for its slot as long
        as the guesses before it were what the AR chose. The first wrong guess ends the forward's rows,
        its K/V are cropped, and the next forward starts from the AR's own choice. A block whose guesses
        all hold costs one forward instead of m; sampling (temperature > 0) guesses nothing."""
        emb = self.ar.embedding
        q = self.condition(pi, forced)
        soft = self.embed(q)  # [m, d]: one matmul per block
        open_e, close_e = self.ar.wrapper_embeddings()
        m = len(forced)
        guess = self._guesses(q, forced) if self.guess else []
        if context:
            reuse = len(self._ctx_ids) if context[: len(self._ctx_ids)] == self._ctx_ids else 0
            new = context[reuse:]
            self.context_tokens_computed += len(new)
        else:
            new = []
        # the new context ids and the guesses: one gather
        hard = emb[torch.tensor(new + guess, dtype=torch.long, device=emb.device)]
        tail = [hard[len(new) :]] if guess else []
        if context:
            parts = ([hard[: len(new)]] if new else []) + [open_e, soft, close_e] + tail
            logits, cache = self.ar.forward(inputs_embeds=torch.cat(parts).unsqueeze(0), keep=len(guess) + 1,
                                            cache=self._kv_cache(self._ctx_kv) if reuse else None)
            n = len(context)
            self._ctx_ids = list(context)
            self._ctx_kv = [(layer.keys[:, :, :n], layer.values[:, :, :n]) for layer in cache.layers]
        else:  # the <think> prefix is the same for every block: reuse its K/V
            logits, cache = self.ar.forward(inputs_embeds=torch.cat([soft, close_e] + tail).unsqueeze(0),
                                            keep=len(guess) + 1, cache=self._think_cache(open_e))
        out: list[int] = []
        fed = guess  # the guesses behind rows 1 … of the current forward
        state = self._start(text)  # each rule's state before the next slot (None: off)
        while True:
            states = self._row_states(state, fed)
            choices = self._choose(logits[0], generator, states)  # every row, as if its guesses held
            for r, tok in enumerate(choices):  # row r predicts slot len(out)
                tok = forced[len(out)] if forced[len(out)] is not None else tok
                out.append(tok)
                state = self._step(state, tok)  # a forced token may turn a rule off
                if len(out) == m:
                    return torch.tensor(out, dtype=torch.long)
                if r == len(fed) or fed[r] != tok:  # no row left, or the next row read a wrong guess
                    break
            cache = drop_last(cache, len(fed) - r)  # the K/V of the wrong guesses
            fed = guess[len(out) :]
            step = torch.tensor([out[-1]] + fed, device=emb.device)
            logits, cache = self.ar.forward(inputs_embeds=emb[step].unsqueeze(0), cache=cache, keep=len(fed) + 1)

    def _start(self, text: BlockText | None) -> tuple:
        """Each rule's state before the block (None where it is off)."""
        return tuple(None if text is None else rule.start(text) for rule in self.rules)

    def _step(self, state: tuple, tok: int) -> tuple:
        return tuple(None if st is None else rule.step(st, tok) for rule, st in zip(self.rules, state))

    def _row_states(self, state: tuple, fed: list[int]) -> list[tuple]:
        """The rules' states before each row of a forward fed ``fed``."""
        states = [state]
        for tok in fed:
            states.append(self._step(states[-1], tok))
        return states

    def _active(self, state: tuple) -> bool:
        return any(st is not None for st in state)

    def _choose(self, z: torch.Tensor, generator, states: list[tuple]) -> list[int]:
        """The AR's choice for each row of ``z`` [k + 1, V] at once: row r is chosen under the rules'
        states ``states[r]`` (its guesses taken as already in the text), outputs restricted to S.

        Greedy: every rule only lowers a logit, so a row's winner is among its top n raw logits whenever
        the best of them after the rules is still above the row's n-th raw logit (every other column
        stays at or below that). Those few candidates are scored, n = ``_TOP`` first; a row that fails
        the check takes a wider n (a guard may ban all of the top few), and only then the
        full-vocabulary path. Same choice, ties to the lowest id as ``max``."""
        if self.temperature > 0 or z.shape[-1] <= _TOP:
            return self._choose_full(z, generator, states)
        out = []
        for r in range(z.shape[0]):
            for n in _WIDER:
                tok = self._choose_top(z[r], min(n, z.shape[-1]), states[r])
                if tok is not None:
                    break
            else:
                return self._choose_full(z, generator, states)
            out.append(tok)
        return out

    def _choose_top(self, row: torch.Tensor, n: int, state: tuple) -> int | None:
        """One row's greedy choice among its top ``n`` raw logits, or None when a column outside them
        could still win (see ``_choose``)."""
        vals, cols = row.topk(n)
        col_list, lowered = cols.tolist(), vals
        for rule, st in zip(self.rules, state):
            if st is not None:
                lowered = rule.lower(st, col_list, lowered)  # fp32, as in the full path
        raw, low, banned = vals.tolist(), lowered.tolist(), self._banned_set
        best, best_c = float("-inf"), -1
        for v, c in zip(low, col_list):
            if c in banned:
                continue
            if v > best or (v == best and c < best_c):
                best, best_c = v, c
        return best_c if best > raw[-1] or n == row.shape[-1] and best_c >= 0 else None

    def _choose_full(self, z: torch.Tensor, generator, states: list[tuple]) -> list[int]:
        """``_choose`` over the whole vocabulary, each rule lowering each row in place. Also the sampling
        path, where a *lazy* rule (one that only bans, and whose full ban is dear: the syntax guard)
        checks the drawn id instead."""
        z = z.float().clone()
        sampling = self.temperature > 0
        for r in range(z.shape[0] if not sampling else 1):  # one row: sampling guesses nothing
            for rule, st in zip(self.rules, states[r]):
                if st is not None and not (sampling and rule.lazy):
                    rule.lower_row(st, z[r])
        z[:, self.banned] = float("-inf")
        if sampling:
            return [self._sample(z[0], states[0], generator)]
        return z.max(-1).indices.tolist()

    def _sample(self, z: torch.Tensor, state: tuple, generator) -> int:
        """A draw from softmax(z / T) without the ids the lazy rules ban: a banned draw is struck out and
        the rest drawn from again, which is the same distribution as banning first (the draws left over
        renormalise), without scanning the vocabulary; after ``_REDRAWS`` struck-out draws the bans are
        computed in full."""
        lazy = [(rule, st) for rule, st in zip(self.rules, state) if st is not None and rule.lazy]
        for _ in range(_REDRAWS if lazy else 1):
            tok = int(torch.multinomial(torch.softmax(z / self.temperature, -1), 1, generator=generator))
            if not any(torch.isneginf(rule.lower(st, [tok], z[tok : tok + 1]))[0] for rule, st in lazy):
                return tok
            z[tok] = float("-inf")
        for rule, st in lazy:
            rule.lower_row(st, z)
        return int(torch.multinomial(torch.softmax(z / self.temperature, -1), 1, generator=generator))

    def _guesses(self, q: torch.Tensor, forced: list[int | None]) -> list[int]:
        """Guesses for slots 0 … m − 2: the forced id, else the top id of the slot's soft token."""
        top = self.shared[q[: len(forced) - 1].argmax(-1)].tolist()
        return [f if f is not None else g for f, g in zip(forced, top)]

    def _think_cache(self, open_e: torch.Tensor):
        """A fresh KV cache holding the K/V of ``<think>`` (computed on first use, not counted per block)."""
        if self._open_kv is None:
            _, cache = self.ar.forward(inputs_embeds=open_e.unsqueeze(0), cache=None)
            self.ar.forwards -= 1  # a one-off cost of the run, not of any block
            self._open_kv = [(layer.keys, layer.values) for layer in cache.layers]
        return self._kv_cache(self._open_kv)

    def _kv_cache(self, kv: list) -> object:
        """A fresh KV cache holding the per-layer (keys, values) ``kv`` (the tensors are shared, never
        written: a cache update concatenates into new tensors)."""
        from codila_cli.models.native import new_cache

        cache = new_cache(self.ar.model)
        for i, (k, v) in enumerate(kv):
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
        soft = self.embed(q)
        open_e, close_e = self.ar.wrapper_embeddings()
        seq = torch.cat([open_e.expand(W, -1, -1), soft, close_e.expand(W, -1, -1), emb[proposal[:, :-1]]], dim=1)
        self.ar.forwards += 1
        with torch.inference_mode():
            logits = self.ar.model(inputs_embeds=seq, use_cache=False).logits[:, -B:].float()
        return logits.masked_fill(~self.allowed, float("-inf")).argmax(-1)
