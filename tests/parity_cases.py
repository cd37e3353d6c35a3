"""Runs the golden cases of ../shared/parity/ through codila's decoders (tests/test_parity.py).

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python tests/parity_cases.py

prints one JSON object: case id -> [ids, forwards], plus ``_sha`` (each case's first-forward logits
hash) and ``_gemm`` (see :func:`gemm_fingerprint`). The goldens were made where torch ran its AVX2
kernels; on a CPU with AVX-512 torch picks other kernels, whose last bits differ, and a case full of
exact confidence ties (dream-077) then breaks one differently. The three variables pin torch's own and
oneDNN's kernels (bf16 then matches bit for bit everywhere seen), so the test runs this file in a
subprocess that sets them. MKL's fp32 GEMM is not pinned by them: on a machine whose MKL takes another
code path (CI once ran on one: every fp32 hash differed, every bf16 one matched) the fp32 logits differ
in their last bits from the goldens' machine, whatever codila does; the fingerprint tells the tests so.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import torch
from shared_data import PARITY  # ../shared/parity, absent from a fresh clone


def _cases(name: str) -> list[dict]:
    path = PARITY / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


DREAM = _cases("dream_cases.jsonl")
FAST = _cases("fastdllm_cases.jsonl")
DREAMON_DIR = Path(__file__).resolve().parent / "fixtures" / "dreamon"  # made here, README there
DREAMON = [json.loads(line) for line in (DREAMON_DIR / "dreamon_cases.jsonl").read_text().splitlines()]
# session 23 (README files there): Dream's entropy at low temperature without top-p, DreamOn with top-k
ENTROPY = [json.loads(line) for line in
           (Path(__file__).resolve().parent / "fixtures" / "dream_entropy" / "dream_entropy_cases.jsonl").read_text().splitlines()
           if DREAM]  # on the shared checkpoints
DREAMON_TOPK = [json.loads(line) for line in (DREAMON_DIR / "dreamon_topk_cases.jsonl").read_text().splitlines()]


@cache
def _dlm(checkpoint: str, dtype: str):
    from codila_cli.models.families import load_dlm

    return load_dlm(PARITY / "checkpoints" / checkpoint, name=checkpoint, device=torch.device("cpu"),
                    dtype=getattr(torch, dtype))


@cache
def _dreamon_dlm(checkpoint: str, dtype: str):
    from codila_cli.models.families import load_dlm

    return load_dlm(DREAMON_DIR / "checkpoints" / checkpoint, name=checkpoint, device=torch.device("cpu"),
                    dtype=getattr(torch, dtype))


def _target(case: dict) -> tuple[list[int], int]:
    if case.get("mask_ban_changes_output"):
        return case["expected_ids_mask_banned"][0], case["forwards_mask_banned"]
    return case["expected_ids"][0], case["forwards"]


def _sampling(s: dict):
    from codila_cli.decoding.config import SamplingConfig

    return SamplingConfig(temperature=s["temperature"] or 0.0, top_p=s["top_p"], top_k=s["top_k"])


NEAR_TIE = 1e-4  # a confidence gap at the top-n boundary that another machine's fp32 rounding may close


class TieWatch:
    """Records, for one decode, the gap at each top-n selection between the n-th confidence and the best
    one left out (``torch.topk`` on the sequence-long row, the only 1-D topk of the loop), and the first
    step whose committed tokens differ from the golden's: a case may be excused on other arithmetic
    only if a near-tie came at or before that step."""

    def __init__(self, want: list[int], prompt_len: int) -> None:
        self.want, self.prompt_len, self.gaps, self.first_wrong = want, prompt_len, [], None

    def topk(self, real):
        def watched(x, k, *a, **kw):
            out = real(x, k, *a, **kw)
            if x.dim() == 1:
                finite = x[torch.isfinite(x)]
                nxt = real(finite, k + 1).values[-1] if len(finite) > k else None
                self.gaps.append(float(out.values[-1] - nxt) if nxt is not None else float("inf"))
            return out
        return watched

    def on_step(self, event) -> None:
        wrong = any(self.want[self.prompt_len + p] != t for p, t in zip(event.positions, event.tokens))
        if wrong and self.first_wrong is None:
            self.first_wrong = len(self.gaps)  # the selections up to and including this step's

    def excusable(self) -> bool:
        return self.first_wrong is not None and any(g <= NEAR_TIE for g in self.gaps[: self.first_wrong])


TIES: dict[str, bool] = {}  # case id -> excusable (single-row cases only)


def run_dream(case: dict, row: int = 0) -> tuple[list[int], int]:
    from codila_cli.decoding import dream
    from codila_cli.decoding.config import DreamConfig
    from codila_cli.decoding.dream import decode_dream

    s = case["settings"]
    ids = case["input_ids"][row]
    if case["attention_mask"] is not None:  # one row of a left-padded batch: its unpadded prompt
        ids = [t for t, keep in zip(ids, case["attention_mask"][row]) if keep]
    dlm = _dlm(case["checkpoint"], case["dtype"])
    cfg = DreamConfig(max_new_tokens=s["max_new_tokens"], steps=s["steps"], alg=s["alg"], alg_temp=s["alg_temp"],
                      sampling=_sampling(s), early_stop=False, exact_steps=True)
    torch.manual_seed(case["seed"])
    watch = TieWatch(_target(case)[0], len(ids)) if case["attention_mask"] is None else None
    real = dream.torch.topk
    if watch is not None:
        dream.torch.topk = watch.topk(real)
    try:
        res = decode_dream(dlm, ids, config=cfg, generator=torch.Generator().manual_seed(case["seed"]),
                           on_step=watch.on_step if watch is not None else (lambda e: None))
    finally:
        dream.torch.topk = real
    if watch is not None:
        TIES[case["id"]] = watch.excusable()
    return ids + res.canvas, res.dlm_forwards


def run_fast_dllm(case: dict) -> tuple[list[int], int]:
    from codila_cli.decoding.config import ThresholdConfig
    from codila_cli.decoding.threshold import decode_threshold

    s = case["settings"]
    ids = case["input_ids"][0]
    block = s.get("block_length") or s["max_new_tokens"] // s["steps"]  # no cache: the quota L / steps
    entropy = s["steps"] if s["alg"] == "entropy" else None  # group block_entropy: the cached entropy mode
    cfg = ThresholdConfig(max_new_tokens=s["max_new_tokens"], block_length=block, threshold=s["threshold"],
                          sampling=_sampling(s), early_stop=False, cache=case["cache"], convention="fast-dllm",
                          entropy_steps=entropy)
    torch.manual_seed(case["seed"])
    res = decode_threshold(_dlm(case["checkpoint"], case["dtype"]), ids, config=cfg,
                           generator=torch.Generator().manual_seed(case["seed"]))
    return ids + res.canvas, res.dlm_forwards


def run_dreamon(case: dict) -> tuple[list[int], int]:
    """codila's DreamOn sampler on a golden case: the official loop's settings mapped 1:1
    (min_gen_len → initial_masks, max_gen_len → max_middle_tokens, steps → the forward cap; the expansion
    budget is max_gen_len in both)."""
    from codila_cli.decoding.config import InfillConfig
    from codila_cli.decoding.dreamon import decode_dreamon

    s = case["settings"]
    cfg = InfillConfig(initial_masks=s["min_gen_len"], max_middle_tokens=s["max_gen_len"], steps=s["steps"],
                       alg=s["alg"], sampling=_sampling(s))
    assert cfg.budget == s["expand_budget"]
    torch.manual_seed(case["seed"])
    res = decode_dreamon(_dreamon_dlm(case["checkpoint"], case["dtype"]), prefix_ids=case["prefix_ids"],
                         suffix_ids=case["suffix_ids"], config=cfg,
                         generator=torch.Generator().manual_seed(case["seed"]))
    return res.middle, res.dlm_forwards


def first_forward_sha(case: dict) -> str:
    """SHA-256 of codila's raw logits of the initial canvas, bytes as the golden's (IEEE, little-endian)."""
    import hashlib

    dlm = _dlm(case["checkpoint"], case["dtype"])
    x = torch.tensor([row + [dlm.specials.mask] * case["settings"]["max_new_tokens"] for row in case["input_ids"]])
    raw = dlm.raw_logits(x).contiguous()
    raw = raw.view(torch.int16) if raw.dtype == torch.bfloat16 else raw
    return hashlib.sha256(raw.numpy().astype(raw.numpy().dtype.newbyteorder("<")).tobytes()).hexdigest()


def gemm_fingerprint() -> str:
    """SHA-256 of plain ``F.linear`` products and attentions (no codila code) of the golden checkpoints'
    shapes (fused q/k/v with bias, o, gate/up, down, head; grouped-query attention) at every canvas
    length the cases use, on fixed inputs drawn exactly (integers from torch's Mersenne twister, then
    one correctly rounded division). It depends only on how this machine's fp32 GEMM and attention
    round, so it tells the tests whether this is the arithmetic the goldens were made with
    (tests/test_parity.py records its value there)."""
    import hashlib

    import torch.nn.functional as F

    lengths: dict[str, set[int]] = {}
    for c in DREAM + FAST:
        for row in c["input_ids"]:
            lengths.setdefault(c["checkpoint"], set()).add(len(row) + c["settings"]["max_new_tokens"])
    g, h = torch.Generator().manual_seed(0), hashlib.sha256()

    def draw(*shape: int, scale: int) -> torch.Tensor:
        return torch.randint(-999, 1000, shape, generator=g).float() / scale

    for checkpoint in sorted(lengths):
        cfg = json.loads((PARITY / "checkpoints" / checkpoint / "config.json").read_text())
        d, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        head_dim = d // heads
        for fan_in, fan_out, bias in [(d, d + 2 * kv_heads * head_dim, True), (d, d, False), (d, 2 * inter, False),
                                      (inter, d, False), (d, vocab, False)]:
            w, b = draw(fan_out, fan_in, scale=991), (draw(fan_out, scale=983) if bias else None)
            for m in sorted(lengths[checkpoint]):
                h.update(F.linear(draw(1, m, fan_in, scale=997), w, b).numpy().astype("<f4").tobytes())
        for m in sorted(lengths[checkpoint]):  # bidirectional grouped-query attention, as the forward's
            q, k, v = (draw(1, n, m, head_dim, scale=s) for n, s in ((heads, 997), (kv_heads, 991), (kv_heads, 983)))
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            h.update(out.numpy().astype("<f4").tobytes())
    return h.hexdigest()


def main() -> None:
    out: dict = {"_gemm": gemm_fingerprint() if DREAM else None,
                 "_sha": {c["id"]: first_forward_sha(c) for c in DREAM + FAST if c["first_forward_logits_sha256"]}}
    for case in DREAM:
        rows = range(len(case["input_ids"])) if case["attention_mask"] is not None else [0]
        out[case["id"]] = [run_dream(case, r) for r in rows]
    for case in FAST:
        out[case["id"]] = [run_fast_dllm(case)]
    for case in ENTROPY:
        out[case["id"]] = [run_dream(case)]
    for case in DREAMON + DREAMON_TOPK:
        out[case["id"]] = [run_dreamon(case)]
    out["_near_tie_before_divergence"] = TIES
    print(json.dumps(out))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
