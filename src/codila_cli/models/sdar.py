"""Block-diffusion LMs (SDAR: Cheng et al. 2025, "SDAR: A Synergistic Diffusion-AutoRegression Paradigm for
Scalable Sequence Generation", arXiv 2510.06303; JetAstra/SDAR): checkpoints with ``model_type`` "sdar".

An SDAR network is Qwen3's (the same tensor names, q/k norms; it runs on models/native.py, kind "sdar"),
trained so that a block of B tokens attends to every earlier block and to itself in both directions. So
a block is denoised against the exact keys and values of the committed blocks before it: the prompt's
whole blocks are prefilled once under the block-causal mask, each block's denoising forward runs only the
block and reads the cache, and a finished block is run once more to append its keys and values
(decoding/block.py). As in the official sampler, the raw output at i is token i's distribution (no
shift). The trained block size: :func:`trained_block`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codila_cli.models.dream import DreamDenoiser

DEFAULT_BLOCK = 4


def trained_block(cfg: dict, path: Path | str | None = None) -> int:
    """The block size an SDAR checkpoint was trained with: config.json's ``block_size``, else the ``-bN``
    its repository is named with (``JetLM/SDAR-8B-Chat-b32``, in the cache as ``models--JetLM--SDAR-8B-Chat-b32``),
    else 4, what the unsuffixed chat models were released with."""
    import re

    if cfg.get("block_size"):
        return int(cfg["block_size"])
    m = re.search(r"SDAR[^/]*-b(\d+)(?:/|$)", str(path or ""), re.IGNORECASE)
    return int(m.group(1)) if m else DEFAULT_BLOCK


class SdarDenoiser(DreamDenoiser):
    """A block-diffusion network: :meth:`prefill`, :meth:`block_logits` and :meth:`extend` read and grow an
    exact KV cache (per-layer (keys, values), RoPE applied); ``forwards`` counts every network call."""

    @property
    def trained_block(self) -> int:
        return trained_block(self.ckpt.config, self.ckpt.path)

    def prefill(self, ids: Any, block: int) -> list:
        """Keys and values of ``ids`` [1, n] (n a multiple of ``block``) under the block-causal mask: a token
        sees its own block and every block before it. One forward."""
        import torch

        from codila_cli.models.native import new_cache

        n = ids.shape[1]
        blocks = torch.arange(n, device=ids.device) // block
        mask = (blocks[None, :] <= blocks[:, None])[None, None]  # [1, 1, n, n]: key block <= query block
        self.forwards += 1
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask={"full_attention": mask}, cache=new_cache(self.model),
                             use_cache=True, logits_to_keep=torch.tensor([0], device=ids.device))
        return [(layer.keys, layer.values) for layer in out.cache.layers]

    def block_logits(self, ids: Any, start: int, past: list | None) -> Any:
        """fp32 logits [d, B, V] of the block ``ids`` [d, B] (d candidates of one block: decoding/freedave.py) at
        positions start … start + B − 1, each attending to itself and to ``past`` (None: nothing before it);
        the cache is read, never written."""
        import torch

        pos = torch.arange(start, start + ids.shape[1], device=ids.device)[None]
        if ids.shape[0] > 1:  # several candidate blocks (decoding/freedave.py) over one cache
            pos = pos.expand(ids.shape[0], -1)
            past = [(k.expand(ids.shape[0], -1, -1, -1), v.expand(ids.shape[0], -1, -1, -1)) for k, v in past or ()]
        return self.kv_call(ids, positions=pos, past=past or None, keep=0)[0]

    def extend(self, ids: Any, start: int, past: list | None) -> list:
        """``past`` with the finished block ``ids`` appended (one forward, as the official sampler's)."""
        import torch

        pos = torch.arange(start, start + ids.shape[1], device=ids.device)[None]
        return self.kv_call(ids, positions=pos, past=past, keep=torch.tensor([0], device=ids.device), want_kv=True)[1]

    def logits(self, *_: Any, **__: Any) -> Any:
        from codila_cli.errors import UsageError

        raise UsageError(f"{self.name} is a block-diffusion model: it writes left to right, block by block, against a "
                         "cache of the blocks before, so infill, plan and the whole-canvas decoders do not run it",
                         hint="codila gen runs it with --decoder block (its own sampler) or --decoder codila")


def load_sdar(path: Path, cfg: dict, *, name: str, device: Any, dtype: Any, quantize: str = "none") -> SdarDenoiser:
    """An SDAR checkpoint (Qwen3 tensor names, no remote code) on models/native.py."""
    from codila_cli.models.loading import LoadedCheckpoint, build_model
    from codila_cli.models.tokens import load_tokenizer, resolve_special_tokens

    tokenizer = load_tokenizer(path, name=name, native=True)
    specials = resolve_special_tokens(tokenizer, cfg, require_mask=True, name=name)
    model = build_model(cfg, name=name, path=path, device=device, dtype=dtype, causal=False, quantize=quantize, engine="native")
    return SdarDenoiser(LoadedCheckpoint(name, path, cfg, model, tokenizer, specials, device, dtype, quantize), FAMILY)


def _family() -> Any:
    from codila_cli.models.families import Family

    return Family("sdar", ("sdar",), ("block", "codila"), infill="no", plan=False, codila=True,
                  cache="exact (committed blocks)", licence="Apache-2.0 (SDAR-1.7B-Chat)",
                  note="block diffusion on Qwen3's network and vocabulary: a Qwen3 helper needs no bridge",
                  block_diffusion=True, native_only=True, network="qwen3", load=load_sdar, trained_block=trained_block)


FAMILY = _family()  # models/families.py reads this row
