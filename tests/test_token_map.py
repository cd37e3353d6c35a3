"""CoDiLA across two vocabularies (models/token_map.py, decoding/bridged.py): a helper whose tokenizer
holds the DLM's pieces under other ids is bridged by token strings, and writes what the same helper writes
under the DLM's own ids."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

LLADA = Path(__file__).resolve().parent / "fixtures" / "llada" / "checkpoints" / "llada-tiny-a"


def _helper(out: Path, perm: list[int] | None = None) -> Path:
    """A tiny Qwen3 AR with the LLaDA fixture's tokenizer; ``perm`` relabels its 512 ordinary ids (the
    tokenizer's vocabulary and the embedding and head rows together), which changes no text it writes."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=576, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                         tie_word_embeddings=False, eos_token_id=512))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    tok = json.loads((LLADA / "tokenizer.json").read_text())
    if perm is not None:
        index = torch.arange(576)
        index[torch.tensor(perm)] = torch.arange(512)  # new id perm[i] holds old id i
        with torch.no_grad():
            for w in (model.model.embed_tokens.weight, model.lm_head.weight):
                w.copy_(w[index])
        tok["model"]["vocab"] = {t: (perm[i] if i < 512 else i) for t, i in tok["model"]["vocab"].items()}
    model.save_pretrained(out)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    shutil.copy(LLADA / "tokenizer_config.json", out / "tokenizer_config.json")
    return out


def test_a_helper_with_other_ids_writes_what_the_same_helper_writes_with_the_dlms_ids(tmp_path):
    from codila_cli.engine.models import load_models
    from codila_cli.models.token_map import TokenMap
    from codila_cli.models.tokens import VocabBridge

    perm = torch.randperm(512, generator=torch.Generator().manual_seed(1)).tolist()
    same, other = _helper(tmp_path / "same"), _helper(tmp_path / "other", perm)
    a = load_models(dlm=str(LLADA), ar=str(same), device="cpu", dtype="float32")
    b = load_models(dlm=str(LLADA), ar=str(other), device="cpu", dtype="float32")
    assert isinstance(a.bridge, VocabBridge) and isinstance(b.bridge, TokenMap)
    assert b.bridge.coverage == 1.0 and int(b.bridge.to_ar[5]) == perm[5] and int(b.bridge.to_dlm[perm[5]]) == 5
    texts = []
    for helper in (same, other):
        r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(LLADA), "--ar", str(helper),
                            "--decoder", "codila", "--max-new-tokens", "24", "--seed", "0", "--json", "-q",
                            "--dtype", "float32", "def add(a, b):"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["decoder"] == "codila" and doc["metrics"]["ar_forwards"] >= 1
        texts.append(doc["completion"])
    assert texts[0] == texts[1]


def test_a_helper_sharing_too_few_pieces_is_refused_with_both_measures(tmp_path):
    from codila_cli.engine.models import load_models
    from codila_cli.errors import IncompatibleModelsError

    helper = _helper(tmp_path / "h")
    tok = json.loads((helper / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {("zz" + t if i < 500 else t): i for t, i in tok["model"]["vocab"].items()}
    tok["model"]["merges"] = []
    (helper / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    with pytest.raises(IncompatibleModelsError, match="by token strings: the AR helper .* shares"):
        load_models(dlm=str(LLADA), ar=str(helper), device="cpu", dtype="float32")


def _align(helper: Path, data: Path, out: Path) -> list[dict]:
    from typer.testing import CliRunner

    from codila_cli.cli import app

    r = CliRunner().invoke(app, ["train", "align", "--dlm", str(LLADA), "--ar", str(helper), "--data", str(data),
                                 "--glob", "*.txt", "--output", str(out), "--steps", "3", "--seq-len", "48",
                                 "--blocks-per-row", "3", "--batch", "4", "--lr", "3e-3", "--warmup", "2",
                                 "--select-decoding", "0", "--valid-rows", "4", "--seed", "0"])
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in (out / "training" / "log.jsonl").read_text().splitlines()]


def test_train_align_takes_a_llada_dlm_and_a_helper_of_other_ids(tmp_path):
    """`codila train align` on LLaDA (no shift: hidden row i gives token i) with a helper bridged by token
    strings trains as the same helper under the DLM's own ids does: the losses agree (a relabelling of the
    helper's vocabulary changes only the order of its sums), and the helper it writes decodes."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(12):
        (data / f"f{i}.txt").write_text(" ".join(f"def f{i}(x{j}): return x{j} + {j}" for j in range(30)))
    perm = torch.randperm(512, generator=torch.Generator().manual_seed(2)).tolist()
    same = _align(_helper(tmp_path / "same"), data, tmp_path / "a")
    other = _align(_helper(tmp_path / "other", perm), data, tmp_path / "b")
    losses = [(x["loss"], y["loss"]) for x, y in zip(same, other) if "loss" in x]
    assert len(losses) == 3 and all(abs(x - y) <= 1e-4 * max(1.0, abs(x)) for x, y in losses), losses
    r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(LLADA), "--ar", str(tmp_path / "b"),
                        "--max-new-tokens", "16", "--seed", "0", "--json", "def f(x):"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["ar_forwards"] >= 1


def _relabelled_bundled_helper(out: Path) -> Path:
    """The bundled AR helper with its ordinary ids relabelled (tokenizer and embedding rows together): the
    same model under other ids, so it pairs with the bundled infill model by token strings only."""
    from safetensors.torch import load_file, save_file

    from codila_cli.models.registry import bundled_path

    src = bundled_path("bundled-ar")
    shutil.copytree(src, out)
    tok = json.loads((src / "tokenizer.json").read_text())
    first = 1 + max(a["id"] for a in tok["added_tokens"])
    n = len(tok["model"]["vocab"])
    perm = (first + torch.randperm(n - first, generator=torch.Generator().manual_seed(3))).tolist()
    new_of = {first + i: p for i, p in enumerate(perm)}  # old id -> new id
    tok["model"]["vocab"] = {t: new_of.get(i, i) for t, i in tok["model"]["vocab"].items()}
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    weights = load_file(str(src / "model.safetensors"))
    index = torch.arange(n)
    index[torch.tensor(perm)] = torch.arange(first, n)  # new row perm[i] holds old row first + i
    for name, w in weights.items():
        if w.shape[0] == n and name.endswith(("embed_tokens.weight", "lm_head.weight")):
            weights[name] = w[index].contiguous()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("helper", ["bundled-ar", "relabelled"])
def test_infill_says_when_its_helper_is_paired_by_token_strings(tmp_path, helper):
    """`infill --decoder codila` with a helper of other token ids warns, as gen does, and `--json` says how
    the pair was made; the bundled helper (the DLM's own ids, aligned to the DLM the bundled infill model
    was fine-tuned from) runs without a warning."""
    ar = str(_relabelled_bundled_helper(tmp_path / "h")) if helper == "relabelled" else helper
    r = subprocess.run([sys.executable, "-m", "codila_cli", "infill", "-", "--language", "python", "--decoder",
                        "codila", "--ar", ar, "--seed", "0", "--json", "--max-middle-tokens", "8"],
                       input="def f(x):\n    # codila: fill\n    return y\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    bridge = json.loads(r.stdout)["models"]["ar"]["bridge"]
    if helper == "relabelled":
        assert bridge == {"by": "strings", "coverage": 1.0}
        assert "pairs their tokens by string (100% of the DLM's tokens" in r.stderr, r.stderr
    else:
        assert bridge["by"] == "ids" and bridge["coverage"] >= 0.99
        assert "Warning" not in r.stderr, r.stderr  # the bundled pair is made to go together
