"""``codila train align``: the CoDiLA helper for any DLM / AR pair (docs/training.md).

    codila train align --dlm dream-coder --ar qwen3-0.6b --data ./src --output ./my-helper
    torchrun --nproc-per-node 8 -m codila_cli.train.align --dlm … --ar … --data … --output …

Everything a run can get wrong is checked before a model loads (:func:`check`, then :func:`inspect_pair`
on the tokenizers alone, then the data): bad input is a UsageError (exit 2). The run itself is
:func:`codila_cli.train.align.trainer.train`; the output directory gets the helper in its Hugging Face layout
plus ``training/`` (checkpoint, data arrays, log.jsonl, loss.png).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from codila_cli.errors import CodilaError, UsageError
from codila_cli.train.align.loss import WEIGHTINGS

OPTIMIZERS = ("adamw", "adamw8bit")


@dataclass(frozen=True)
class AlignConfig:
    """One alignment run; every field is one ``codila train align`` flag."""

    dlm: str
    ar: str
    data: str
    output: Path
    field: str = "text"
    glob: str = "**/*.py"
    block_sizes: tuple[int, ...] = (2, 4, 8)
    steps: int = 1000
    batch: int = 8  # rows per optimizer step, over all ranks and micro-batches
    grad_accum: int = 1
    lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seq_len: int = 1024
    blocks_per_row: int = 8
    context: int = 0  # most committed left-context tokens the helper reads (0 = none)
    context_share: float = 0.5  # share of (non-frontier) blocks that get their context
    frontier: float = 0.0
    weighting: str = "nelbo"
    seed: int = 0
    valid_fraction: float = 0.02
    valid_every: int = 200
    valid_rows: int = 16
    ckpt_every: int = 200
    device: str = "auto"
    dtype: str = "auto"  # the frozen DLM's: auto = bf16 on CUDA, fp32 on a CPU
    grad_checkpointing: bool | None = None  # None: on for CUDA
    optimizer: str = "adamw"
    resume: bool = False
    select_decoding: int = 24  # validation prompts for choosing codila_decoding (0: skip)
    marginals_cache: Path | None = None  # top-k block marginals on disk (cache.py); None: none
    marginals_top_k: int = 64

    def __post_init__(self) -> None:
        def positive(name: str, value: float) -> None:
            if value < 1:
                raise UsageError(f"--{name} must be >= 1, got {value}", hint=f"e.g. --{name} 8")

        for name in ("steps", "batch", "grad_accum", "seq_len", "blocks_per_row", "valid_every", "ckpt_every",
                     "valid_rows", "marginals_top_k"):
            positive(name.replace("_", "-"), getattr(self, name))
        if not self.block_sizes or any(b < 1 for b in self.block_sizes):
            raise UsageError(f"--block-sizes must be positive integers, got {self.block_sizes}", hint="e.g. --block-sizes 2,4,8")
        if 2 * max(self.block_sizes) + 10 > self.seq_len:
            raise UsageError(f"--seq-len {self.seq_len} is too short for block size {max(self.block_sizes)}",
                             hint=f"use --seq-len {4 * max(self.block_sizes) + 16} or more")
        if not 0.0 < self.lr <= 1.0:
            raise UsageError(f"--lr must be in (0, 1], got {self.lr}", hint="e.g. --lr 1e-4")
        for name in ("frontier", "context_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 1, got {getattr(self, name)}",
                                 hint="e.g. 0.5")
        if not 0 <= self.context <= self.seq_len:
            raise UsageError(f"--context must be between 0 and --seq-len, got {self.context}", hint="e.g. --context 96")
        if not 0.0 < self.valid_fraction < 0.5:
            raise UsageError(f"--valid-fraction must be in (0, 0.5), got {self.valid_fraction}", hint="e.g. 0.02")
        if self.weighting not in WEIGHTINGS:
            raise UsageError(f"--weighting must be one of {', '.join(WEIGHTINGS)}", hint="nelbo is the paper's Eq. 2")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}", hint="adamw")
        if self.warmup < 0 or self.select_decoding < 0 or self.weight_decay < 0:
            raise UsageError("--warmup, --weight-decay and --select-decoding must be >= 0", hint="e.g. --warmup 100")
        if not self.grad_clip > 0:
            raise UsageError(f"--grad-clip must be > 0, got {self.grad_clip}", hint="e.g. --grad-clip 1.0")

    @property
    def state_dir(self) -> Path:
        return self.output / "training"

    def fingerprint(self) -> dict:
        """What a resumed run must share with the run it continues (``--steps`` may grow)."""
        keep = ("dlm", "ar", "data", "field", "glob", "block_sizes", "batch", "seq_len", "blocks_per_row", "context",
                "context_share", "frontier", "weighting", "seed", "valid_fraction")
        d = asdict(self)
        out = {k: (list(d[k]) if isinstance(d[k], tuple) else d[k]) for k in keep}
        if self.marginals_cache is not None:  # the truncation changes the objective
            out["marginals_top_k"] = self.marginals_top_k
        return out


def parse_block_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--block-sizes {text!r} is not a comma-separated list of integers",
                         hint="e.g. --block-sizes 2,4,8") from None
    return tuple(sorted(set(sizes)))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _writable_dir(flag: str, path: Path) -> None:
    """Raise a UsageError naming ``flag`` unless the directory ``path`` exists writable or can be
    created; nothing is created here (a run refused later leaves no empty directory)."""
    from codila_cli.atomic import creatable_dir_problem

    problem = creatable_dir_problem(path)
    if problem:
        raise UsageError(f"{flag} {path} is not writable ({problem})", hint="give a directory you can write to")


def check(cfg: AlignConfig, *, world: int | None = None) -> None:
    """Flags against each other, the output directory, the resume state: no model, no data read.
    ``world``: the number of processes (default: torchrun's WORLD_SIZE, else 1)."""
    world = world or world_size()
    if cfg.batch % (world * cfg.grad_accum):
        raise UsageError(f"--batch {cfg.batch} is not a multiple of processes × --grad-accum ({world} × {cfg.grad_accum})",
                         hint=f"use --batch {world * cfg.grad_accum * max(1, cfg.batch // (world * cfg.grad_accum))}")
    out = cfg.output
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {out} exists and is not a directory", hint="give a directory (created if missing)")
    _writable_dir("--output", out)
    if cfg.marginals_cache is not None:
        _writable_dir("--marginals-cache", cfg.marginals_cache)
    ckpt = cfg.state_dir / "ckpt.pt"
    if ckpt.exists() and not cfg.resume:
        raise UsageError(f"{out} holds a training run already", hint="add --resume to continue it, or give another --output")
    if cfg.resume and not ckpt.exists():
        raise UsageError(f"--resume: {out} holds no training checkpoint", hint="drop --resume to start a new run")
    if cfg.resume:
        saved = json.loads((cfg.state_dir / "run.json").read_text(encoding="utf-8")) if (cfg.state_dir / "run.json").is_file() else {}
        changed = sorted(k for k, v in cfg.fingerprint().items() if saved.get(k, v) != v)
        if changed:
            raise UsageError(f"--resume with other settings than the run it continues: {', '.join(changed)}",
                             hint="use the original settings (training/run.json), or another --output")


@dataclass(frozen=True)
class Pair:
    """The two checkpoints, resolved and inspected (tokenizers only, no weights)."""

    dlm_path: Path
    ar_path: Path
    dlm_identity: dict
    ar_identity: dict
    dlm_tokenizer: Any
    dlm_specials: Any
    ar_specials: Any
    bridge: Any


def inspect_pair(cfg: AlignConfig) -> Pair:
    """Resolve both specs like `codila gen`, and check what CoDiLA needs from their tokenizers."""
    from codila_cli.models.cache import identity, resolve_local_dirs
    from codila_cli.models.families import families, family_of
    from codila_cli.models.loading import engine_for, read_config
    from codila_cli.models.registry import resolve_spec
    from codila_cli.models.token_map import bridge_between
    from codila_cli.models.tokens import load_tokenizer, resolve_special_tokens

    dspec, aspec = resolve_spec(cfg.dlm, kind="dlm"), resolve_spec(cfg.ar, kind="ar")
    dpath, apath = resolve_local_dirs([dspec, aspec])  # one error naming every missing model, as gen's
    if cfg.output.resolve() in (dpath.resolve(), apath.resolve()):
        raise UsageError("--output is one of the models' own directories", hint="give a new directory")
    dcfg, acfg = read_config(dpath, name=cfg.dlm), read_config(apath, name=cfg.ar)
    family = family_of(dcfg)
    if family is None or not family.aligns:
        what = f"a {family.name} model" if family is not None else f"a '{dcfg.get('model_type')}' model"
        can = ", ".join(f.name for f in families() if f.aligns)
        raise UsageError(f"--dlm {cfg.dlm} is {what}, not a DLM that `train align` trains a helper for ({can})",
                         hint="give a whole-canvas diffusion model, e.g. dream-coder")
    if family_of(acfg) is not None:
        raise UsageError(f"--ar {cfg.ar} is a diffusion model", hint="give an autoregressive helper, e.g. qwen3-0.6b")
    dtok = load_tokenizer(dpath, name=cfg.dlm, native=engine_for(dpath, dcfg) == "native")
    atok = load_tokenizer(apath, name=cfg.ar, native=engine_for(apath, acfg) == "native")
    try:
        dspecials = resolve_special_tokens(dtok, dcfg, require_mask=True, name=cfg.dlm)
        aspecials = resolve_special_tokens(atok, acfg, require_mask=False, name=cfg.ar)
        sides = {"dlm_tokenizer": dtok, "ar_tokenizer": atok, "dlm_specials": dspecials, "ar_specials": aspecials,
                 "dlm_vocab_rows": int(dcfg.get("embedding_size") or dcfg.get("vocab_size") or len(dtok)),
                 "ar_vocab_rows": int(acfg.get("vocab_size", len(atok))), "dlm_name": cfg.dlm, "ar_name": cfg.ar}
        bridge = bridge_between(**sides)  # equal ids, else equal token strings
    except CodilaError as exc:  # no mask token, tokenizers that share too few ids: exit 1 as in gen (docs/exit-codes.md)
        raise type(exc)(exc.message, hint=exc.hint or "choose another pair") from None
    return Pair(dpath, apath, identity(dspec, dpath), identity(aspec, apath), dtok, dspecials, aspecials, bridge)


def prepare_data(cfg: AlignConfig, pair: Pair, *, main: bool = True) -> dict:
    """Tokenise the source once into ``training/data/{train,valid}.npy`` (the DLM's tokenizer; each
    document followed by end-of-text); the held-out split is chosen per document by its hash. Reused
    when the source and tokenizer are unchanged. Rank 0 writes; the others wait for it."""
    import numpy as np

    from codila_cli.models.tokens import encode_long
    from codila_cli.train.sources import documents, is_valid_document, parse_source

    src = parse_source(cfg.data, field=cfg.field, glob=cfg.glob)
    data_dir = cfg.state_dir / "data"
    meta_file = data_dir / "meta.json"
    key = {"source": src.describe(), "tokenizer": str(pair.dlm_path), "valid_fraction": cfg.valid_fraction}
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if meta.get("key") == key:
            return meta
    if not main:
        raise CodilaError("rank 0 did not prepare the data", hint="run all ranks with the same arguments")
    eos = pair.dlm_specials.eos
    streams: dict[str, list] = {"train": [], "valid": []}
    digest = hashlib.sha256()
    counts = {"train": 0, "valid": 0}
    for text in documents(src):
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
        split = "valid" if is_valid_document(text, cfg.valid_fraction) else "train"
        ids = encode_long(pair.dlm_tokenizer, text)  # "<|endoftext|>" in a file is text, as at inference
        streams[split].append(np.asarray([*ids, eos], np.int32))
        counts[split] += 1
    if counts["train"] + counts["valid"] == 0:
        raise UsageError(f"--data {cfg.data} holds no documents", hint="check the path, --glob or --field")
    if counts["valid"] == 0 or counts["train"] == 0:  # too few documents for the hash split: hold out the last
        moved = streams["train"] or streams["valid"]
        if len(moved) < 2:
            raise UsageError(f"--data {cfg.data} holds a single document", hint="give at least two documents")
        streams = {"train": moved[:-1], "valid": moved[-1:]}
        counts = {"train": len(moved) - 1, "valid": 1}
    data_dir.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for split, parts in streams.items():
        arr = np.concatenate(parts)
        sizes[split] = int(arr.size)
        tmp = data_dir / f".{split}.npy.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, arr)
        os.replace(tmp, data_dir / f"{split}.npy")
    if sizes["train"] < cfg.seq_len:
        raise UsageError(f"--data {cfg.data} has {sizes['train']} training tokens, fewer than --seq-len {cfg.seq_len}",
                         hint="give more data or a shorter --seq-len")
    meta = {"key": key, "hash": digest.hexdigest(), "documents": counts, "tokens": sizes, "source": src.describe()}
    tmp = data_dir / ".meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, meta_file)
    return meta


def preflight(cfg: AlignConfig, *, world: int | None = None) -> Pair:
    """Everything checkable before a model loads: flags, output, resume state, the data source, and the
    pair's tokenizers (UsageError, exit 2; a model missing from the cache is exit 3)."""
    from codila_cli.train.sources import parse_source

    check(cfg, world=world)
    parse_source(cfg.data, field=cfg.field, glob=cfg.glob)
    return inspect_pair(cfg)


def run(cfg: AlignConfig, *, on_log: Any = None) -> dict:
    """Check, inspect, prepare, train, save: the whole command (also under torchrun)."""
    from codila_cli.eval.distributed import finish, init_from_env
    from codila_cli.train.align.trainer import train

    pair = preflight(cfg)
    shard = init_from_env()
    try:
        if shard.main:
            cfg.state_dir.mkdir(parents=True, exist_ok=True)
            meta = prepare_data(cfg, pair)
        if shard.world > 1:
            import torch.distributed as dist

            dist.barrier()
        if not shard.main:
            meta = prepare_data(cfg, pair, main=False)
        return train(cfg, pair, meta, shard=shard, on_log=on_log)
    finally:
        finish()
