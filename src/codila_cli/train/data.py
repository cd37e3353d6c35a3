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


def tokenize_split(jsonl: Path, tokenizer_file: Path, out: Path, *, bos: int, eos: int,
                   bare_body: str = "as-written") -> TokenData:
    """The file stream and the function samples of one split. ``bare_body`` ``code`` (the helper's
    ``ar`` stage, session 19): a function sample with a docstring is also kept a second time without
    it (signature, then code), so after a bare signature code is as likely as a docstring."""
    from tokenizers import Tokenizer

    from codila_cli.train.corpus import split_function

    if bare_body not in BARE_BODIES:
        raise ValueError(f"bare_body must be one of {', '.join(BARE_BODIES)}, got {bare_body!r}")
    tok = Tokenizer.from_file(str(tokenizer_file))
    files, funcs = [], []
    with open(jsonl, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            (files if row["kind"] == "file" else funcs).append(row["text"])
    if bare_body == "code":
        cuts = (split_function(f, keep_docstring=False, drop_docstring=True) for f in funcs)
        funcs += [c[0] + c[1] for c, f in zip(cuts, funcs) if c is not None and c[0] + c[1] != f]  # lost a docstring
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


@dataclass
class PromptedData:
    """Function samples split into (prompt, body) token spans, for prompt-conditioned training."""

    prompt_tokens: np.ndarray
    prompt_offsets: np.ndarray
    body_tokens: np.ndarray
    body_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt_offsets) - 1

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.prompt_tokens[self.prompt_offsets[i] : self.prompt_offsets[i + 1]],
                self.body_tokens[self.body_offsets[i] : self.body_offsets[i + 1]])


BARE_BODIES = ("as-written", "code")


def tokenize_prompted(jsonl: Path, tokenizer_file: Path, out: Path, *, bare_body: str = "as-written") -> PromptedData:
    """Each function sample gives up to two examples: signature + docstring → rest, and signature → rest.
    Prompt and body are encoded separately, exactly as a prompt is encoded at generation time.

    ``bare_body``: what follows a bare signature: ``as-written`` (its docstring, then the code, as the
    corpus has it) or ``code`` (the code only: the docstring is dropped from that example)."""
    from tokenizers import Tokenizer

    from codila_cli.train.corpus import split_function

    if bare_body not in BARE_BODIES:
        raise ValueError(f"bare_body must be one of {', '.join(BARE_BODIES)}, got {bare_body!r}")
    tok = Tokenizer.from_file(str(tokenizer_file))
    prompts, bodies = [], []
    with open(jsonl, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["kind"] != "function":
                continue
            variants = {split_function(row["text"]),
                        split_function(row["text"], keep_docstring=False, drop_docstring=bare_body == "code")}
            for v in sorted(v for v in variants if v is not None):
                prompts.append(v[0])
                bodies.append(v[1])

    def pack(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        toks, offs = [], [0]
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            toks += enc.ids
            offs.append(len(toks))
        return np.asarray(toks, np.int32), np.asarray(offs, np.int64)

    data = PromptedData(*pack(prompts), *pack(bodies))
    np.savez(out, prompt_tokens=data.prompt_tokens, prompt_offsets=data.prompt_offsets,
             body_tokens=data.body_tokens, body_offsets=data.body_offsets)
    return data


def load_prompted(path: Path) -> PromptedData:
    z = np.load(path)
    return PromptedData(z["prompt_tokens"], z["prompt_offsets"], z["body_tokens"], z["body_offsets"])


def sample_prompted(data: PromptedData, *, rows: np.ndarray, seq_len: int, canvas: int, bos: int,
                    eos: int) -> tuple[np.ndarray, np.ndarray]:
    """([n, seq_len] ids, [n, seq_len] maskable). Row = bos + prompt + canvas, where the canvas holds the
    body, then end-of-text up to ``canvas`` positions (what `codila gen` fills after a prompt); only the
    canvas is maskable. Everything after the canvas is end-of-text and stays visible."""
    n = len(rows)
    x = np.full((n, seq_len), eos, np.int32)
    m = np.zeros((n, seq_len), bool)
    x[:, 0] = bos
    for r, i in enumerate(rows):
        prompt, body = data.pair(int(i))
        prompt = prompt[-(seq_len - 1 - min(canvas, 16)) :]  # keep the prompt's end: it borders the canvas
        start = 1 + len(prompt)
        x[r, 1:start] = prompt
        width = min(canvas, seq_len - start)
        fill = body[:width]
        x[r, start : start + len(fill)] = fill
        m[r, start : start + width] = True
    return x, m
