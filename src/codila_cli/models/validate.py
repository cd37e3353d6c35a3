"""A checkpoint's config checked before a network is built from it, and against its weights' headers
before they are loaded (issue 60: ``n_layers: 1000000`` ran 150 s with no message, ``d_model: 10^9``
took 2.2 GiB before failing, and 23 hostile folders got "internal error" with tensor-size dumps).

Each problem is one :class:`ModelLoadError` (exit 1) naming the model, its folder and the field or the
tensor; nothing here loads a weight: :func:`weight_headers` reads each safetensors file's JSON header
only (its first 8 bytes give the header's length)."""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any

from codila_cli.errors import ModelLoadError

# config fields that are sizes, by meaning: (names in the families' configs, largest value accepted)
WIDTH = (("hidden_size", "d_model", "n_embd"), 1 << 17)
LAYERS = (("num_hidden_layers", "n_layers", "n_layer"), 4096)
HEADS = (("num_attention_heads", "n_heads", "n_head"), 4096)
KV_HEADS = (("num_key_value_heads", "n_kv_heads"), 4096)
VOCAB = (("vocab_size", "embedding_size"), 1 << 24)
MLP = (("intermediate_size", "mlp_hidden_size"), 1 << 20)
OTHER = ((("head_dim",), 1 << 14), (("max_position_embeddings", "max_sequence_length"), 1 << 24),
         (("block_size",), 1 << 24))  # SDAR's block; some other configs name their context so
# the families codila builds itself need these (transformers fills defaults for the helpers it builds)
REQUIRED = {"dream": (WIDTH, LAYERS, HEADS, VOCAB, MLP), "qwen2": (WIDTH, LAYERS, HEADS, VOCAB, MLP),
            "qwen3": (WIDTH, LAYERS, HEADS, VOCAB, MLP), "sdar": (WIDTH, LAYERS, HEADS, VOCAB, MLP),
            "llama": (WIDTH, LAYERS, HEADS, VOCAB, MLP),
            "llada": (WIDTH, LAYERS, HEADS, VOCAB)}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
HEADER_LIMIT = 100 * 2**20  # bytes of one safetensors header (a 7B checkpoint's is about 100 kB)


def _fail(name: str, path: Path, what: str, hint: str = "the checkpoint's config.json is wrong: fix it or copy "
          "the model again") -> ModelLoadError:
    where = f"'{name}'" if Path(name).expanduser().resolve() == path.resolve() else f"'{name}' ({path})"
    return ModelLoadError(f"{where}: {what}", hint=hint)


def _size(cfg: dict, names: tuple[str, ...], limit: int, *, name: str, path: Path) -> int | None:
    """The first of ``names`` the config sets (null counts as unset), checked to be a whole number in
    1..``limit``; None when none is set."""
    for field in names:
        value = cfg.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(name, path, f"config.json's {field} is {json.dumps(value)[:40]}, not a whole number")
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise _fail(name, path, f"config.json's {field} is {value}, not a whole number")
        if not 1 <= value <= limit:
            raise _fail(name, path, f"config.json's {field} is {int(value)}; it must be between 1 and {limit}")
        return int(value)
    return None


def check_config(cfg: dict, *, name: str, path: Path) -> None:
    """Every size in ``cfg`` a whole number in range, the ones its family needs present, and the heads
    dividing the width (unless ``head_dim`` says otherwise) and shared by the key/value heads."""
    kind = str(cfg.get("model_type", "")).lower()
    for names, limit in (WIDTH, LAYERS, HEADS, KV_HEADS, VOCAB, MLP, *OTHER):
        for field in names:  # each spelling on its own: a family may set two (LLaDA's vocab and embedding)
            _size(cfg, (field,), limit, name=name, path=path)
    for names, _ in REQUIRED.get(kind, ()):
        if all(cfg.get(f) is None for f in names):
            raise _fail(name, path, f"config.json has no {names[0] if kind != 'llada' else _llada(names)}")
    width = _size(cfg, *WIDTH, name=name, path=path)
    heads = _size(cfg, *HEADS, name=name, path=path)
    kv = _size(cfg, *KV_HEADS, name=name, path=path)
    if kind == "llada" and cfg.get("mlp_hidden_size") is None and width is not None:
        ratio = cfg.get("mlp_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, int) or not 1 <= ratio <= 64:
            raise _fail(name, path, f"config.json's mlp_ratio is {json.dumps(ratio)[:40]}, not a whole number 1–64")
    if width and heads and cfg.get("head_dim") is None and width % heads:
        raise _fail(name, path, f"config.json's {_which(cfg, WIDTH)} {width} is not a multiple of its "
                                f"{_which(cfg, HEADS)} {heads}")
    if heads and kv and heads % kv:
        raise _fail(name, path, f"config.json's {_which(cfg, HEADS)} {heads} is not a multiple of its "
                                f"{_which(cfg, KV_HEADS)} {kv}")


def _which(cfg: dict, group: tuple) -> str:
    return next((f for f in group[0] if cfg.get(f) is not None), group[0][0])


def _llada(names: tuple[str, ...]) -> str:
    return {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads"}.get(
        names[0], names[0])


def weight_headers(files: list[Path], *, name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (safetensors dtype, shape)} over ``files``, from their headers alone."""
    from codila_cli.models.files import open_regular

    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        fd = open_regular(file, name=name)
        with open(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 2 <= n <= min(HEADER_LIMIT, size - 8):
                raise ModelLoadError(f"'{name}': weight file {file.name} is damaged or truncated (no safetensors header)",
                                     hint="delete it from the cache and download the model again")
            try:
                header = json.loads(fh.read(n).decode("utf-8"))
            except (ValueError, UnicodeDecodeError, RecursionError):
                header = None
        if not isinstance(header, dict):
            raise ModelLoadError(f"'{name}': weight file {file.name} has a damaged header",
                                 hint="delete it from the cache and download the model again")
        for key, info in header.items():
            if key == "__metadata__":
                continue
            shape = info.get("shape") if isinstance(info, dict) else None
            if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                    for d in shape)):
                raise ModelLoadError(f"'{name}': weight file {file.name} has a damaged entry for {key[:80]}",
                                     hint="delete it from the cache and download the model again")
            out[key] = (str(info.get("dtype")), tuple(shape))
    return out


_LAYER = re.compile(r"\.(?:layers|blocks|h)\.(\d+)\.")


def check_weights_against_config(cfg: dict, files: list[Path], *, name: str, path: Path) -> None:
    """The weights' headers against the config, before anything is loaded or built: the floating dtype
    of every weight, the number of layers, and the embedding's rows and width."""
    headers = weight_headers(files, name=name)
    bad = next(((k, d) for k, (d, _) in sorted(headers.items()) if k.endswith((".weight", ".bias"))
                and d not in FLOAT_DTYPES), None)
    if bad:
        raise _fail(name, path, f"tensor {bad[0]} is stored as {bad[1]}; codila loads weights stored as "
                                f"{', '.join(FLOAT_DTYPES)}", hint="the checkpoint is damaged or quantized in a format "
                                "codila does not read: use the original weights")
    layers = _size(cfg, *LAYERS, name=name, path=path)
    found = {int(m.group(1)) for k in headers if (m := _LAYER.search(k))}
    if layers is not None and found and found != set(range(layers)):
        have = f"{len(found)} layers" if found == set(range(len(found))) else f"layers {sorted(found)[:6]}…"
        raise _fail(name, path, f"config.json's {_which(cfg, LAYERS)} is {layers}, but the weights hold {have}")
    width = _size(cfg, *WIDTH, name=name, path=path)
    embed = next((k for k in sorted(headers) if k.endswith(("embed_tokens.weight", "wte.weight"))), None)
    if embed is None or width is None:
        return
    shape = headers[embed][1]
    rows = _size(cfg, ("embedding_size",), VOCAB[1], name=name, path=path) or _size(cfg, ("vocab_size",), VOCAB[1],
                                                                                   name=name, path=path)
    if len(shape) != 2 or shape[1] != width:
        raise _fail(name, path, f"config.json's {_which(cfg, WIDTH)} is {width}, but the embedding {embed} has "
                                f"shape {list(shape)}")
    if rows is not None and shape[0] != rows:
        field = "embedding_size" if cfg.get("embedding_size") is not None else "vocab_size"
        raise _fail(name, path, f"config.json's {field} is {rows}, but the embedding {embed} has {shape[0]} rows")


def check_shapes(model: Any, state: dict, *, name: str, path: Path) -> None:
    """Every loaded tensor's shape against the network the config built (on the meta device): the first
    that differs, in one line (loading it would fail with a dump of every mismatch)."""
    expected = model.state_dict()
    for key in sorted(state):
        want = expected.get(key)
        if want is not None and tuple(want.shape) != tuple(state[key].shape):
            raise _fail(name, path, f"tensor {key} has shape {list(state[key].shape)}, but the config makes it "
                                    f"{list(want.shape)}", hint="the weights and config.json belong to different "
                                    "models: copy the model again")


def read_config(path: Path, *, name: str) -> dict:
    """``path``'s config.json, read safely (models/files.py) and checked (:func:`check_config`): a size that
    is not a positive whole number, or heads that do not divide the width, are refused here, naming the
    field, before any network is built from them. (models/loading.py re-exports it.)"""
    from codila_cli.models.files import read_json

    cfg = read_json(path / "config.json", name=name, limit=16 * 2**20)
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ModelLoadError(f"'{name}': config.json has no model_type", hint="is this a Hugging Face model directory?")
    check_config(cfg, name=name, path=path)
    return cfg
