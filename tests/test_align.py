"""`codila train align` (issue 24) on tiny pairs with the real token layouts (train/shaped.py: the DLM
with Dream-Coder's ids, mask at ordinary + 23; the helper with Qwen3's, <think> at ordinary + 24/25)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.train.shaped import Shape, build_shaped

DLM = Shape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, extra_rows=421, tied=False,
            dream=True)
AR = Shape(hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, head_dim=8, extra_rows=293, tied=True,
           dream=False)
FAST = ["--seq-len", "48", "--blocks-per-row", "3", "--batch", "4", "--lr", "3e-3", "--warmup", "2",
        "--select-decoding", "0", "--valid-rows", "4"]

LR = float(FAST[FAST.index("--lr") + 1])


def _trained_alike(a: dict, b: dict, *, lr: float = LR) -> bool:
    """Two runs that compute the same update in another order of floating-point sums (micro-batches,
    ranks, thread counts, a kernel chosen by batch size, AMX) end within 1% of one step's size, lr.

    Why that bound, from the arithmetic rather than from one machine: a reordered fp32 sum changes a
    gradient coordinate by a few units in the last place of the sum of its terms' magnitudes; where the
    terms nearly cancel, that is a large part of the coordinate itself, and Adam, which scales every
    coordinate's step to about lr whatever its gradient's size, turns it into a change of the step of
    that fraction of lr (seen: 1.1e-5 = 0.4% of lr on an Intel Xeon with AMX, 2 ranks vs 1). A real
    fault (a rank's half missing from the all-reduce, micro-batches scaled twice, other rows) moves most
    coordinates by a sizeable part of lr, so 1% of lr separates the two."""
    return max(float((a[k] - b[k]).abs().max()) for k in a) <= 0.01 * lr



def _pattern_docs(n: int, seed: int = 0) -> list[str]:
    """A language the helper can learn: triples t_a t_(a+50) t_(a+100)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        words = []
        for _ in range(40):
            a = rng.randrange(1, 50)
            words += [f"t{a}", f"t{a + 50}", f"t{a + 100}"]
        docs.append(" ".join(words))
    return docs


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pair")
    paths = build_shaped(root / "m", dlm=DLM, ar=AR, ordinary=500)
    data = root / "data"
    data.mkdir()
    for i, text in enumerate(_pattern_docs(30)):
        (data / f"f{i:02d}.txt").write_text(text)
    return {**paths, "data": data, "root": root}


def _align(pair, out: Path, *extra: str, steps: int = 4, data: str | None = None, glob: str = "*.txt"):
    args = ["train", "align", "--dlm", str(pair["dlm"]), "--ar", str(pair["ar"]), "--data", data or str(pair["data"]),
            "--glob", glob, "--output", str(out), "--steps", str(steps), *FAST, *extra]
    return CliRunner().invoke(app, args)


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "training" / "log.jsonl").read_text().splitlines()]


def test_alignment_lowers_the_validation_loss_and_writes_a_helper_that_decodes(pair, tmp_path):
    out = tmp_path / "helper"
    r = _align(pair, out, "--valid-every", "10", "--weighting", "mean", steps=40)
    assert r.exit_code == 0, r.stderr
    valid = [row["valid"] for row in _log(out) if "valid" in row]
    assert len(valid) == 4 and valid[-1] < valid[0] - 0.3, valid
    assert (out / "training" / "loss.png").is_file()
    cfg = json.loads((out / "config.json").read_text())
    prov = cfg["codila_training"]
    assert prov["dlm"]["path"] == str(pair["dlm"].resolve()) and prov["ar"]["path"] == str(pair["ar"].resolve())
    assert prov["steps"] == 40 and prov["block_sizes"] == [2, 4, 8] and len(prov["data"]["sha256"]) == 64
    assert prov["data"]["documents"]["train"] + prov["data"]["documents"]["valid"] == 30
    assert set(prov["valid_block_ce"]) == {"2", "4", "8"}
    g = CliRunner().invoke(app, ["gen", "--dlm", str(pair["dlm"]), "--ar", str(out), "--max-new-tokens", "8",
                                 "--seed", "0", "--json", "t1 t51"])
    assert g.exit_code == 0, g.stderr
    doc = json.loads(g.stdout)
    assert doc["decoder"] == "codila" and doc["metrics"]["tokens"] == 8 and "Warning" not in g.stderr


def test_gen_warns_when_the_helper_was_aligned_to_another_dlm(pair, tmp_path):
    out = tmp_path / "helper"
    assert _align(pair, out, steps=1).exit_code == 0
    copy = tmp_path / "copied-dlm"  # a copy has the same weights (fingerprint): the same model, no warning
    shutil.copytree(pair["dlm"], copy)
    g = CliRunner().invoke(app, ["gen", "--dlm", str(copy), "--ar", str(out), "--max-new-tokens", "4", "t1"])
    assert g.exit_code == 0 and "Warning" not in g.stderr, g.stderr
    other = tmp_path / "other-dlm"
    shutil.copytree(pair["dlm"], other)
    from safetensors.torch import load_file, save_file

    weights = load_file(other / "model.safetensors")
    weights = {k: v * 1.5 for k, v in weights.items()}
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    g = CliRunner().invoke(app, ["gen", "--dlm", str(other), "--ar", str(out), "--max-new-tokens", "4", "t1"])
    assert g.exit_code == 0, g.stderr
    assert "Warning: the AR helper" in g.stderr and str(pair["dlm"].resolve()) in g.stderr


def test_one_hot_marginals_give_the_tokens_embeddings():
    from codila_cli.train.align.loss import SoftEmbed

    torch.manual_seed(0)
    emb = torch.randn(10, 6, requires_grad=True)
    head = torch.eye(10, 4) * 200.0  # token k's logit row is 200 at k, 0 elsewhere → π ≈ one-hot(k)
    h = torch.eye(4)  # hidden rows picking tokens 0..3
    e = SoftEmbed.apply(h, head, emb, 2)
    assert torch.allclose(e, emb[:4].detach(), atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_chunked_soft_embedding_equals_the_unchunked_reference(chunk):
    """The chunked forward and the recomputing backward equal the plain softmax(h Wᵀ) E with autograd."""
    from codila_cli.train.align.loss import SoftEmbed

    torch.manual_seed(1)
    h, head = torch.randn(7, 5), torch.randn(30, 5)
    emb = torch.randn(30, 4, requires_grad=True)
    grad = torch.randn(7, 4)
    ref_emb = emb.detach().clone().requires_grad_(True)
    ref = torch.softmax(h @ head.T, -1) @ ref_emb
    (ref * grad).sum().backward()
    out = SoftEmbed.apply(h, head, emb, chunk)
    (out * grad).sum().backward()
    assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(emb.grad, ref_emb.grad, atol=1e-5)


def test_the_loss_never_depends_on_the_chunk_size(pair, monkeypatch):
    """The whole objective with one block row per chunk equals it with every row in one chunk."""
    import codila_cli.train.align.loss as loss_mod
    from codila_cli.train.align import AlignConfig, inspect_pair
    from codila_cli.train.align.trainer import Models, Step, make_rows

    cfg = AlignConfig(dlm=str(pair["dlm"]), ar=str(pair["ar"]), data=str(pair["data"]), output=pair["root"] / "x",
                      seq_len=48, blocks_per_row=3, context=8, device="cpu")
    models = Models(cfg, inspect_pair(cfg), torch.device("cpu"))
    stream = torch.randint(1, 150, (500,)).numpy()
    x0 = make_rows(stream, [0, 1], seed=0, step=0, seq_len=48, bos=None)
    st = Step(cfg, 0)
    values = []
    for chunk in (1, 10_000):
        monkeypatch.setattr(loss_mod, "CHUNK", chunk)
        models.ar.zero_grad()
        loss = models.loss(models.ar, x0, st, st.plans([0, 1], 48), weighting="nelbo")
        loss.backward()
        values.append((float(loss.detach()), models.ar.get_input_embeddings().weight.grad.clone()))
    assert abs(values[0][0] - values[1][0]) < 1e-5 and torch.allclose(values[0][1], values[1][1], atol=1e-6)


def test_a_run_reading_the_marginals_cache_skips_the_dlm_and_gives_the_writing_runs_parameters(
        pair, tmp_path, monkeypatch):
    from codila_cli.train.align import trainer

    cache = tmp_path / "marginals"
    flags = ("--marginals-cache", str(cache), "--marginals-top-k", "5", "--frontier", "0.1", "--context", "8")
    assert _align(pair, tmp_path / "a", *flags, steps=3).exit_code == 0  # steps 0, 1 frontier, 2 not
    assert [row["dlm_forwards"] for row in _log(tmp_path / "a")] == [1, 1, 1]
    (key_dir,) = cache.iterdir()
    assert json.loads((key_dir / "key.json").read_text())["top_k"] == 5 and len(list(key_dir.rglob("*.npz"))) == 3 * 4

    def no_dlm(*a, **k):
        raise AssertionError("the DLM ran although the cache holds these rows")

    monkeypatch.setattr(trainer, "block_topk", no_dlm)
    r = _align(pair, tmp_path / "b", *flags, "--grad-accum", "2", steps=3)  # other micro-batches: the same rows
    assert r.exit_code == 0, r.stderr
    assert [row["dlm_forwards"] for row in _log(tmp_path / "b")] == [0, 0, 0]
    a = torch.load(tmp_path / "a" / "training" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "training" / "ckpt.pt", weights_only=True)["model"]
    assert _trained_alike(a, b)
    r = _align(pair, tmp_path / "c", *flags, "--lr", "1e-3", "--context", "4", "--weighting", "mean", steps=2)
    assert r.exit_code == 0, r.stderr  # what the marginals do not depend on may change
    assert json.loads((tmp_path / "c" / "config.json").read_text())["codila_training"]["marginals_top_k"] == 5
    r = _align(pair, tmp_path / "d", *flags, "--seed", "3", steps=1)
    assert r.exit_code != 0 and "the DLM ran" in r.stderr + repr(r.exception)  # other rows: new marginals
    assert len(list(cache.iterdir())) == 2  # under a key of their own


def test_top_k_marginals_with_k_at_least_the_shared_set_give_the_full_objective(pair):
    from codila_cli.train.align import AlignConfig, inspect_pair
    from codila_cli.train.align.loss import block_topk
    from codila_cli.train.align.trainer import Models, Step, make_rows

    cfg = AlignConfig(dlm=str(pair["dlm"]), ar=str(pair["ar"]), data=str(pair["data"]), output=pair["root"] / "x",
                      seq_len=48, blocks_per_row=3, context=8, device="cpu")
    models = Models(cfg, inspect_pair(cfg), torch.device("cpu"))
    x0 = make_rows(torch.randint(1, 150, (500,)).numpy(), [0, 1], seed=0, step=0, seq_len=48, bos=None)
    st = Step(cfg, 0)
    plans = st.plans([0, 1], 48)
    results = []
    for k in (None, len(models.ids.shared), 3):
        topk = None if k is None else block_topk(models.dlm, x0, plans, ids=models.ids, block=st.block,
                                                 head_s=models.head_s, k=k)
        models.ar.zero_grad()
        loss = models.loss(models.ar, x0, st, plans, weighting="nelbo", topk=topk)
        loss.backward()
        results.append((float(loss.detach()), models.ar.get_input_embeddings().weight.grad.clone()))
    (full, g_full), (all_k, g_all), (three, _) = results
    assert abs(full - all_k) < 2e-3 * abs(full) and torch.allclose(g_full, g_all, atol=2e-4)  # float16 probabilities
    assert abs(full - three) > 1e-4  # truncation to 3 ids is another objective


def test_resume_is_exact(pair, tmp_path):
    """4 steps straight, or 2 steps then --resume to 4: the same losses and the same parameters (with
    frontier steps and left context in the mix)."""
    straight, split = tmp_path / "a", tmp_path / "b"
    mix = ("--ckpt-every", "1", "--frontier", "0.1", "--context", "8")  # steps 0, 1 of every 20: frontier
    assert _align(pair, straight, *mix, steps=4).exit_code == 0
    assert _align(pair, split, *mix, steps=2).exit_code == 0
    again = _align(pair, split, *mix, steps=2)
    assert again.exit_code == 2 and "holds a training run already" in again.stderr  # never overwritten silently
    changed = _align(pair, split, *mix, "--seed", "5", "--resume", steps=4)
    assert changed.exit_code == 2 and "seed" in changed.stderr
    r = _align(pair, split, *mix, "--resume", steps=4)
    assert r.exit_code == 0, r.stderr
    assert [row["loss"] for row in _log(straight)] == [row["loss"] for row in _log(split)]
    assert {row["frontier"] for row in _log(straight)} == {True, False}
    a = torch.load(straight / "training" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(split / "training" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_same_global_batch_gives_the_same_update_with_micro_batches(pair, tmp_path):
    one, accum = tmp_path / "one", tmp_path / "accum"
    assert _align(pair, one, steps=3).exit_code == 0
    assert _align(pair, accum, "--grad-accum", "2", steps=3).exit_code == 0
    a = torch.load(one / "training" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(accum / "training" / "ckpt.pt", weights_only=True)["model"]
    assert _trained_alike(a, b)


@pytest.mark.slow
def test_two_gloo_processes_give_the_parameters_of_one(pair, tmp_path):
    """torchrun with 2 processes (gloo, DDP) and the same global batch: the parameters of 1 process."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert _align(pair, one, steps=3).exit_code == 0
    args = ["--dlm", str(pair["dlm"]), "--ar", str(pair["ar"]), "--data", str(pair["data"]), "--glob", "*.txt",
            "--output", str(two), "--steps", "3", *FAST]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                        "codila_cli.train.align", *args], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    a = torch.load(one / "training" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(two / "training" / "ckpt.pt", weights_only=True)["model"]
    assert _trained_alike(a, b)
    assert [row["loss"] for row in _log(one)] == pytest.approx([row["loss"] for row in _log(two)], abs=1e-4)


def test_nproc_hands_torchrun_the_same_settings(pair, tmp_path, monkeypatch):
    """`--nproc N` rebuilds every flag for the processes it starts: parsing them gives the same config."""
    import codila_cli.train.align as align_mod
    from codila_cli.train.align import launch

    seen = []
    monkeypatch.setattr(launch, "torchrun", lambda n, cfg: seen.append((n, cfg)) or 0)
    r = _align(pair, tmp_path / "h", "--nproc", "2", "--context", "16", "--frontier", "0.25", "--resume", steps=7)
    assert r.exit_code == 2 and "--resume" in r.stderr and not seen  # preflight runs before any process starts
    r = _align(pair, tmp_path / "h", "--nproc", "2", "--context", "16", "--frontier", "0.25", "--no-grad-checkpointing",
               "--marginals-cache", str(tmp_path / "m"), "--marginals-top-k", "7")
    assert r.exit_code == 0, r.stderr
    n, cfg = seen[-1]
    parsed = []
    monkeypatch.setattr(align_mod, "run", lambda c, on_log=None: parsed.append(c) or {})
    r = CliRunner().invoke(app, ["train", "align", *launch.align_args(cfg)])
    assert r.exit_code == 0, r.stderr
    assert n == 2 and parsed[0] == cfg and cfg.context == 16 and cfg.grad_checkpointing is False
    assert cfg.marginals_cache == tmp_path / "m" and cfg.marginals_top_k == 7


def _jsonl(path: Path, docs: list[str]) -> None:
    path.write_text("".join(json.dumps({"content": d, "n": i}) + "\n" for i, d in enumerate(docs)))


def test_every_data_source_format_loads_the_same_documents(tmp_path):
    from codila_cli.train.sources import documents, parse_source

    docs = _pattern_docs(5)
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    for i, d in enumerate(docs):
        (tmp_path / "src" / "pkg" / f"m{i}.py").write_text(d)
    (tmp_path / "src" / ".git").mkdir()
    (tmp_path / "src" / ".git" / "x.py").write_text("not a document")
    _jsonl(tmp_path / "d.jsonl", docs)
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset, DatasetDict

    pq.write_table(pa.table({"content": docs}), tmp_path / "d.parquet")
    Dataset.from_dict({"content": docs}).save_to_disk(str(tmp_path / "ds"))
    DatasetDict({"train": Dataset.from_dict({"content": docs})}).save_to_disk(str(tmp_path / "dsd"))
    run = tmp_path / "run" / "corpus"
    run.mkdir(parents=True)
    (run / "train.jsonl").write_text("".join(json.dumps({"kind": "file", "text": d}) + "\n" for d in docs[:3]))
    (run / "valid.jsonl").write_text("".join(json.dumps({"kind": "file", "text": d}) + "\n" for d in docs[3:]))
    specs = {"files": str(tmp_path / "src"), "jsonl": str(tmp_path / "d.jsonl"), "parquet": str(tmp_path / "d.parquet"),
             "datasets": str(tmp_path / "ds"), "bundled": f"bundled:{tmp_path / 'run'}"}
    for kind, spec in specs.items():
        src = parse_source(spec, field="content")
        assert src.kind == kind and list(documents(src)) == docs, kind
    assert list(documents(parse_source(str(tmp_path / "dsd"), field="content"))) == docs
    from codila_cli.errors import UsageError

    with pytest.raises(UsageError, match="no column 'text'"):
        list(documents(parse_source(str(tmp_path / "d.parquet"))))
    with pytest.raises(UsageError, match="has no text field 'text'"):
        list(documents(parse_source(str(tmp_path / "d.jsonl"))))


def test_a_fifo_and_an_endless_line_are_refused_as_data(tmp_path, monkeypatch):
    """Issue 53: `--data` on a FIFO hung (it waited for a writer) and a 600 MiB JSONL line reached the
    tokenizer. A FIFO is refused before anything reads it; a line over the limit is an error naming it,
    read no further than the limit."""
    import os

    from codila_cli.errors import UsageError
    from codila_cli.train import sources
    from codila_cli.train.sources import documents, parse_source

    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="a FIFO"):
        parse_source(str(fifo))
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1000)
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"text": "x = 1\n"}) + "\n" + json.dumps({"text": "y" * 5000}) + "\n")
    docs = documents(parse_source(str(big)))
    assert next(docs) == "x = 1\n"
    with pytest.raises(UsageError, match="line 2 is over"):
        next(docs)


def test_bad_inputs_fail_before_any_model_loads(pair, tmp_path, monkeypatch):
    import codila_cli.models.ar as ar_mod
    import codila_cli.models.families as dream_mod
    from codila_cli.train.tiny import build_tiny

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(dream_mod, "load_dlm", boom)
    monkeypatch.setattr(ar_mod, "load_ar", boom)
    empty = tmp_path / "empty"
    empty.mkdir()
    no_mask = tmp_path / "no-mask"
    shutil.copytree(pair["dlm"], no_mask)
    tok = json.loads((no_mask / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        if added["content"] == "<|mask|>":
            added["content"] = "<|unused|>"
    (no_mask / "tokenizer.json").write_text(json.dumps(tok))
    tok_cfg = json.loads((no_mask / "tokenizer_config.json").read_text())
    tok_cfg.pop("mask_token", None)
    (no_mask / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    cfg = json.loads((no_mask / "config.json").read_text())
    cfg.pop("mask_token_id", None)
    (no_mask / "config.json").write_text(json.dumps(cfg))
    other_vocab = build_tiny(tmp_path / "tiny")["ar"]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [
        (["--data", str(tmp_path / "missing")], "no such file"),
        (["--data", str(empty)], "holds no documents"),
        (["--dlm", str(no_mask)], "no mask token"),
        (["--ar", str(other_vocab)], "does not share a vocabulary"),
        (["--output", str(blocker / "sub")], "not writable"),
        (["--output", str(blocker)], "not a directory"),
        (["--steps", "0"], "--steps"),
        (["--block-sizes", "2,x"], "--block-sizes"),
        (["--batch", "3", "--grad-accum", "2"], "multiple"),
        (["--weighting", "sum"], "--weighting"),
        (["--marginals-cache", str(blocker)], "--marginals-cache"),
        (["--marginals-top-k", "0", "--marginals-cache", str(tmp_path / "m")], "--marginals-top-k"),
        (["--marginals-top-k", "8"], "with --marginals-cache only"),
    ]
    for flags, message in cases:
        base = {"--dlm": str(pair["dlm"]), "--ar": str(pair["ar"]), "--data": str(pair["data"]),
                "--output": str(tmp_path / "out"), "--steps": "2", "--glob": "*.txt"}
        base.update(zip(flags[::2], flags[1::2]))
        args = ["train", "align", *[x for kv in base.items() for x in kv]]
        r = CliRunner().invoke(app, args)
        # a pair that cannot be bridged is a runtime error (1), as in gen (docs/exit-codes.md; issue 60: it was 2)
        runtime = message in ("no mask token", "does not share a vocabulary")
        assert r.exit_code == (1 if runtime else 2), (flags, r.stderr, r.exception)
        lines = r.stderr.strip().splitlines()
        assert lines[0].startswith("Error: ") and message in lines[0] and lines[1].startswith("Hint: "), (flags, lines)


def test_frontier_plans_mirror_left_to_right_decoding():
    """frontier: one block start s per row, everything left of it visible, the block masked, the rest
    masked at some rate; the helper reads the true left context back to s − ctx_max."""
    from codila_cli.train.align.loss import plan_row

    for seed in range(20):
        p = plan_row(41, block=4, blocks=3, gen=torch.Generator().manual_seed(seed), frontier=True, ctx_max=16,
                     ctx_prob=0.0, weighting="nelbo")
        (s,) = p.starts
        assert 9 <= s <= 41 - 4 and p.weight == 1.0
        assert not bool(p.masked[:s].any()) and bool(p.masked[s : s + 4].all())
        assert p.context == (min(16, s),)  # frontier blocks always read their context


def test_block_masks_score_blocks_that_hold_masks_with_the_nelbo_weight():
    from codila_cli.train.align.loss import normaliser, plan_row

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        p = plan_row(49, block=8, blocks=4, gen=g, frontier=False, ctx_max=0, ctx_prob=0.5, weighting="nelbo")
        assert not bool(p.masked[0]) and len(p.starts) == 4 and p.context == (0, 0, 0, 0)
        grid = p.masked[1:49].view(6, 8).any(-1)
        assert all(bool(grid[(s - 1) // 8]) and (s - 1) % 8 == 0 for s in p.starts)
        g = torch.Generator().manual_seed(seed)
        t = 1e-3 + (1 - 1e-3) * float(torch.rand(1, generator=g))  # the rate plan_row drew first
        assert p.weight == pytest.approx(int(grid.sum()) / (4 * t))
        mean = plan_row(49, block=8, blocks=4, gen=torch.Generator().manual_seed(seed), frontier=False, ctx_max=0,
                        ctx_prob=0.5, weighting="mean")
        assert mean.weight == 1.0 and torch.equal(mean.masked, p.masked)
    assert normaliser([p, p], n=49, block=8, weighting="nelbo", frontier=False) == 2 * 48
    assert normaliser([p, p], n=49, block=8, weighting="mean", frontier=False) == 2 * 4 * 8


def test_the_recorded_decoding_is_measured_on_held_out_prompts(tiny, tmp_path):
    """With Python data, the helper's codila_decoding is the best of the grid on held-out function
    prompts, and every measured setting is kept in codila_training.selection."""
    import textwrap

    data = tmp_path / "py"
    data.mkdir()
    for i in range(12):
        (data / f"m{i}.py").write_text(textwrap.dedent(f'''\
            def add_{i}(a, b):
                """Add two numbers."""
                total = a + b
                return total


            def scale_{i}(x, k={i}):
                y = x * k
                return y
            '''))
    out = tmp_path / "helper"
    r = CliRunner().invoke(app, ["train", "align", "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--data",
                                 str(data), "--output", str(out), "--steps", "2", "--batch", "2", "--seq-len", "48",
                                 "--valid-fraction", "0.4", "--select-decoding", "2", "--context", "8",
                                 "--block-sizes", "2,4"])
    assert r.exit_code == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    measured = cfg["codila_training"]["selection"]
    assert {(m["block_size"], m["ar_context"]) for m in measured} == {(2, 0), (2, 8), (4, 0), (4, 8)}
    from codila_cli.helper_card import recommended_decoding
    from codila_cli.train.align.output import choose

    picked = choose(measured, measured[0]["prompts"])
    assert cfg.get("codila_decoding", {}) == picked
    assert {k: v for k, v in recommended_decoding(str(out)).items() if k in picked} == picked  # what gen uses


def test_a_recommendation_needs_a_measurement_that_supports_it():
    from codila_cli.train.align.output import choose

    def row(b: int, c: int, valid: int) -> dict:
        return {"block_size": b, "ar_context": c, "candidate_blocks": 1 if c else 10, "valid": valid, "prompts": 20}

    assert choose([row(2, 0, 9), row(4, 0, 12), row(4, 8, 12), row(8, 0, 3)], 20) == {
        "block_size": 4, "ar_context": 0, "candidate_blocks": 10}  # the best; a tie goes to the first listed
    assert choose([row(2, 0, 5), row(8, 8, 5)], 20) == {}  # every setting the same: nothing to choose
    assert choose([row(2, 0, 0), row(8, 8, 1)], 20) == {}  # 1 of 20 valid: noise
    assert choose([row(2, 0, 0), row(8, 8, 2)], 20) == {"block_size": 8, "ar_context": 8, "candidate_blocks": 1}


def test_a_damaged_cache_entry_is_recomputed_never_trained_on(pair, tmp_path):
    """Issue 40: a tampered --marginals-cache entry was trained on without a word, a truncated one was an
    internal error (BadZipFile). Now each fails its checksum or its load, is removed and recomputed
    (counted as cache_damaged), and the run gives the writing run's parameters."""
    import numpy as np

    cache = tmp_path / "marginals"
    flags = ("--marginals-cache", str(cache), "--marginals-top-k", "5", "--context", "8")
    assert _align(pair, tmp_path / "a", *flags, steps=2).exit_code == 0
    entries = sorted(cache.rglob("*.npz"))
    with np.load(entries[0]) as z:  # the same checksum, other numbers: an edit
        arrays = {k: z[k] for k in z.files}
    arrays["probs"] = (arrays["probs"][::-1] * 0 + 0.2).astype(np.float16)
    np.savez(entries[0], **arrays)
    entries[5].write_bytes(entries[5].read_bytes()[:40])  # a truncated write
    r = _align(pair, tmp_path / "b", *flags, steps=2)
    assert r.exit_code == 0, r.stderr
    log = _log(tmp_path / "b")
    assert [row["dlm_forwards"] for row in log] == [1, 1] and log[-1]["cache_damaged"] == 2
    a = torch.load(tmp_path / "a" / "training" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "training" / "ckpt.pt", weights_only=True)["model"]
    assert _trained_alike(a, b)


@pytest.mark.parametrize("damage", ["truncate", "edit"])
def test_resume_from_a_damaged_checkpoint_is_a_clear_error_naming_it(pair, tmp_path, damage):
    out = tmp_path / "run"
    assert _align(pair, out, "--ckpt-every", "1", steps=2).exit_code == 0
    ckpt = out / "training" / "ckpt.pt"
    if damage == "truncate":
        ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
        said = f"Error: checkpoint {ckpt} cannot be read"
    else:
        state = torch.load(ckpt, weights_only=True)
        name = next(iter(state["model"]))
        state["model"][name] = state["model"][name] + 1
        torch.save(state, ckpt)
        said = f"Error: checkpoint {ckpt} fails its checksum"
    r = _align(pair, out, "--ckpt-every", "1", "--resume", steps=4)
    assert r.exit_code == 2 and r.stderr.startswith(said), r.stderr
    assert "disk" not in r.stderr and f"delete {ckpt}" in r.stderr and "Traceback" not in r.stderr


def test_a_really_interrupted_run_resumes_to_the_uninterrupted_runs_parameters(pair, tmp_path):
    """A real process, interrupted with SIGINT mid-run (exit 130, a checkpoint of a whole step), then
    --resume: the same losses and parameters as a run that was never interrupted."""
    import signal
    import subprocess
    import sys
    import time

    args = ["train", "align", "--dlm", str(pair["dlm"]), "--ar", str(pair["ar"]), "--data", str(pair["data"]),
            "--glob", "*.txt", "--steps", "30", "--ckpt-every", "1", *FAST]
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert _align(pair, straight, "--ckpt-every", "1", steps=30).exit_code == 0
    proc = subprocess.Popen([sys.executable, "-m", "codila_cli", *args, "--output", str(cut)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,  # Ctrl-C does its default,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # inherited ignored or not
    log = cut / "training" / "log.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    done = len(_log(cut))
    assert 3 <= done < 30, done  # interrupted mid-run, not before it began or after it ended
    # the checkpoint holds a whole step: the last one logged, or the one whose log line the interrupt cut off
    assert torch.load(cut / "training" / "ckpt.pt", weights_only=True)["step"] in (done, done + 1)
    r = _align(pair, cut, "--ckpt-every", "1", "--resume", steps=30)
    assert r.exit_code == 0, r.stderr
    losses = {row["step"]: row["loss"] for row in _log(straight)}
    assert all(losses[row["step"]] == row["loss"] for row in _log(cut)) and len(_log(cut)) >= 29
    a = torch.load(straight / "training" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(cut / "training" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_prints_one_line_or_with_json_one_object(pair, tmp_path):
    """Issue 41: `train` had no --json; stdout was always JSON. Now one line of text, or --json."""
    r = _align(pair, tmp_path / "a", steps=1)
    assert r.exit_code == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert line.startswith("align: ") and f"output {tmp_path / 'a'}" in line and "{" not in line
    r = _align(pair, tmp_path / "b", "--json", steps=1)
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["output"] == str(tmp_path / "b") and out["step"] == 1


@pytest.mark.parametrize("cut_at", [2, 4])
def test_an_interrupt_during_a_steps_validation_loses_no_log_line_on_resume(pair, tmp_path, monkeypatch, cut_at):
    """Issue 60: an interrupt between a step's update and its log line (during its validation) saved the
    step, so --resume went on after it and its line, and at the last step the helper's valid_block_ce,
    were lost. The checkpoint now keeps the unfinished record, and --resume finishes it first."""
    from codila_cli.train.align import trainer

    real = trainer.validate
    calls = {"n": 0}

    def interrupted(cfg, *a, **k):
        calls["n"] += 1
        if calls["n"] == cut_at // 2:  # validations run at steps 2 and 4 (--valid-every 2)
            raise KeyboardInterrupt
        return real(cfg, *a, **k)

    monkeypatch.setattr(trainer, "validate", interrupted)
    out = tmp_path / "h"
    r = _align(pair, out, "--valid-every", "2", "--ckpt-every", "1")
    assert r.exit_code == 130, r.output
    assert [row["step"] for row in _log(out)] == list(range(1, cut_at))  # the cut step's line is not written yet
    monkeypatch.setattr(trainer, "validate", real)
    r = _align(pair, out, "--valid-every", "2", "--ckpt-every", "1", "--resume")
    assert r.exit_code == 0, r.stderr
    rows = _log(out)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert all("valid" in row for row in rows if row["step"] % 2 == 0)
    card = json.loads((out / "config.json").read_text())["codila_training"]
    assert card["steps"] == 4 and card["valid_block_ce"], card


def test_long_documents_are_encoded_in_bounded_pieces(pair):
    """Issue 60: one 12 MiB JSON line drove train align to 4.5 GB in the tokenizer. A document longer than
    a piece is encoded a piece at a time (the tokenizer never sees more than a piece), cut after line
    breaks where a token ends anyway, so a document of normal lines gets the ids it gets whole."""
    from transformers import AutoTokenizer

    from codila_cli.models.tokens import encode_long, encode_text

    tok = AutoTokenizer.from_pretrained(str(pair["dlm"]))
    seen = []

    class Watched:
        def __call__(self, text, **kw):
            seen.append(len(text))
            return tok(text, **kw)

    code = "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n" * 300
    assert encode_long(Watched(), code, piece=500) == encode_text(tok, code)
    assert max(seen) <= 500 and len(seen) > 10
    seen.clear()
    line = "x" * 5000  # one line longer than a piece: cut at the piece
    assert len(encode_long(Watched(), line, piece=512)) >= len(encode_text(tok, line)) and max(seen) <= 512
