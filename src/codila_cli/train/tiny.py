"""Tiny random checkpoints in the real Hugging Face layouts, for tests and the quick-start fixture.

    python -m codila_cli.train.tiny OUT_DIR

writes OUT_DIR/dlm (Dream layout), OUT_DIR/ar (Qwen3 layout) sharing one small BPE tokenizer, and
OUT_DIR/hub (a fake Hugging Face cache tree ``models--codila--tiny-dream/snapshots/<rev>/``).
"""

from __future__ import annotations

import inspect
import shutil
import sys
from pathlib import Path


def _sample_texts() -> list[str]:
    import argparse
    import json
    import textwrap

    texts = [inspect.getsource(m) for m in (textwrap, json.decoder, argparse)]
    texts += ["def f(x):\n    return x + 1\n", "class A:\n    pass\n"]
    return texts


def build_tiny(out: Path, *, seed: int = 0, vocab_size: int = 400, hidden: int = 32, layers: int = 2) -> dict[str, Path]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from codila_cli.models.export import save_checkpoint
    from codila_cli.train.tokenizer import BOS, EOS, MASK, save_tokenizer, train_tokenizer

    tok = train_tokenizer(_sample_texts(), vocab_size=vocab_size)
    vocab = tok.get_vocab_size()
    ids = {"eos": tok.token_to_id(EOS), "pad": tok.token_to_id(EOS), "bos": tok.token_to_id(BOS),
           "mask": tok.token_to_id(MASK)}
    torch.manual_seed(seed)
    common = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    dlm = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))
    ar = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=hidden // 4, tie_word_embeddings=True))
    paths = {"dlm": out / "dlm", "ar": out / "ar"}
    save_checkpoint(dlm, paths["dlm"], dream=True, specials=ids)
    save_checkpoint(ar, paths["ar"], dream=False, specials={k: v for k, v in ids.items() if k != "mask"})
    for p in paths.values():
        save_tokenizer(tok, p)
    snap = out / "hub" / "models--codila--tiny-dream" / "snapshots" / ("0" * 40)
    if snap.exists():
        shutil.rmtree(snap)
    shutil.copytree(paths["dlm"], snap)
    (out / "hub" / "models--codila--tiny-dream" / "refs").mkdir(parents=True, exist_ok=True)
    (out / "hub" / "models--codila--tiny-dream" / "refs" / "main").write_text("0" * 40)
    paths["hub"] = out / "hub"
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-models")
    for k, v in build_tiny(target).items():
        print(f"{k}: {v}")
