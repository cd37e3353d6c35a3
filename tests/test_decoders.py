"""Decoder accounting on scripted stand-in models (exact) and on tiny random checkpoints."""

from __future__ import annotations

import pytest
import torch

from codila_cli.decoding.codila import decode_codila
from codila_cli.decoding.config import CodilaConfig, DreamConfig, SamplingConfig, ThresholdConfig
from codila_cli.decoding.dream import decode_dream
from codila_cli.decoding.metrics import MetricsRecorder, spearman
from codila_cli.decoding.threshold import decode_threshold

PROMPT = [2, 5, 6]


def _run(fn, *args, **kw):
    rec = MetricsRecorder()
    res = fn(*args, on_step=rec, **kw)
    return res, rec.events


@pytest.mark.parametrize("K", [1, 2, 3, 4, 8])
def test_tokens_per_step_commits_exactly_k(scripted, K):
    dlm = scripted([3 + (j % 10) for j in range(16)])
    res, events = _run(decode_dream, dlm, PROMPT, config=DreamConfig(max_new_tokens=16, tokens_per_step=K))
    sizes = [len(e.positions) for e in events]
    assert all(s == K for s in sizes[:-1]) and 0 < sizes[-1] <= K
    assert res.dlm_forwards == len(sizes) == -(-16 // K)
    assert res.canvas == dlm.target


def test_dream_steps_schedule_matches_upstream_float_schedule(scripted):
    # Dream's generation_utils.py: L=256, S=32 -> 7 first, then 8 per step, 9 at the last step
    dlm = scripted([3 + (j % 10) for j in range(256)])
    res, events = _run(decode_dream, dlm, PROMPT, config=DreamConfig(max_new_tokens=256, steps=32, early_stop=False))
    sizes = [len(e.positions) for e in events]
    assert sizes[0] == 7 and sizes[-1] == 9 and set(sizes[1:-1]) == {8}
    assert res.dlm_forwards == 32


def test_steps_equal_length_skips_the_empty_first_forward(scripted):
    # S = L reveals 0 tokens at the first step; the unchanged canvas reuses its logits
    dlm = scripted([3 + (j % 10) for j in range(16)])
    res, events = _run(decode_dream, dlm, PROMPT, config=DreamConfig(max_new_tokens=16, steps=16, early_stop=False))
    assert sum(len(e.positions) for e in events) == 16
    assert res.dlm_forwards == len(events)  # no forward was spent on a step that revealed nothing


def test_entropy_order_commits_confident_slots_first(scripted):
    conf = [0.3, 0.99, 0.5, 0.8]
    dlm = scripted([4, 5, 6, 7], conf)
    _, events = _run(decode_dream, dlm, PROMPT, config=DreamConfig(max_new_tokens=4, tokens_per_step=1))
    assert [e.positions[0] for e in events] == [1, 3, 2, 0]


def test_plain_dlm_projects_only_the_masked_span(scripted):
    # slots fill outside-in (confidence), so the span of masked slots shrinks from both ends
    conf = [0.99, 0.3, 0.4, 0.5, 0.98]
    dlm = scripted([4, 5, 6, 7, 8], conf)
    asked = []
    full = dlm.logits
    dlm.logits = lambda x, rows=None: asked.append(rows) or full(x, rows=rows)
    res, _ = _run(decode_dream, dlm, PROMPT, config=DreamConfig(max_new_tokens=5, tokens_per_step=1))
    P = len(PROMPT)  # the canvas starts after the prompt ids
    assert asked == [(P, P + 5), (P + 1, P + 5), (P + 1, P + 4), (P + 1, P + 3), (P + 1, P + 2)]
    assert res.canvas == dlm.target


def test_early_stop_fills_tail_and_saves_forwards(scripted):
    eos = 0
    target = [4, 5, eos, 7, 8, 9, 3, 3]
    conf = [0.95, 0.95, 0.99, 0.1, 0.1, 0.1, 0.1, 0.1]
    dlm = scripted(target, conf)
    res, events = _run(decode_dream, dlm, PROMPT, config=DreamConfig(max_new_tokens=8, tokens_per_step=1))
    assert res.stopped_early and res.dlm_forwards == 3
    assert events[-1].source == "fill" and res.canvas[3:] == [eos] * 5


def test_tokens_past_the_end_are_not_counted_as_generated(scripted):
    """The metrics' ``tokens`` are the slots decoding committed: the end-of-text fill after an early stop
    is not decoding work, so it counts neither in tokens nor in tokens per step."""
    eos = 0
    dlm = scripted([4, 5, eos, 7, 8, 9, 3, 3], [0.95, 0.95, 0.99, 0.1, 0.1, 0.1, 0.1, 0.1])
    rec = MetricsRecorder()
    res = decode_dream(dlm, PROMPT, config=DreamConfig(max_new_tokens=8, tokens_per_step=1), on_step=rec)
    m = rec.finish(wall_seconds=1.0, dlm_forwards=res.dlm_forwards, ar_forwards=0)
    assert m.tokens == 3 and m.tokens_per_step == 1.0 and len(res.canvas) == 8


def test_threshold_commits_at_least_one_and_all_confident(scripted):
    conf = [0.95, 0.2, 0.97, 0.3, 0.99, 0.99, 0.99, 0.99]
    dlm = scripted([4, 5, 6, 7, 8, 9, 10, 11], conf)
    res, events = _run(decode_threshold, dlm, PROMPT, config=ThresholdConfig(max_new_tokens=8, block_length=4))
    first = events[0]
    assert set(first.positions) == {0, 2} and first.block == (0, 4)
    assert all(len(e.positions) >= 1 for e in events)
    assert all(max(e.positions) < 4 for e in events[:3])  # block 0 finishes before block 1 starts
    assert res.canvas == dlm.target


class ArgmaxWriter:
    """Stand-in AR: writes the argmax of its soft input (forced slots kept)."""

    class _AR:
        forwards = 0

    def __init__(self):
        self.ar = self._AR()
        self.calls = []

    def write(self, pi, forced, *, context=None, text=None, generator=None):
        self.calls.append(list(forced))
        self.ar.forwards += len(forced)
        return torch.tensor([f if f is not None else int(pi[j].argmax()) for j, f in enumerate(forced)])


@pytest.mark.parametrize("B", [2, 4, 8])
def test_codila_static_commits_exactly_b_per_forward(scripted, B):
    dlm = scripted([3 + (j % 10) for j in range(32)], [0.5 + 0.01 * j for j in range(32)])
    writer = ArgmaxWriter()
    res, events = _run(decode_codila, dlm, PROMPT, writer=writer, config=CodilaConfig(max_new_tokens=32, block_size=B))
    assert [len(e.positions) for e in events] == [B] * (32 // B)
    assert res.dlm_forwards == 32 // B
    assert all(e.source == "ar" for e in events)


def test_codila_argmax_writer_equals_greedy_dlm(scripted):
    dlm = scripted([3 + (j * 7 % 11) for j in range(24)], [0.4 + 0.02 * (j % 5) for j in range(24)])
    res, _ = _run(decode_codila, dlm, PROMPT, writer=ArgmaxWriter(), config=CodilaConfig(max_new_tokens=24, block_size=4))
    dlm2 = scripted(dlm.target, dlm.conf)
    greedy, _ = _run(decode_dream, dlm2, PROMPT, config=DreamConfig(max_new_tokens=24, tokens_per_step=4))
    assert res.canvas == greedy.canvas == dlm.target


def test_codila_block_choice_stays_in_candidate_window(scripted):
    # the most certain slots sit at the end, outside a window of 2 blocks
    conf = [0.3] * 4 + [0.4] * 4 + [0.999] * 8
    dlm = scripted([4] * 16, conf)
    _, events = _run(decode_codila, dlm, PROMPT, writer=ArgmaxWriter(),
                     config=CodilaConfig(max_new_tokens=16, block_size=4, candidate_blocks=2))
    canvas = [1] * 16  # mask id of the scripted model
    for e in events:
        window = [b for b in range(0, 16, 4) if 1 in canvas[b : b + 4]][:2]
        assert e.block[0] in window
        canvas = list(e.canvas)
    assert [e.block[0] for e in events] == [4, 8, 12, 0]  # lowest entropy inside the window each time


def test_codila_dynamic_falls_back_to_single_dlm_step(scripted):
    dlm = scripted([4, 5, 6, 7, 8, 9, 10, 11], [0.3] * 8)  # high entropy everywhere
    _, events = _run(decode_codila, dlm, PROMPT, writer=ArgmaxWriter(),
                     config=CodilaConfig(max_new_tokens=8, block_size=4, tau=0.01))
    assert all(len(e.positions) == 1 and e.source == "dlm" for e in events)


def test_codila_dynamic_forces_committed_slots(scripted):
    conf = [0.2, 0.999, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]
    dlm = scripted([4, 5, 6, 7, 8, 9, 10, 11], conf)
    writer = ArgmaxWriter()
    tau = 1.5  # only the confident slot is admissible alone; others need the AR
    res, _events = _run(decode_codila, dlm, PROMPT, writer=writer, config=CodilaConfig(max_new_tokens=8, block_size=4, tau=tau))
    assert res.canvas == dlm.target
    forced_calls = [c for c in writer.calls if any(f is not None for f in c)]
    for call in forced_calls:
        assert all(f is None or f in dlm.target for f in call)


def test_dynamic_span_is_the_longest_prefix_under_tau_ties_to_the_lower_mean():
    """CoDiLA's dynamic choice, shared by gen and CoDiLA-on-DreamOn infill: the longest prefix of masked
    slots with mean entropy <= tau; ties go to the lower mean, then the first block; k = 1 is no span."""
    from codila_cli.decoding.codila import dynamic_span

    H = torch.tensor([0.1, 0.1, 5.0, 0.1, 0.2, 0.2, 0.0, 9.0, 0.3, 0.3, 0.3, 0.3])
    cfg = CodilaConfig(tau=0.5)
    blocks = [(0, [0, 1, 2, 3]), (4, [4, 5, 6, 7]), (8, [8, 9, 10, 11])]
    assert dynamic_span(H, blocks, cfg) == (8, 12)  # k = 4 beats k = 3 ([4, 5, 6]) and k = 2 ([0, 1])
    assert dynamic_span(H, blocks[:2], cfg) == (4, 7)
    assert dynamic_span(H, [(4, [4, 5]), (0, [0, 1])], cfg) == (0, 2)  # k = 2 each: the lower mean (0.1 < 0.2)
    assert dynamic_span(torch.full((4,), 0.1), [(0, [0, 1]), (2, [2, 3])], cfg) == (0, 2)  # equal: the first
    assert dynamic_span(H, [(4, [4, 6])], cfg) == (4, 7)  # the span runs to its last slot (5 is committed)
    assert dynamic_span(H, [(0, [0, 2]), (4, [7])], cfg) is None  # k = 1 at most: the DLM's own step
    assert dynamic_span(H, [(0, torch.tensor([2, 3])), (4, [])], cfg) is None


def test_codila_parallel_blocks_two_blocks_per_forward(scripted):
    dlm = scripted([3 + (j % 10) for j in range(16)])
    res, events = _run(decode_codila, dlm, PROMPT, writer=ArgmaxWriter(),
                       config=CodilaConfig(max_new_tokens=16, block_size=4, parallel_blocks=2))
    assert res.dlm_forwards == 2 and sum(len(e.positions) for e in events) == 16


def test_spearman_left_to_right_is_one():
    assert spearman([0, 1, 2, 3], [0, 1, 2, 3]) == pytest.approx(1.0)
    assert spearman([0, 1, 2, 3], [3, 2, 1, 0]) == pytest.approx(-1.0)
    assert spearman([0, 1], [0, 0]) is None


# --- the real AR path on tiny random checkpoints -------------------------------------------------

def test_kv_cached_ar_equals_uncached_reference(tiny_models):
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    ar = tiny_models.ar
    writer = SoftBlockWriter(ar, tiny_models.bridge)
    torch.manual_seed(0)
    pi = torch.softmax(torch.randn(5, tiny_models.dlm.vocab_rows) * 3, -1)
    forced = [None, None, 17, None, None]
    cached = writer.write(pi, forced)
    # reference: recompute the whole sequence at every token, no cache
    emb = ar.embedding
    q = writer.condition(pi, forced)
    open_e, close_e = ar.wrapper_embeddings()
    seq = torch.cat([open_e, q.to(writer.table.dtype) @ writer.table, close_e])
    out = []
    for j, f in enumerate(forced):
        with torch.inference_mode():
            z = ar.model(inputs_embeds=seq.unsqueeze(0), use_cache=False).logits[0, -1].float()
        tok = f if f is not None else int(z.masked_fill(~writer.allowed, float("-inf")).argmax())
        out.append(tok)
        seq = torch.cat([seq, emb[tok].unsqueeze(0)])
    assert cached.tolist() == out
    assert cached[2] == 17


def test_repetition_penalty_follows_ctrl_rule(tiny_models):
    """ρ divides a positive logit (multiplies a negative one) of every id already in the text, including
    ids the block itself wrote; ρ = 1 leaves the greedy choice unchanged."""
    from codila_cli.decoding.rules import RepetitionPenalty, Text
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    torch.manual_seed(1)
    pi = torch.softmax(torch.randn(3, tiny_models.dlm.vocab_rows) * 3, -1)
    plain = SoftBlockWriter(tiny_models.ar, tiny_models.bridge).write(pi, [None] * 3)
    seen = torch.tensor([int(plain[0])])
    rows = tiny_models.ar.vocab_rows
    assert SoftBlockWriter(tiny_models.ar, tiny_models.bridge, rules=[RepetitionPenalty(1.0, rows)]).write(
        pi, [None] * 3, text=Text(seen.tolist())).tolist() == plain.tolist()
    strong = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, rules=[RepetitionPenalty(10.0, rows)])
    out = strong.write(pi, [None] * 3, text=Text(seen.tolist()))
    assert int(out[0]) != int(plain[0])  # the seen id lost its place
    # reference for the first choice: the CTRL rule on the uncached logits
    emb = tiny_models.ar.embedding
    q = strong.condition(pi, [None] * 3)
    open_e, close_e = tiny_models.ar.wrapper_embeddings()
    seq = torch.cat([open_e, q.to(strong.table.dtype) @ strong.table, close_e])
    with torch.inference_mode():
        z = tiny_models.ar.model(inputs_embeds=seq.unsqueeze(0), use_cache=False).logits[0, -1].float()
    z = z.clone()
    v = int(seen[0])
    z[v] = z[v] / 10.0 if z[v] > 0 else z[v] * 10.0
    assert int(out[0]) == int(z.masked_fill(~strong.allowed, float("-inf")).argmax())
    # an id written in the block is penalised for the rest of the block (reference: uncached, teacher-forced)
    seq2 = torch.cat([seq, emb[int(out[0])].unsqueeze(0)])
    with torch.inference_mode():
        z1 = tiny_models.ar.model(inputs_embeds=seq2.unsqueeze(0), use_cache=False).logits[0, -1].float()
    z1 = z1.clone()
    for tok in {int(seen[0]), int(out[0])}:
        z1[tok] = z1[tok] / 10.0 if z1[tok] > 0 else z1[tok] * 10.0
    assert int(out[1]) == int(z1.masked_fill(~strong.allowed, float("-inf")).argmax())


@pytest.mark.parametrize("rho", [1.0, 1.3, 1e6])
def test_choose_top_candidates_equal_the_full_vocabulary(tiny_models, rho, monkeypatch):
    """The helper's greedy choice from its top few logits equals the choice over the whole vocabulary,
    with the penalty on ids in the text and on earlier guesses, banned ids, ties, and rows where the
    top few all lose (a huge ρ pushes the penalised top ids below the rest: a wider top or the full path
    decides)."""
    from codila_cli.decoding import soft_ar
    from codila_cli.decoding.rules import RepetitionPenalty
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    monkeypatch.setattr(soft_ar, "_WIDER", (soft_ar._TOP, 32))  # below the tiny vocabulary, so the full path runs
    w = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, rules=[RepetitionPenalty(rho, tiny_models.ar.vocab_rows)])
    V = len(w.allowed)
    g = torch.Generator().manual_seed(3)
    full_calls = 0
    real_full = w._choose_full

    def counted(*a):
        nonlocal full_calls
        full_calls += 1
        return real_full(*a)

    w._choose_full = counted
    wider = 0
    real_top = w._choose_top

    def top_counted(row, n, *a):
        nonlocal wider
        wider += n > soft_ar._TOP
        return real_top(row, n, *a)

    w._choose_top = top_counted
    for trial in range(60):
        z = torch.randn(4, V, generator=g) * 4
        z[:, int(w.banned[0])] = 50.0  # a banned id on top of every row
        if trial % 3 == 0:
            z[1, 40] = z[1, 41] = z[1].max() + 1  # a tie: the lower id wins
        top = z.topk(soft_ar._TOP, dim=-1).indices
        hit = set(top[0, : trial % soft_ar._TOP].tolist())  # some of row 0's top ids are already in the text
        hit |= set(torch.randint(0, V, (20,), generator=g).tolist())
        fed = [int(top[r + 1, 0]) for r in range(3)]  # guess r feeds row r + 1: its own top id, penalised there
        if trial % 10 == 9:  # nearly every id already in the text: even the widest short path must give up
            hit |= set(range(V - 3))
        states = [((frozenset(hit), tuple(fed[:r])),) for r in range(4)]  # row r also sees guesses 0 … r − 1
        assert w._choose(z.clone(), None, states) == real_full(z.clone(), None, states)
    # the short path serves most calls; the wider ones and the fallback where the top ids are all penalised
    assert V > max(soft_ar._WIDER), "the widest short path must not cover the whole vocabulary here"
    assert (wider + full_calls < 20) if rho < 10 else (wider >= 5 and full_calls >= 3)


def test_codila_passes_the_text_before_the_block_as_seen(tiny_models):
    from codila_cli.decoding.codila import decode_codila
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.decoding.rules import RepetitionPenalty
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    writer = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, rules=[RepetitionPenalty(1.3, tiny_models.ar.vocab_rows)])
    calls = []
    orig = writer.write

    def spy(pi, forced, *, context=None, text=None, generator=None):
        calls.append(torch.tensor(text.seen))
        return orig(pi, forced, context=context, text=text, generator=generator)

    writer.write = spy
    prompt = [tiny_models.dlm.specials.bos, 7, 8, 9]
    res = decode_codila(tiny_models.dlm, prompt, writer=writer,
                        config=CodilaConfig(max_new_tokens=8, block_size=4, candidate_blocks=1,
                                            ar_repetition_penalty=1.3, early_stop=False))
    assert calls[0].tolist() == prompt
    assert calls[1].tolist() == prompt + res.canvas[:4]


def test_topk1_conditioning_equals_hard_tokens(tiny_models):
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    pi = torch.softmax(torch.randn(4, tiny_models.dlm.vocab_rows) * 2, -1)
    top1 = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, topk=1)
    hard_tokens = [int(tiny_models.bridge.shared_ids[int(r.argmax())]) for r in tiny_models.bridge.restrict(pi)]
    q_top = top1.condition(pi, [None] * 4)
    q_hard = top1.condition(pi, hard_tokens)  # committed tokens are fed one-hot
    assert torch.equal(q_top, q_hard)
    assert top1.write(pi, [None] * 4).tolist() == SoftBlockWriter(tiny_models.ar, tiny_models.bridge).write(
        torch.nn.functional.one_hot(torch.tensor(hard_tokens), pi.shape[1]).float(), [None] * 4).tolist()


@pytest.mark.parametrize("tau", [None, 0.5])
def test_same_seed_same_output_with_sampling(tiny_models, tau):
    from codila_cli.engine.generate import generate

    cfg = CodilaConfig(max_new_tokens=16, block_size=4, tau=tau, ar_temperature=1.0,
                       sampling=SamplingConfig(temperature=1.0))
    a = generate(tiny_models, "def f(x):", decoder="codila", config=cfg, seed=123)
    b = generate(tiny_models, "def f(x):", decoder="codila", config=cfg, seed=123)
    assert a.text == b.text and a.metrics["tokens"] == b.metrics["tokens"]


def test_codila_static_on_tiny_models_reports_b_and_spearman(tiny_models):
    from codila_cli.engine.generate import generate

    r = generate(tiny_models, "def f(", decoder="codila",
                 config=CodilaConfig(max_new_tokens=16, block_size=4, early_stop=False), seed=0)
    assert r.metrics["tokens_per_step"] == 4.0 and r.metrics["dlm_forwards"] == 4
    assert r.metrics["ar_forwards"] == 16 and r.metrics["order_spearman"] is not None


def test_codila_verify_mode_commits_block_size_per_forward(tiny_models):
    from codila_cli.engine.generate import generate

    r = generate(tiny_models, "def f(", decoder="codila",
                 config=CodilaConfig(max_new_tokens=16, block_size=4, ar_verify=True, early_stop=False), seed=0)
    assert r.metrics["tokens_per_step"] == 4.0 and r.metrics["ar_forwards"] == 4


def test_config_validation():
    with pytest.raises(ValueError):
        DreamConfig(steps=4, tokens_per_step=2)
    with pytest.raises(ValueError):
        DreamConfig(tokens_per_step=0)
    with pytest.raises(ValueError):
        CodilaConfig(conditioning="topk:0")
    with pytest.raises(ValueError):
        SamplingConfig(top_p=1.5)
    with pytest.raises(ValueError):
        ThresholdConfig(threshold=0)


# --- approximate KV caches ------------------------------------------------------------------------

def test_row_restricted_logits_equal_the_full_forward_rows(tiny_models):
    """logits(rows=(a, b)) projects only the rows it needs; the shift is the same as the full forward's."""
    dlm = tiny_models.dlm
    x = torch.randint(10, 300, (1, 30))
    full = dlm.logits(x)
    for a, b in ((0, 30), (0, 1), (1, 5), (12, 30), (29, 30)):
        assert torch.allclose(dlm.logits(x, rows=(a, b)), full[:, a:b], atol=1e-6)
    keep = torch.ones(2, 30, dtype=torch.long)
    keep[1, :4] = 0
    both = torch.cat([x, x])
    assert torch.allclose(dlm.logits(both, attention_mask=keep, rows=(10, 20)),
                          dlm.logits(both, attention_mask=keep)[:, 10:20], atol=1e-6)
    pair = torch.rand(30, 30) < 0.5
    pair |= torch.eye(30, dtype=torch.bool)
    pos = torch.arange(30)[None]
    assert torch.allclose(dlm.logits(x, pair_mask=pair, position_ids=pos, rows=(3, 17)),
                          dlm.logits(x, pair_mask=pair, position_ids=pos)[:, 3:17], atol=1e-6)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_first_forward_after_refresh_equals_uncached(tiny_models, mode):
    from codila_cli.models.dream import BlockCache

    dlm = tiny_models.dlm
    x = torch.randint(10, 300, (1, 48))
    full = dlm.logits(x)
    cache = BlockCache(dlm, mode)
    assert torch.equal(cache.refresh(x, 0, 48), full)
    assert torch.equal(cache.refresh(x, 16, 24), full[:, 16:24])
    # nothing changed since the refresh, so the cached K/V are exact: the sliced forward matches too
    for start, end in ((0, 8), (16, 24), (40, 48)):
        assert torch.allclose(cache.logits(x, start, end), full[:, start:end], atol=1e-5)
    # the K/V outside a slice are gathered once per refresh and slice: a change outside the slice is not
    # seen until the next refresh, which must drop the gathered K/V
    y = x.clone()
    y[0, :8] = torch.randint(10, 300, (8,))
    first = cache.logits(x, 16, 24)
    assert torch.equal(cache.logits(y, 16, 24), first)
    cache.refresh(y, 16, 24)
    assert torch.allclose(cache.logits(y, 16, 24), dlm.logits(y)[:, 16:24], atol=1e-5)
    assert not torch.allclose(cache.logits(y, 16, 24), first, atol=1e-5)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cache_projects_only_the_rows_asked_for(tiny_models, mode):
    """``rows`` narrows the vocabulary projection, not the recomputed block: the rows' logits are the
    same as the whole block's, sliced; rows outside the block are refused."""
    from codila_cli.models.dream import BlockCache

    dlm = tiny_models.dlm
    x = torch.randint(10, 300, (1, 48))
    cache = BlockCache(dlm, mode)
    whole = cache.refresh(x, 16, 32)
    assert torch.equal(cache.refresh(x, 16, 32, rows=(20, 24)), whole[:, 4:8])
    block = cache.logits(x, 16, 32)
    assert torch.allclose(cache.logits(x, 16, 32, rows=(20, 24)), block[:, 4:8], atol=1e-6)
    with pytest.raises(ValueError, match="inside the block"):
        cache.logits(x, 16, 32, rows=(12, 20))


def test_static_codila_with_cache_projects_one_block(tiny_models, monkeypatch):
    """W = 1 with a 3-block dual window: every DLM forward projects the 4 rows of the block being
    written, never the whole window; the text is what projecting the whole window gives."""
    from codila_cli.engine.generate import generate
    from codila_cli.models import dream

    cfg = CodilaConfig(max_new_tokens=24, block_size=4, candidate_blocks=1, early_stop=False, cache="dual",
                       cache_blocks=3)
    widths = []
    for name in ("refresh", "logits"):
        real = getattr(dream.BlockCache, name)

        def spy(self, x, a, b, *, rows=None, real=real):
            widths.append(rows[1] - rows[0] if rows else b - a)
            return real(self, x, a, b, rows=rows)
        monkeypatch.setattr(dream.BlockCache, name, spy)
    narrow = generate(tiny_models, "def f(", decoder="codila", config=cfg, seed=0)
    assert widths == [4] * 6
    monkeypatch.undo()
    for name in ("refresh", "logits"):  # the whole window projected, its candidate rows read
        real = getattr(dream.BlockCache, name)

        def whole(self, x, a, b, *, rows=None, real=real):
            return real(self, x, a, b)[:, rows[0] - a : rows[1] - a]
        monkeypatch.setattr(dream.BlockCache, name, whole)
    wide = generate(tiny_models, "def f(", decoder="codila", config=cfg, seed=0)
    assert narrow.text == wide.text and narrow.metrics["dlm_forwards"] == wide.metrics["dlm_forwards"] == 6


@pytest.mark.parametrize("decoder,cfg", [
    ("threshold", ThresholdConfig(max_new_tokens=24, block_length=8, threshold=0.3, early_stop=False)),
    ("codila", CodilaConfig(max_new_tokens=24, block_size=4, early_stop=False)),
    ("codila", CodilaConfig(max_new_tokens=24, block_size=4, tau=3.0, early_stop=False)),
])
@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_decoders_run_and_count(tiny_models, decoder, cfg, mode):
    from dataclasses import replace

    from codila_cli.engine.generate import generate

    base = generate(tiny_models, "def f(", decoder=decoder, config=cfg, seed=0)
    cached = generate(tiny_models, "def f(", decoder=decoder, config=replace(cfg, cache=mode), seed=0)
    assert cached.metrics["tokens"] == base.metrics["tokens"] == 24
    if decoder == "codila" and cfg.tau is None:
        assert cached.metrics["tokens_per_step"] == 4.0


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_codila_cache_refreshes_once_per_window(tiny_models, mode, monkeypatch):
    """Static CoDiLA with a cache: the window of W blocks stays put until full, so a 24-slot canvas with
    B = 4, W = 2 costs 24 / 8 = 3 full forwards and 3 window forwards (one per remaining block)."""
    from codila_cli.engine.generate import generate
    from codila_cli.models.dream import BlockCache

    refreshes = []
    real = BlockCache.refresh
    monkeypatch.setattr(BlockCache, "refresh", lambda self, x, a, b, **kw: refreshes.append((a, b)) or real(self, x, a, b, **kw))
    cfg = CodilaConfig(max_new_tokens=24, block_size=4, candidate_blocks=2, early_stop=False, cache=mode)
    r = generate(tiny_models, "def f(", decoder="codila", config=cfg, seed=0)
    assert r.metrics["tokens"] == 24 and r.metrics["dlm_forwards"] == 6
    assert [b - a for a, b in refreshes] == [8, 8, 8]
    assert [a for a, _ in refreshes] == sorted(a for a, _ in refreshes)


def test_cache_flag_rejected_for_dream(tiny):
    from typer.testing import CliRunner

    from codila_cli.cli import app

    r = CliRunner().invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "--cache", "dual", "def f("])
    assert r.exit_code == 2 and "block decoder" in r.stderr


def test_a_dlm_that_ranks_mask_first_still_finishes(tiny_models, monkeypatch):
    """A small DLM can rank <mask> first; committing it would leave the slot masked forever (a hang in
    threshold decoding, found on a held-out prompt). The denoiser never lets a decoder pick it."""
    from codila_cli.decoding.config import ThresholdConfig
    from codila_cli.decoding.threshold import decode_threshold

    dlm = tiny_models.dlm
    mask = dlm.specials.mask
    real = type(dlm).raw_logits

    def favour_mask(self, x, **kw):
        out = real(self, x, **kw).clone()
        out[..., mask] += 1e4
        return out

    monkeypatch.setattr(type(dlm), "raw_logits", favour_mask)
    z = dlm.logits(torch.tensor([[dlm.specials.bos, 7, mask, mask]]))
    assert bool((torch.softmax(z, -1)[..., mask] == 0).all()) and bool(torch.isfinite(z).all())
    res = decode_threshold(dlm, [dlm.specials.bos, 7, 8], config=ThresholdConfig(max_new_tokens=8, block_length=4))
    assert mask not in res.canvas and len(res.canvas) == 8


def test_committing_the_mask_token_fails_loudly(scripted):
    from codila_cli.decoding.config import DreamConfig
    from codila_cli.decoding.dream import decode_dream

    dlm = scripted([5, 1, 6, 7], [0.9] * 4)  # slot 1 "predicts" the mask id (1)
    with pytest.raises(RuntimeError, match="mask token"):
        decode_dream(dlm, [2, 3, 4], config=DreamConfig(max_new_tokens=4, tokens_per_step=4))


def test_ar_context_keeps_its_start_for_half_a_window():
    """The AR's left context is anchored: it starts on a multiple of n/2 (back to the nearest hole) and
    holds between n/2 + 1 and n tokens, so consecutive blocks share its beginning."""
    from codila_cli.decoding.base import Canvas
    from codila_cli.decoding.codila import _context

    x = torch.arange(100, 200).unsqueeze(0)  # prompt 40 tokens + canvas 60, nothing masked
    c = Canvas(x=x, prompt_len=40, mask_id=1, stop_ids=(0,), fill_id=0, on_step=lambda e: None, dlm=None)
    seen_starts = set()
    for start in range(0, 60, 4):
        ctx = _context(c, start, 16)
        end = 40 + start
        assert 9 <= len(ctx) <= 16 and ctx == x[0, end - len(ctx) : end].tolist()
        assert (end - len(ctx)) % 8 == 0
        seen_starts.add(end - len(ctx))
    assert len(seen_starts) < 15  # the start repeats across blocks
    assert _context(c, 0, 0) == []
    x[0, 50] = 1  # a hole: the context stops right after it
    assert _context(c, 16, 16) == x[0, 51:56].tolist()


def test_ar_context_kv_reuse_is_exact(tiny_models):
    """A block whose context extends the previous block's context computes only the new ids and
    writes what a fresh writer (no reuse) writes, with the same logits."""
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    torch.manual_seed(3)
    pi = torch.softmax(torch.randn(4, tiny_models.dlm.vocab_rows) * 3, -1)
    ctx = torch.randint(10, 300, (20,)).tolist()
    reuse = SoftBlockWriter(tiny_models.ar, tiny_models.bridge)
    reuse.write(pi, [None] * 4, context=ctx[:12])
    assert reuse.context_tokens_computed == 12
    logged = []
    orig = tiny_models.ar.forward

    def spy(**kw):
        logits, cache = orig(**kw)
        logged.append(logits.clone())
        return logits, cache

    tiny_models.ar.forward = spy
    try:
        out = reuse.write(pi, [None, 17, None, None], context=ctx)
        first = logged[:]
        logged.clear()
        fresh = SoftBlockWriter(tiny_models.ar, tiny_models.bridge).write(pi, [None, 17, None, None], context=ctx)
    finally:
        tiny_models.ar.forward = orig
    assert reuse.context_tokens_computed == 20  # 12, then only the 8 new ids
    assert out.tolist() == fresh.tolist() and int(out[1]) == 17
    for a, b in zip(first, logged):
        assert torch.allclose(a, b, atol=1e-4)
    reuse.write(pi, [None] * 4, context=ctx[5:])  # not an extension: computed from scratch
    assert reuse.context_tokens_computed == 35


def test_codila_cache_blocks_sets_the_window(tiny_models, monkeypatch):
    """W = 1 with a cache of 3 blocks: one full forward per 12 slots, a window forward for the rest."""
    from codila_cli.engine.generate import generate
    from codila_cli.models.dream import BlockCache

    refreshes = []
    real = BlockCache.refresh
    monkeypatch.setattr(BlockCache, "refresh", lambda self, x, a, b, **kw: refreshes.append((a, b)) or real(self, x, a, b, **kw))
    cfg = CodilaConfig(max_new_tokens=24, block_size=4, candidate_blocks=1, early_stop=False, cache="dual",
                       cache_blocks=3)
    r = generate(tiny_models, "def f(", decoder="codila", config=cfg, seed=0)
    assert r.metrics["tokens"] == 24 and r.metrics["dlm_forwards"] == 6 and r.metrics["tokens_per_step"] == 4.0
    assert [b - a for a, b in refreshes] == [12, 12]
    with pytest.raises(ValueError, match="cache-blocks"):
        CodilaConfig(cache_blocks=2)
    with pytest.raises(ValueError, match="cache-blocks"):
        CodilaConfig(cache="dual", cache_blocks=0)


@pytest.mark.parametrize("context", [None, list(range(40, 52))])
def test_ar_guesses_change_forwards_not_tokens(tiny_models, monkeypatch, context):
    """Greedy writing with guesses checked in the forward writes exactly what one-token-per-forward
    writing writes; right guesses save forwards, a wrong one costs one more forward from that slot."""
    from codila_cli.decoding.rules import RepetitionPenalty, Text
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    torch.manual_seed(5)
    pi = torch.softmax(torch.randn(5, tiny_models.dlm.vocab_rows) * 3, -1)
    forced = [None, None, 17, None, None]
    seen = torch.tensor([3, 9, 11])
    ar = tiny_models.ar

    def run(guesses):
        w = SoftBlockWriter(ar, tiny_models.bridge, rules=[RepetitionPenalty(1.5, ar.vocab_rows)], guess=guesses is not None)
        if guesses is not None:
            monkeypatch.setattr(w, "_guesses", lambda q, f: list(guesses))
        f0 = ar.forwards
        out = w.write(pi, forced, context=context, text=Text(seen.tolist())).tolist()
        return out, ar.forwards - f0

    ref, n = run(None)
    assert n == 5 and ref[2] == 17  # one forward per slot
    assert run(ref[:4]) == (ref, 1)  # every guess right: one forward for the block
    wrong = ref[:4]
    wrong[1] = (wrong[1] + 1) % 300 or 5
    assert run(wrong) == (ref, 2)  # slot 1 guessed wrong: a second forward from slot 1's true token on
    wrong[3] = (wrong[3] + 1) % 300 or 5
    assert run(wrong) == (ref, 3)


def test_writers_share_the_gathered_embedding_table(tiny_models):
    """E_AR[S] is gathered once per helper and bridge, not once per decode (a per-prompt cost)."""
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    a = SoftBlockWriter(tiny_models.ar, tiny_models.bridge)
    b = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, guess=False)
    assert a.table is b.table and a.index is b.index
    assert torch.equal(a.table, tiny_models.ar.embedding[tiny_models.bridge.shared_ids])


def test_ngram_table_names_the_ids_that_would_repeat_an_ngram():
    from codila_cli.decoding.rules import _NGrams

    g = _NGrams(3, [1, 2, 3, 1, 2])
    assert g.repeats(()) == {3}  # 1 2 3 is in the text: after 1 2, 3 would repeat it
    assert g.repeats((4, 1, 2)) == {3, 4}  # 1 2 4 came inside the tail
    assert g.repeats((9,)) == set() and _NGrams(3, [1]).repeats(()) == set()
    assert _NGrams(3, [0, 0, 0, 5, 0, 0], frozenset({0})).repeats(()) == {5}  # end-of-text is never banned
    assert g.repeats((7,)) == set() and g.repeats((7, 1, 2)) == {3, 7}  # 1 2 7 is in the text now


def test_no_repeat_ngram_keeps_every_ngram_of_the_completion_unique(tiny_models):
    """With n = 3 no 3-gram of ids occurs twice in what the helper wrote, where the same decode without the
    ban repeats one (the tiny random helper loops); end-of-text padding is exempt, and the greedy short
    path with the ban still equals the full-vocabulary path."""
    from codila_cli.decoding.codila import decode_codila
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.decoding.rules import NoRepeatNGram, RepetitionPenalty
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    m = tiny_models
    stops = set(m.dlm.specials.stop_ids)

    def run(n):
        w = SoftBlockWriter(m.ar, m.bridge, rules=[NoRepeatNGram(n, frozenset(stops))] if n else [])
        cfg = CodilaConfig(max_new_tokens=48, block_size=4, candidate_blocks=1, early_stop=False, ar_no_repeat_ngram=n)
        return decode_codila(m.dlm, [m.dlm.specials.bos, 7, 8, 9], writer=w, config=cfg).canvas

    def grams(ids, n=3):
        text = [t for t in ids if t not in stops]
        return [tuple(text[i : i + n]) for i in range(len(text) - n + 1)]

    plain, banned = run(0), run(3)
    assert len(set(grams(plain))) < len(grams(plain))  # the unconstrained helper repeats itself
    assert len(set(grams(banned))) == len(grams(banned)) and len(grams(banned)) > 10
    class FixedBan:  # a rule added without touching the writer: bans the ids its state names
        lazy = False

        def lower(self, st, cols, vals):
            return vals.masked_fill(torch.tensor([c in st for c in cols]), float("-inf"))

        def lower_row(self, st, z):
            z[sorted(st)] = float("-inf")

    w = SoftBlockWriter(m.ar, m.bridge, rules=[RepetitionPenalty(1.3, m.ar.vocab_rows), FixedBan()])
    V = len(w.allowed)
    g = torch.Generator().manual_seed(4)
    for _ in range(20):
        z = torch.randn(3, V, generator=g) * 4
        top = z.topk(4, dim=-1).indices
        repeats = [set(top[r, : r + 1].tolist()) for r in range(3)]  # each row's best ids would repeat
        fed = [int(top[1, 1]), int(top[2, 0])]
        states = [((frozenset({5, 6}), tuple(fed[:r])), frozenset(repeats[r])) for r in range(3)]
        assert w._choose(z.clone(), None, states) == w._choose_full(z.clone(), None, states)
        assert all(c not in repeats[r] for r, c in enumerate(w._choose(z.clone(), None, states)))


def test_no_repeat_ngram_is_validated():
    from codila_cli.decoding.config import CodilaConfig

    with pytest.raises(ValueError, match="no-repeat-ngram"):
        CodilaConfig(ar_no_repeat_ngram=1)
    assert CodilaConfig(ar_no_repeat_ngram=0).ar_no_repeat_ngram == 0


def test_fast_dllm_convention_refuses_a_block_length_that_does_not_divide_the_canvas():
    """Fast-dLLM's block loop asserts that the blocks tile the canvas, with a cache as without one; its
    convention in codila refuses such a length (exit 2 from the CLI), codila's own decodes it."""
    from codila_cli.decoding.config import ThresholdConfig

    for cache in ("none", "prefix", "dual"):
        with pytest.raises(ValueError, match="multiple of --block-length"):
            ThresholdConfig(max_new_tokens=30, block_length=8, cache=cache, convention="fast-dllm")
        assert ThresholdConfig(max_new_tokens=30, block_length=8, cache=cache).block_length == 8
