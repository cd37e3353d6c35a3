"""Byte-level BPE for the bundled models, shared by the DLM and the AR helper (exact CoDiLA bridge).

Token-boundary trap (issue 4): with the GPT-2 split, ``"\\n    return"`` becomes ``"\\n   "`` +
``" return"``, so a prompt ending in ``"\\n"`` stops at a boundary never seen in training. Here every
newline is its own pre-token and the indentation at the start of a line is another, so ``"\\n"``,
``"    "`` and ``"return"`` are always separate tokens: a prompt ending in a newline or in indentation
ends exactly where training text has a token boundary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

EOS = "<|endoftext|>"  # end of text, padding, and DreamOn's delete state
BOS = "<|beginoftext|>"
MASK = "<|mask|>"
EXPAND = "<|expand|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SPECIALS = [EOS, BOS, MASK, EXPAND, THINK_OPEN, THINK_CLOSE]


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"^[ \t]+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 8192, min_frequency: int = 2):
    """Train the BPE; special tokens get ids 0..5 in the order of SPECIALS."""
    from tokenizers import Tokenizer, decoders, models, trainers
    from tokenizers.pre_tokenizers import ByteLevel

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS,
        initial_alphabet=ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, directory: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json in the Hugging Face layout."""
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "mask_token": MASK,
        "model_max_length": 100000,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
