"""Token arrays and deterministic batch sampling for training.

The corpus JSONL is tokenised once into ``tokens.npz`` in the run directory:
``stream`` (all files, each as ``bos … eos``, concatenated) and ``functions`` (each function sample's
token span). Batch ``s`` depends only on (seed, s), so a resumed run sees exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class TokenData:
    stream: np.ndarray  # [T] int32 token ids of all files
    func_tokens: np.ndarray  # [F_total] int32 ids of all function samples, concatenated
    func_offsets: np.ndarray  # [F+1] int64 offsets into func_tokens

    @property
    def n_functions(self) -> int:
        return len(self.func_offsets) - 1


def tokenize_split(jsonl: Path, tokenizer_file: Path, out: Path, *, bos: int, eos: int) -> TokenData:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    files, funcs = [], []
    with open(jsonl, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            (files if row["kind"] == "file" else funcs).append(row["text"])
    stream: list[int] = []
    for enc in tok.encode_batch(files, add_special_tokens=False):
        stream += [bos, *enc.ids, eos]
    offsets, ftoks = [0], []
    for enc in tok.encode_batch(funcs, add_special_tokens=False):
        ftoks += enc.ids
        offsets.append(len(ftoks))
    data = TokenData(np.asarray(stream, np.int32), np.asarray(ftoks, np.int32), np.asarray(offsets, np.int64))
    np.savez(out, stream=data.stream, func_tokens=data.func_tokens, func_offsets=data.func_offsets)
    return data


def load_tokens(path: Path) -> TokenData:
    z = np.load(path)
    return TokenData(z["stream"], z["func_tokens"], z["func_offsets"])


def sample_batch(data: TokenData, *, step: int, seed: int, batch: int, seq_len: int, bos: int, eos: int,
                 function_share: float = 0.5) -> np.ndarray:
    """[batch, seq_len] ids. A row is either a window of the file stream (``bos`` + text) or one function
    sample (``bos`` + function + ``eos`` padding: teaches the model to end a unit)."""
    rng = np.random.default_rng([seed, step])
    out = np.full((batch, seq_len), eos, np.int32)
    out[:, 0] = bos
    for r in range(batch):
        if data.n_functions and rng.random() < function_share:
            f = int(rng.integers(data.n_functions))
            ids = data.func_tokens[data.func_offsets[f] : data.func_offsets[f + 1]][: seq_len - 1]
            out[r, 1 : 1 + len(ids)] = ids
        else:
            start = int(rng.integers(0, max(1, len(data.stream) - seq_len)))
            ids = data.stream[start : start + seq_len - 1]
            out[r, 1 : 1 + len(ids)] = ids
    return out
