"""Batched decoding (decoding/batch.py): a batch of N equals N single runs, with per-row accounting."""

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
    # the bundled helper recommends a prefix cache: its calls cannot share forwards, so no batch
    "codila-prefix": CodilaConfig(max_new_tokens=16, block_size=4, candidate_blocks=1, cache="prefix",
                                  cache_blocks=2, ar_temperature=1.0, sampling=SAMPLED),
}


def _on_gpu(models):
    """``models`` as batching_pays would see them on a GPU (only the DLM's device is read)."""
    from types import SimpleNamespace

    return SimpleNamespace(dlm=SimpleNamespace(device=torch.device("cuda")))


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_of_n_equals_n_single_runs(tiny_models, case):
    from codila_cli.engine.generate import batching_pays, generate, generate_many

    decoder = case.split("-")[0]
    cfg = CASES[case]
    # same token length: the batched forward is then bit-identical to single forwards (rows of other
    # lengths are left-padded, equal up to float rounding: test_padded_rows_match_unpadded_logits)
    prompts = ["def f(x):", "def f(x):", "def a(b):", "def f(n):"]
    tok = tiny_models.dlm.tokenizer
    assert len({len(tok.encode(p, add_special_tokens=False)) for p in prompts}) == 1
    seeds = [11, 12, 13, 14]
    batch = generate_many(tiny_models, prompts, decoder=decoder, config=cfg, seeds=seeds)
    singles = [generate(tiny_models, p, decoder=decoder, config=cfg, seed=s) for p, s in zip(prompts, seeds)]
    for b, s in zip(batch.results, singles):
        assert b.text == s.text
        assert b.seed == s.seed
        for key in ("tokens", "dlm_forwards", "ar_forwards", "steps"):
            assert b.metrics[key] == s.metrics[key], key
    if cfg.__dict__.get("cache", "none") != "none":  # every cached call runs per row: nothing is shared,
        assert not batch.batched  # so the rows ran one after another and the hardware ran all their forwards
        assert batch.batched_forwards == sum(s.metrics["dlm_forwards"] for s in singles)
        assert not batching_pays(_on_gpu(tiny_models), cfg)
    else:  # the hardware ran one forward per step of the longest row, not one per row and step
        assert batch.batched
        assert batch.batched_forwards == max(s.metrics["dlm_forwards"] for s in singles)
        assert batching_pays(_on_gpu(tiny_models), cfg)
    assert batch.summary()["row_dlm_forwards"] == sum(s.metrics["dlm_forwards"] for s in singles)


def test_rows_one_after_another_equal_the_batch(tiny_models, monkeypatch):
    """batched=False (what gen -n does on a CPU) decodes the rows in turn: the same texts and per-row
    counts as the batch, the hardware's forwards are the rows' sum, and on_step sees row 0 only."""
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
    assert batching_pays(tiny_models) is False  # the tiny models run on the CPU


def test_rows_that_finish_leave_the_batch(tiny_models):
    """Rows of different canvas lengths: the batch shrinks as rows finish; counts stay per row."""
    from codila_cli.decoding.batch import run_batched
    from codila_cli.decoding.dream import decode_dream

    dlm = tiny_models.dlm
    prompt = dlm.tokenizer.encode("def f(x):", add_special_tokens=False)
    lengths = [4, 8, 12]

    def row(r, row_dlm):
        cfg = DreamConfig(max_new_tokens=lengths[r], tokens_per_step=1, early_stop=False)
        return decode_dream(row_dlm, prompt, config=cfg)

    before = dlm.forwards
    results, batcher = run_batched(dlm, 3, row)
    assert [r.dlm_forwards for r in results] == lengths
    assert batcher.batched_forwards == 12 == dlm.forwards - before
    assert batcher.rows_per_forward == [3] * 4 + [2] * 4 + [1] * 4


def test_padded_rows_match_unpadded_logits(tiny_models):
    """Left padding with Dream's convention leaves each row's logits unchanged."""
    from codila_cli.decoding.batch import Batcher

    dlm = tiny_models.dlm
    short = torch.tensor([[5, 6, 7]])
    long = torch.tensor([[5, 9, 10, 11, 12, 6]])
    alone = [dlm.logits(short), dlm.logits(long)]
    b = Batcher(dlm, 2)
    import threading

    out = {}
    t = threading.Thread(target=lambda: out.__setitem__(0, b.request(0, short)))
    t.start()
    out[1] = b.request(1, long)
    t.join()
    # row 0 of a shifted canvas has no predictor; compare the rows that predict real tokens
    assert torch.allclose(out[0][:, 1:], alone[0][:, 1:], atol=1e-4)
    assert torch.allclose(out[1], alone[1], atol=1e-4)
    assert b.batched_forwards == 1


def test_an_error_in_one_row_is_raised_and_nothing_hangs(tiny_models):
    from codila_cli.decoding.batch import run_batched

    dlm = tiny_models.dlm

    def row(r, row_dlm):
        if r == 1:
            raise ValueError("row 1 broke")
        x = torch.tensor([[5, 6, 7]])
        for _ in range(3):
            row_dlm.logits(x)
        return r

    with pytest.raises(ValueError, match="row 1 broke"):
        run_batched(dlm, 3, row)


def test_generate_many_validates_its_arguments(tiny_models):
    from codila_cli.engine.generate import generate_many

    with pytest.raises(ValueError):
        generate_many(tiny_models, ["a"], decoder="dream", config=DreamConfig(), seeds=[1, 2])
