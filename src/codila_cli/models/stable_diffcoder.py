"""Stable-DiffCoder (ByteDance Seed 2026, "Stable-DiffCoder: Pushing the Frontier of Code Diffusion Large
Language Model", arXiv 2601.15892; ByteDance-Seed/Stable-DiffCoder-8B-Instruct and -Base, MIT): block
diffusion continual pretraining of Seed-Coder-8B, the family codila's registry reads from ``FAMILY``.

The network is plain Llama (config ``model_type`` "llama", Llama's tensor names, no biases, RoPE θ 5e5,
Seed-Coder's 155,136-token vocabulary, 8K context); what makes it a diffusion model is its remote-code
class (``StableDiffcoderForCausalLM`` in ``architectures`` / ``auto_map``), whose ``generate_block`` runs the
network under a block-causal mask with an exact KV cache of committed blocks, as SDAR's sampler does. So a
checkpoint belongs here when its config names that class (a plain Llama is an AR model), it runs on
models/native.py (kind "llama"; codila runs no remote code), and models/sdar.py's denoiser serves it
(``prefill`` / ``block_logits`` / ``extend``) with the rules of its own sampler (decoding/block.py::BlockRules).
The mask token is ``<[MASK_TOKEN]>`` (id 5 in the released tokenizer, the sampler's default ``mask_id``);
the trained block size is 4 (the sampler's default and its model card's call) unless the config says.

Its ``generate_block`` departs from SDAR's sampler in the rules of ``FAMILY.block_rules``: Gumbel-max draws
(exp(l) / (−log U)^T, U uniform over the block's [n, V] in float64) and float64 confidences, as LLaDA's;
each block's masked slots (not B) shared over the steps; the last block cut at the token limit (its
canvas is prompt + gen_length exactly); no cache append after the block that ends the text; and its
threshold rule (the most confident slot plus every slot at or above the threshold). Where codila goes
on (docs/models.md): a ``threshold`` run whose steps end with slots still masked (the official loop
leaves them masked and moves on), and a length that is not a multiple of the block (the official code
asserts it is).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codila_cli.models.sdar import SdarDenoiser

DEFAULT_BLOCK = 4
MASK = "<[MASK_TOKEN]>"


def trained_block(cfg: dict, path: Path | str | None = None) -> int:
    """config.json's ``block_size`` when it has one, else 4 (``path`` unused: the released repositories carry
    no block size in their names)."""
    return int(cfg.get("block_size") or DEFAULT_BLOCK)


def load_stable_diffcoder(path: Path, cfg: dict, *, name: str, device: Any, dtype: Any,
                          quantize: str = "none") -> SdarDenoiser:
    """A Stable-DiffCoder checkpoint (Llama tensor names) on models/native.py, never its remote code."""
    from codila_cli.models.loading import LoadedCheckpoint, build_model
    from codila_cli.models.tokens import load_tokenizer, resolve_special_tokens

    tokenizer = load_tokenizer(path, name=name, native=True)
    specials = resolve_special_tokens(tokenizer, cfg, require_mask=True, name=name, mask_strings=(MASK,))
    model = build_model(cfg, name=name, path=path, device=device, dtype=dtype, causal=False, quantize=quantize,
                        engine="native")
    return SdarDenoiser(LoadedCheckpoint(name, path, cfg, model, tokenizer, specials, device, dtype, quantize), FAMILY)


def _family() -> Any:
    from codila_cli.decoding.block import BlockRules
    from codila_cli.models.families import Family

    return Family(
        "stable-diffcoder", ("llama",), ("block", "codila"), infill="no", plan=False, codila=True,
        cache="exact (committed blocks)", licence="MIT (Stable-DiffCoder-8B-Instruct/-Base)",
        note="block diffusion on Llama's network and Seed-Coder's 155k vocabulary: a helper is bridged by "
             "token strings (models/token_map.py)",
        markers=("StableDiffcoder", "stable_diffcoder"), block_diffusion=True, native_only=True, network="llama",
        load=load_stable_diffcoder, trained_block=trained_block,
        verified="token-identical on goldens made with a public copy of the official generate_block, not with "
                 "the Hugging Face file itself (tests/fixtures/stable_diffcoder/README.md)",
        block_rules=BlockRules(draw="gumbel", quota_of="masked", cut_last=True, extend_after_end=False,
                               dynamic="top1"))


FAMILY = _family()  # models/families.py reads this row
