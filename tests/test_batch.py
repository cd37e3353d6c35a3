"""Batched decoding (decoding/batch.py, models/batched.py): a batch of N equals N single runs, with
per-row accounting; rows join and leave at any step; a failing or cancelled row touches no other."""

from __future__ import annotations

import pytest
import torch

from codila_cli.decoding.config import CodilaConfig, DreamConfig, SamplingConfig, ThresholdConfig

SAMPLED = SamplingConfig(temperature=1.0)
CASES = {
    "dream": DreamConfig(max_new_tokens=16, tokens_per_step=2, sampling=SAMPLED),
    "threshold": ThresholdConfig(max_new_tokens=16, block_length=8, threshold=0.5, sampling=SAMPLED),
    "codila": CodilaConfig(max_new_tokens=16, block_size=4, ar_temperature=1.0, sampling=SAMPLED),
    "codila-dynamic": CodilaConfig(max_new_tokens=16, block_size=4, tau=2.0, sampling=SAMPLED),
    # the bundled helper recommends a prefix cache: its refreshes and cached slices are stacked too
    "codila-prefix": CodilaConfig(max_new_tokens=16, block_size=4, candidate_blocks=1, cache="prefix",
                                  cache_blocks=2, ar_temperature=1.0, sampling=SAMPLED),
}


def _on_gpu(models):
    """``models`` as batching_pays would see them on a GPU (only the DLM's device is read)."""
    from types import SimpleNamespace

    return SimpleNamespace(dlm=SimpleNamespace(device=torch.device("cuda")))


@pytest.fixture
def lockstep(monkeypatch):
    """Batchers that wait for every row at each step (a long gather window), so the forward counts
    are exact: one shared forward per step, not a timing-dependent split."""
    from codila_cli.decoding import batch

    real = batch.StepBatcher.__init__
    monkeypatch.setattr(batch.StepBatcher, "__init__",
                        lambda self, on_step=None, gather_s=60.0: real(self, on_step=on_step, gather_s=gather_s))


@pytest.fixture(scope="module")
def native_models(tiny):
    """The tiny checkpoints on the native engine (models/native.py), as the bundled models run: every
    model call stacks there; on transformers only the plain DLM forwards do."""
    import os

    from codila_cli.engine.models import load_models

    old = os.environ.get("CODILA_ENGINE")
    os.environ["CODILA_ENGINE"] = "native"
    try:
        return load_models(dlm=str(tiny["dlm"]), ar=str(tiny["ar"]), device="cpu", dtype="float32")
    finally:
        os.environ.pop("CODILA_ENGINE") if old is None else os.environ.__setitem__("CODILA_ENGINE", old)


@pytest.mark.parametrize("engine", ["native", "transformers"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_of_n_equals_n_single_runs(tiny_models, native_models, case, engine, lockstep):
    from codila_cli.engine.generate import generate, generate_many
    from codila_cli.models.batched import supports

    models = native_models if engine == "native" else tiny_models
    assert supports(models.dlm.model) == (engine == "native")

    decoder = case.split("-")[0]
    cfg = CASES[case]
    # same token length: a stacked forward is then bit-identical to single forwards (rows of other lengths
    # are left-padded, equal up to float rounding: test_stacked_rows_match_their_own_forwards; the tiny
    # random models have near-ties everywhere, so rounding could flip a token there)
    prompts = ["def f(x):", "def f(x):", "def a(b):", "def f(n):"]
    assert len({len(models.dlm.tokenizer.encode(p, add_special_tokens=False)) for p in prompts}) == 1
    seeds = [11, 12, 13, 14]
    batch = generate_many(models, prompts, decoder=decoder, config=cfg, seeds=seeds)
    singles = [generate(models, p, decoder=decoder, config=cfg, seed=s) for p, s in zip(prompts, seeds)]
    for b, s in zip(batch.results, singles):
        assert b.text == s.text
        assert b.seed == s.seed
        for key in ("tokens", "dlm_forwards", "ar_forwards", "steps"):
            assert b.metrics[key] == s.metrics[key], key
    summary = batch.summary()
    assert batch.batched
    assert summary["row_dlm_forwards"] == sum(s.metrics["dlm_forwards"] for s in singles)
    if engine == "transformers" and cfg.__dict__.get("cache", "none") != "none":  # cached calls: per row there
        assert batch.batched_forwards == summary["row_dlm_forwards"]
        return
    # the hardware ran one forward per step of the longest row, not one per row and step, KV caches included
    assert batch.batched_forwards == max(s.metrics["dlm_forwards"] for s in singles)
    if decoder == "codila" and engine == "native":  # the helper's forwards are stacked too
        assert summary["row_ar_forwards"] == sum(s.metrics["ar_forwards"] for s in singles)
        assert summary["batched_ar_forwards"] < summary["row_ar_forwards"] or not summary["row_ar_forwards"]


def test_rows_one_after_another_equal_the_batch(tiny_models, lockstep):
    """batched=False decodes the rows in turn: the same texts and per-row counts as the batch, the
    hardware's forwards are the rows' sum, and on_step sees row 0 only."""
    from codila_cli.engine.generate import batching_pays, generate_many

    cfg = CASES["codila"]
    prompts, seeds = ["def f(x):", "def f(x):", "def g(y):"], [3, 4, 5]
    batch = generate_many(tiny_models, prompts, decoder="codila", config=cfg, seeds=seeds)
    events = []
    turn = generate_many(tiny_models, prompts, decoder="codila", config=cfg, seeds=seeds, batched=False,
                         on_step=events.append)
    assert [r.text for r in turn.results] == [r.text for r in batch.results]
    assert [r.metrics["dlm_forwards"] for r in turn.results] == [r.metrics["dlm_forwards"] for r in batch.results]
    assert turn.batched_forwards == sum(r.metrics["dlm_forwards"] for r in turn.results) > batch.batched_forwards
    assert turn.summary()["batched"] is False and batch.summary()["batched"] is True
    steps = [e.step for e in events]
    assert steps and steps == sorted(steps)  # one run's events: a second row would start again at step 0
    assert batching_pays(tiny_models) is False  # on a CPU a stacked forward costs what the rows' own do
    assert batching_pays(_on_gpu(tiny_models)) is True


def test_rows_that_finish_leave_the_batch(tiny_models, lockstep):
    """Rows of different canvas lengths: the batch shrinks as rows finish; counts stay per row."""
    from codila_cli.decoding.batch import run_batched
    from codila_cli.decoding.dream import decode_dream

    dlm = tiny_models.dlm
    prompt = dlm.tokenizer.encode("def f(x):", add_special_tokens=False)
    lengths = [4, 8, 12]

    def row(r, row_dlm, batcher, row_id):
        cfg = DreamConfig(max_new_tokens=lengths[r], tokens_per_step=1, early_stop=False)
        return decode_dream(row_dlm, prompt, config=cfg)

    results, batcher = run_batched(dlm, 3, row)
    assert [r.dlm_forwards for r in results] == lengths
    assert batcher.batched_forwards == 12
    assert batcher.rows_per_forward == [3] * 4 + [2] * 4 + [1] * 4
    # steps run in the rows' own threads: nothing is left running once the rows are done
    import threading

    assert not [t for t in threading.enumerate() if t.name.startswith("codila-")]


def test_stacked_rows_match_their_own_forwards(native_models):
    """models/batched.py: rows of other lengths, with and without cached K/V, bidirectional and causal,
    give each row's own logits and K/V (each row attends to its own unpadded keys; the stacked matrix
    products may round fp32's last bit otherwise than a lone row's)."""
    from codila_cli.models import batched
    from codila_cli.models.dream import shift_index

    dlm, ar = native_models.dlm, native_models.ar
    short, long = torch.tensor([[5, 6, 7]]), torch.tensor([[5, 9, 10, 11, 12, 6]])
    keep_s, keep_l = shift_index(1, 3), shift_index(0, 6)
    alone = [dlm.kv_call(short, positions=None, past=None, keep=keep_s, want_kv=True),
             dlm.kv_call(long, positions=None, past=None, keep=keep_l, want_kv=True)]
    calls = [batched.KVCall(short[0], torch.arange(3), None, keep_s, True),
             batched.KVCall(long[0], torch.arange(6), None, keep_l, True)]
    out = batched.run(dlm.model, calls, causal=False)
    for (a_logits, a_kv), (b_logits, b_kv) in zip(alone, out):
        assert torch.allclose(dlm.emittable(b_logits), a_logits, atol=1e-4)
        assert all(torch.allclose(x[0], y[0], atol=1e-5) for x, y in zip(a_kv, b_kv))
    # a cached slice: tokens 3… of the long row attend to the K/V of tokens 0–2
    past = [(k[:, :, :3], v[:, :, :3]) for k, v in alone[1][1]]
    pos = torch.arange(3, 6)
    direct = dlm.kv_call(long[:, 3:], positions=pos[None], past=past, keep=torch.arange(3))[0]
    stacked = batched.run(dlm.model, [batched.KVCall(long[0, 3:], pos, past, torch.arange(3)), calls[0]],
                          causal=False)[0][0]
    assert torch.allclose(dlm.emittable(stacked), direct, atol=1e-4)
    # the causal helper: embeddings with a context cache, next to a row without one
    emb = ar.embedding
    e1, e2 = emb[torch.tensor([3, 4, 5, 6])], emb[torch.tensor([7, 8])]
    _, cache = ar.forward(inputs_embeds=e1[:2][None], cache=None, keep=1)
    ctx = [(layer.keys, layer.values) for layer in cache.layers]  # before the next forward extends the cache
    want1, _ = ar.forward(inputs_embeds=e1[2:][None], cache=cache, keep=2)
    want2, _ = ar.forward(inputs_embeds=e2[None], cache=None, keep=1)
    got = batched.run(ar.model, [batched.KVCall(e1[2:], torch.arange(2, 4), ctx, torch.arange(0, 2)),
                                 batched.KVCall(e2, torch.arange(2), None, torch.arange(1, 2))], causal=True)
    assert torch.allclose(got[0][0].float(), want1, atol=1e-4)
    assert torch.allclose(got[1][0].float(), want2, atol=1e-4)


def _bf16_gemm_depends_on_the_batch(model) -> str | None:
    """Why rows cannot be batch-invariant on this CPU (None where they can): the stacked matrix products
    (every linear layer of the model, on 4 rows of 40 tokens) give a row other bits than the row alone.
    That is the kernel's rounding by batch size, outside codila; the AVX2 build machine has none."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    for name, w in model.named_parameters():
        if w.dim() == 2 and "embed" not in name:
            rows = (torch.randn((4, 40, w.shape[1]), generator=g) / 4).to(torch.bfloat16)
            if not torch.equal(F.linear(rows, w)[0], F.linear(rows[:1], w)[0]):
                return f"this CPU's bf16 matrix product rounds a row by the batch's size ({name}): not codila's"
    return None


def test_a_batched_row_decodes_as_it_does_alone_in_bf16():
    """The bundled DLM in bf16 (what --dtype auto runs on an AMX CPU and every GPU): four prompts of other
    lengths decoded together give, row by row, the text each gives alone, greedy and seeded (dream and
    threshold). Before rows attended to their own unpadded keys, the padded, masked attention rounded
    otherwise in bf16: greedy row 0 and seeded rows 2 and 3 differed (seen on the build machine, bf16
    forced on its AVX2 CPU)."""
    from codila_cli.decoding.config import DreamConfig, SamplingConfig, ThresholdConfig
    from codila_cli.engine.generate import generate, generate_many
    from codila_cli.engine.models import load_models

    models = load_models(dlm="bundled-dlm", ar=None, device="cpu", dtype="bfloat16")
    if (why := _bf16_gemm_depends_on_the_batch(models.dlm.model)) is not None:
        pytest.skip(why)
    prompts = ["def fib(n):", "def is_prime(n):\n", "def parse(line):", "class Stack:\n"]
    hot = SamplingConfig(temperature=0.8)
    for decoder, cfg, seeds in (("dream", DreamConfig(max_new_tokens=32, tokens_per_step=2), [0] * 4),
                                # seeded sampling too (issue 54: rows 3 and 4 differed before)
                                ("dream", DreamConfig(max_new_tokens=32, tokens_per_step=2, sampling=hot), [3, 4, 5, 6]),
                                ("threshold", ThresholdConfig(max_new_tokens=32, block_length=8, sampling=hot), [3, 4, 5, 6])):
        alone = [generate(models, p, decoder=decoder, config=cfg, seed=s).completion for p, s in zip(prompts, seeds)]
        together = generate_many(models, prompts, decoder=decoder, config=cfg, seeds=seeds, batched=True)
        assert together.batched and [r.completion for r in together.results] == alone, (decoder, cfg)


def test_seeded_codila_rows_decode_as_alone_in_bf16():
    """Issue 54 item 4 for the server's default decoder: CoDiLA (the bundled helper's setting: a prefix
    cache, top-k conditioning, the helper's choice rules) sampling at temperature 0.8, four seeded prompts
    of other lengths in bf16 give, row by row, the text each gives alone (its DLM and helper forwards
    stacked with the other rows')."""
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.engine.generate import generate, generate_many
    from codila_cli.engine.models import load_models

    models = load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", dtype="bfloat16")
    for model in (models.dlm.model, models.ar.model):
        if (why := _bf16_gemm_depends_on_the_batch(model)) is not None:
            pytest.skip(why)
    hot = SamplingConfig(temperature=0.8)
    cfg = CodilaConfig(max_new_tokens=32, block_size=4, conditioning="topk:16", cache="prefix", cache_blocks=8,
                       ar_context=64, ar_repetition_penalty=1.5, ar_syntax_guard=True, ar_no_repeat_ngram=8,
                       ar_temperature=0.8, sampling=hot)
    prompts = ["def fib(n):", "def is_prime(n):\n", "def parse(line):", "class Stack:\n"]
    seeds = [3, 4, 5, 6]
    alone = [generate(models, p, decoder="codila", config=cfg, seed=s).completion for p, s in zip(prompts, seeds)]
    together = generate_many(models, prompts, decoder="codila", config=cfg, seeds=seeds, batched=True)
    assert together.batched and [r.completion for r in together.results] == alone
    assert together.ar_forwards < sum(r.metrics["ar_forwards"] for r in together.results)  # the helper's stacked


def test_rows_of_other_lengths_are_not_padded_together_in_bf16_on_the_transformers_engine(tiny, lockstep):
    """The engine the 7B checkpoints run on (transformers) stacks plain DLM forwards by padding; in bf16 the
    padded, masked attention rounds a row otherwise, so there only rows of one length share a forward (as
    they are alone), and four prompts of other lengths give, row by row, their lone texts; rows of one
    length still share one. In fp32 every row shares the padded forward (tests above)."""
    from codila_cli.engine.generate import _prepare, generate, generate_many
    from codila_cli.engine.models import load_models
    from codila_cli.models.batched import supports

    models = load_models(dlm=str(tiny["dlm"]), ar=None, device="cpu", dtype="bfloat16")
    assert not supports(models.dlm.model)
    if (why := _bf16_gemm_depends_on_the_batch(models.dlm.model)) is not None:
        pytest.skip(why)
    prompts = ["def f(x):", "def is_prime(n):\n    return", "class Stack:\n", "x = [1, 2, 3]\nfor"]
    cfg = DreamConfig(max_new_tokens=16, tokens_per_step=2, early_stop=False)
    alone = [generate(models, p, decoder="dream", config=cfg, seed=0).completion for p in prompts]
    together = generate_many(models, prompts, decoder="dream", config=cfg, seeds=[0] * 4, batched=True)
    assert [r.completion for r in together.results] == alone
    lengths = {len(_prepare(models, p, cfg, None)[0]) for p in prompts}
    assert 1 < len(lengths) < 4 and together.batched_forwards == 8 * len(lengths)  # a forward per length and step
    same = generate_many(models, ["def f(x):"] * 2, decoder="dream", config=cfg, seeds=[0, 0], batched=True)
    assert same.batched_forwards == 8  # one length: one forward per step for both rows


def test_an_error_in_one_row_is_raised_and_nothing_hangs(tiny_models):
    from codila_cli.decoding.batch import run_batched

    dlm = tiny_models.dlm

    def row(r, row_dlm, batcher, row_id):
        if r == 1:
            raise ValueError("row 1 broke")
        x = torch.tensor([[5, 6, 7]])
        for _ in range(3):
            row_dlm.logits(x)
        return r

    with pytest.raises(ValueError, match="row 1 broke"):
        run_batched(dlm, 3, row)


def test_a_failing_stacked_forward_is_rerun_row_by_row(native_models, lockstep, monkeypatch):
    """A stacked forward that raises (a row whose call breaks the stack) is rerun as each row's own
    forward: every row gets the result it gets alone, and the one row whose own call fails fails alone."""
    from codila_cli.decoding.batch import run_batched
    from codila_cli.models import batched

    calls = []

    def broken(model, rows, *, causal):
        calls.append(len(rows))
        raise RuntimeError("stacking failed")

    monkeypatch.setattr(batched, "run", broken)
    dlm = native_models.dlm
    x = [torch.tensor([[5, 6, 7]]), torch.tensor([[5, 9, 10, 11]]), torch.tensor([[8, 8]])]
    alone = [dlm.logits(t) for t in x]

    def row(r, row_dlm, batcher, row_id):
        try:  # row 2 asks for rows outside its canvas: its own forward raises
            return row_dlm.logits(x[r], rows=(5, 9) if r == 2 else None)
        except Exception as exc:  # noqa: BLE001 - the row's own outcome, checked below
            return exc

    out, _ = run_batched(dlm, 3, row)
    assert calls == [3]  # one stacked forward was tried for the three rows
    assert torch.equal(out[0], alone[0]) and torch.equal(out[1], alone[1])  # rerun alone: bit for bit
    assert isinstance(out[2], Exception)


def test_a_row_joins_a_running_batch_and_a_cancelled_row_leaves_it(tiny_models, lockstep):
    """Continuous batching: a row that joins mid-decode is served from the next step on, with its own
    result; a cancelled row raises Cancelled in its own thread and the others finish unchanged."""
    import threading

    from codila_cli.decoding.batch import Cancelled, StepBatcher
    from codila_cli.engine.generate import generate

    cfg = CASES["codila-prefix"]
    alone = {p: generate(tiny_models, p, decoder="codila", config=cfg, seed=7).text for p in ("def f(x):", "def g(y):")}
    batcher = StepBatcher(gather_s=60.0)
    out: dict = {}
    rows: dict = {}
    started = threading.Event()

    def run(name, prompt):
        def on_step(_):
            started.set()
        try:
            out[name] = generate(tiny_models, prompt, decoder="codila", config=cfg, seed=7, batcher=batcher,
                                 on_step=on_step, on_row=lambda b, r: rows.__setitem__(name, r)).text
        except Cancelled:
            out[name] = "cancelled"

    first = threading.Thread(target=run, args=("first", "def f(x):"))
    first.start()
    started.wait(30)
    late = threading.Thread(target=run, args=("late", "def g(y):"))
    doomed = threading.Thread(target=run, args=("doomed", "def f(x):"))
    late.start()
    doomed.start()
    while "doomed" not in rows:
        pass
    batcher.cancel(rows["doomed"])
    for t in (first, late, doomed):
        t.join(60)
    assert out["first"] == alone["def f(x):"] and out["late"] == alone["def g(y):"]
    assert out["doomed"] == "cancelled"
    assert batcher.active == 0


def test_generate_many_validates_its_arguments(tiny_models):
    from codila_cli.engine.generate import generate_many

    with pytest.raises(ValueError):
        generate_many(tiny_models, ["a"], decoder="dream", config=DreamConfig(), seeds=[1, 2])


def test_two_lanes_give_the_same_rows_and_overlap_their_steps(native_models):
    """Lanes (codila serve --lanes): rows join the emptiest cohort, each cohort's steps run on their own,
    so two steps can run at once; every row still makes the decisions it makes alone."""
    import threading

    from codila_cli.decoding.batch import StepBatcher
    from codila_cli.engine.generate import generate

    cfg = CASES["codila-prefix"]
    prompts = ["def f(x):", "def g(y):", "x = [", "class A:"]
    alone = [generate(native_models, p, decoder="codila", config=cfg, seed=3).text for p in prompts]
    batcher = StepBatcher(lanes=2)
    ids = [batcher.join() for _ in prompts]
    assert [batcher._cohort[i] for i in ids] == [0, 1, 0, 1]  # the emptiest lane each time
    for i in ids:
        batcher.leave(i)
    together: list = [None] * len(prompts)
    running, most = [0], [0]
    real = StepBatcher._step

    def counted(self, reqs):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return real(self, reqs)
        finally:
            running[0] -= 1

    StepBatcher._step = counted
    try:
        def run(i):
            together[i] = generate(native_models, prompts[i], decoder="codila", config=cfg, seed=3, batcher=batcher).text

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        StepBatcher._step = real
    assert together == alone
    assert most[0] == 2 and batcher.active == 0
    with pytest.raises(ValueError, match="lanes"):
        StepBatcher(lanes=0)


def test_without_stacking_every_row_runs_its_own_forward_and_decodes_as_alone(native_models):
    """``stack=False`` (``serve --deterministic``): rows still share steps, but each runs the forward it
    runs alone, so its result cannot depend on the others (on a GPU a stacked GEMM rounds by batch
    size). Every forward the hardware ran served one row, and the rows' own counts add up to them."""
    import threading

    from codila_cli.decoding.batch import StepBatcher
    from codila_cli.engine.generate import generate

    cfg = CASES["codila-prefix"]
    prompts = ["def f(x):", "def g(y):", "x = [", "class A:"]
    alone = [generate(native_models, p, decoder="codila", config=cfg, seed=3) for p in prompts]
    for stack in (False, True):
        batcher = StepBatcher(stack=stack, gather_s=0.05)
        out: list = [None] * len(prompts)

        def run(i, batcher=batcher, out=out):
            out[i] = generate(native_models, prompts[i], decoder="codila", config=cfg, seed=3, batcher=batcher)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [r.text for r in out] == [r.text for r in alone]
        if stack:
            assert max(batcher.rows_per_forward) > 1  # the same rows do share forwards when stacking
        else:
            assert set(batcher.rows_per_forward) == {1}
            assert batcher.dlm_calls == sum(r.metrics["dlm_forwards"] for r in out)
