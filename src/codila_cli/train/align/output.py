"""What ``codila train align`` leaves behind: a helper directory ``--ar`` loads (Hugging Face layout:
safetensors, the helper's tokenizer files, config.json with ``codila_training`` provenance and the
``codila_decoding`` settings measured best on held-out prompts), and the measurement behind them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SKIP = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}


def write_helper(cfg: Any, pair: Any, ar: Any, *, meta: dict, last: dict, decoding: dict) -> Path:
    """Write the helper into ``cfg.output``: weights in the source checkpoint's stored dtype, every
    other file of the source (tokenizer, generation config, chat template), and config.json last, so
    a directory with a config.json is always complete."""
    import torch
    from safetensors.torch import save_file

    from codila_cli.helper_card import write_card, write_config

    out = cfg.output
    src_cfg = json.loads((pair.ar_path / "config.json").read_text(encoding="utf-8"))
    stored = src_cfg.get("torch_dtype") or src_cfg.get("dtype") or "float32"
    dtype = getattr(torch, stored) if isinstance(stored, str) and hasattr(torch, stored) else torch.float32
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in ar.state_dict().items()}
    if src_cfg.get("tie_word_embeddings") and "lm_head.weight" in state:
        state.pop("lm_head.weight")  # tied: the loader ties it back to the input embedding
    for name in os.listdir(pair.ar_path):
        path = pair.ar_path / name
        if path.is_file() and name not in SKIP and not name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(path, out / f".{name}.tmp")
            os.replace(out / f".{name}.tmp", out / name)
    tmp = out / ".model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    training = {
        "objective": "codila-alignment", "dlm": pair.dlm_identity, "ar": pair.ar_identity,
        "data": {**meta["source"], "sha256": meta["hash"], "documents": meta["documents"], "tokens": meta["tokens"]},
        "steps": last.get("step"), "block_sizes": list(cfg.block_sizes), "batch": cfg.batch, "seq_len": cfg.seq_len,
        "lr": cfg.lr, "weighting": cfg.weighting, "context": cfg.context, "frontier": cfg.frontier, "seed": cfg.seed,
        "valid_block_ce": last.get("valid_by_block"), "selection": decoding.pop("_measured", None),
        "marginals_top_k": cfg.marginals_top_k if cfg.marginals_cache is not None else None,
    }
    # decoding {}: the source's recommendation was for another helper, so none is written
    write_config(out / "config.json", write_card(src_cfg, decoding=decoding, training=training))
    return out


def validation_prompts(cfg: Any, limit: int) -> list[str]:
    """Function prompts (signature + docstring) from held-out documents that parse as Python: top-level
    functions of 3 to 15 lines, whose bodies fit the 128-token canvas `codila gen` writes by default."""
    import ast

    from codila_cli.train.corpus import split_function
    from codila_cli.train.sources import documents, is_valid_document, parse_source

    prompts: list[str] = []
    for text in documents(parse_source(cfg.data, field=cfg.field, glob=cfg.glob)):
        if not is_valid_document(text, cfg.valid_fraction):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and 2 <= node.end_lineno - node.lineno <= 14:
                split = split_function("".join(lines[node.lineno - 1 - len(node.decorator_list) : node.end_lineno]))
                if split is not None:
                    prompts.append(split[0])
            if len(prompts) >= limit:
                return prompts
    return prompts


def select_decoding(cfg: Any, models: Any, pair: Any, device: Any) -> dict:
    """The CoDiLA settings with the most valid completions (parse, not empty, not repetitive) on
    held-out function prompts, over the block sizes trained × left context {0, --context}, 128-token
    canvases; ties go to the larger block (fewer forwards). Nothing is recommended (only ``_measured``
    is returned) when the held-out documents hold no such functions, when every setting scores the
    same, or when the best makes fewer than max(2, 10 %) of the prompts valid: a choice the measurement
    cannot support would override the library defaults for nothing."""
    from codila_cli.decoding.config import GEN_KNOBS, CodilaConfig
    from codila_cli.engine.generate import generate
    from codila_cli.engine.models import Models
    from codila_cli.eval.runner import repetitive
    from codila_cli.syntax import check_python

    prompts = validation_prompts(cfg, cfg.select_decoding)
    if not prompts:
        return {}
    models.ar.eval()
    runtime = Models(dlm=models.denoiser, ar=models.helper, bridge=pair.bridge)
    grid = [(b, c) for b in cfg.block_sizes for c in sorted({0, cfg.context})]
    window = GEN_KNOBS.default("candidate_blocks")  # without left context: the library's window
    scores = []
    for b, c in grid:
        config = CodilaConfig(max_new_tokens=128, block_size=b, candidate_blocks=1 if c else window, ar_context=c,
                              stop=("def ", "class ", "if __name__", "@"))
        valid = 0
        for p in prompts:
            text = generate(runtime, p, decoder="codila", config=config, seed=0).text
            body = text.strip()
            valid += bool(body) and check_python(p + text).valid and not repetitive(text)
        scores.append({"block_size": b, "ar_context": c, "candidate_blocks": config.candidate_blocks,
                       "valid": valid, "prompts": len(prompts)})
    return {**choose(scores, len(prompts)), "_measured": scores}


def choose(scores: list[dict], prompts: int) -> dict:
    """The recommendation a measurement supports (see :func:`select_decoding`), or {}."""
    best = max(scores, key=lambda s: (s["valid"], s["block_size"]))
    if best["valid"] < max(2, 0.1 * prompts) or len({s["valid"] for s in scores}) == 1:
        return {}
    return {k: best[k] for k in ("block_size", "ar_context", "candidate_blocks")}
