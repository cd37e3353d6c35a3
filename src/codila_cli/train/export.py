"""``codila train export``: the finished models into the package (size-capped), the helper's
recommended decoding settings written into its config.json."""

from __future__ import annotations

import shutil
from pathlib import Path

from codila_cli.train.networks import final_dlm_dir

MAX_BUNDLE_BYTES = 40 * 2**20


def export_value(text: str) -> bool | int | float | str:
    """``KEY=VALUE`` of `stages export`: true / false, an int, a float (with a dot), else the text (cache=dual)."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def stage_export(run: Path, *, target: Path | None = None, dlm: Path | None = None, ar: Path | None = None,
                 tasks: Path | None = None, ar_decoding: dict | None = None) -> dict:
    """Copy the finished DLM and aligned AR (bf16 safetensors + tokenizer), and the tasks fine-tune when
    there is one, into the package. ``dlm``/``ar``/``tasks`` choose other finished directories than the
    defaults (the last DLM stage, ``align/final``, ``tasks/final``). ``ar_decoding`` is written into the
    exported helper's config.json as ``codila_decoding`` (helper_card.recommended_decoding; ``by_block_size``
    {"8": {...}} holds settings for one block size)."""
    from codila_cli.models.registry import BUNDLED_DIR

    target = target or BUNDLED_DIR
    from codila_cli.helper_card import read_config, validate_decoding, write_card, write_config

    pairs = {"dlm": dlm or final_dlm_dir(run), "ar": ar or run / "align" / "final"}
    if tasks is not None or (run / "tasks" / "final" / "model.safetensors").is_file():
        pairs["tasks"] = tasks or run / "tasks" / "final"
    if ar_decoding:
        validate_decoding(ar_decoding)  # ValueError before anything is copied
    for name, src in pairs.items():
        if not (src / "model.safetensors").is_file():
            raise FileNotFoundError(f"{src} has no model.safetensors: finish the {name} stage first")
    total = sum(f.stat().st_size for src in pairs.values() for f in src.iterdir() if f.is_file())
    if total > MAX_BUNDLE_BYTES:
        raise ValueError(f"bundle is {total / 2**20:.1f} MiB, over the {MAX_BUNDLE_BYTES / 2**20:.0f} MiB cap")
    for name, src in pairs.items():
        dst = target / name
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        for f in src.iterdir():  # the files only: an aligned helper's training/ state stays behind
            if f.is_file():
                shutil.copy2(f, dst / f.name)
    cfg_file = target / "ar" / "config.json"
    cfg = read_config(cfg_file)
    if ar_decoding:
        cfg = write_card(cfg, decoding=ar_decoding)
    write_config(cfg_file, _rerecord_pair(cfg, pairs["dlm"], target / "dlm"))
    return {"bytes": total, "target": str(target)}


def _rerecord_pair(ar_config: dict, dlm_src: Path, dlm_dst: Path) -> dict:
    """The exported pair moves into the package: when the helper records (``codila_train align``) that it
    was aligned to the DLM being exported with it, record that DLM as it now is, ``bundled-dlm`` at its
    new place (same weights, same fingerprint), so `codila gen` does not warn about a mismatch."""
    from codila_cli.helper_card import read_card, write_card
    from codila_cli.models.cache import identity, same_model
    from codila_cli.models.registry import resolve_spec

    card = read_card(ar_config)
    recorded = card.aligned_dlm
    if recorded is None or not same_model(recorded, identity(resolve_spec(str(dlm_src), kind="dlm"), dlm_src)):
        return ar_config  # same_model: by fingerprint, else by directory (a record made before fingerprints)
    moved = {**identity(resolve_spec(str(dlm_dst), kind="dlm"), dlm_dst), "name": "bundled-dlm", "path": None,
             "exported_from": recorded.get("exported_from", recorded)}  # once, not nested
    return write_card(ar_config, training={**card.training, "dlm": moved})
