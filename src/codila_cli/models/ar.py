"""The small autoregressive helper of CoDiLA: any transformers causal LM fed through ``inputs_embeds``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codila_cli.errors import ModelLoadError
from codila_cli.models.families import family_of
from codila_cli.models.loading import LoadedCheckpoint, build_model, engine_for, read_config
from codila_cli.models.tokens import load_tokenizer, resolve_special_tokens


class ARHelper:
    """Wraps a causal LM; counts forwards (one prefill = one forward, one cached step = one forward)."""

    def __init__(self, ckpt: LoadedCheckpoint) -> None:
        self.ckpt = ckpt
        self.model = ckpt.model
        self.tokenizer = ckpt.tokenizer
        self.specials = ckpt.specials
        self.device = ckpt.device
        self.name = ckpt.name
        self.forwards = 0
        self.embedding = self.model.get_input_embeddings().weight  # [V_ar, d]
        self._wrapper: tuple[Any, Any] | None = None

    @property
    def vocab_rows(self) -> int:
        return self.ckpt.vocab_rows

    def wrapper_embeddings(self) -> tuple[Any, Any]:
        """Embeddings of ``<think>`` and ``</think>`` ([n_open, d], [n_close, d]), computed once.

        When the AR tokenizer has no such special tokens, the literal strings are tokenised and their
        token embeddings used in sequence (docs/codila.md).
        """
        if self._wrapper is None:
            import torch

            open_ids, close_ids = self.wrapper_ids()
            emb = self.embedding
            self._wrapper = (emb[torch.tensor(open_ids, device=emb.device)],
                             emb[torch.tensor(close_ids, device=emb.device)])
        return self._wrapper

    def wrapper_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids of ``<think>`` and ``</think>``: one special token each, or the literal's pieces."""
        def ids_for(special: int | None, text: str) -> tuple[int, ...]:
            return (special,) if special is not None else tuple(self.tokenizer.encode(text, add_special_tokens=False))

        return ids_for(self.specials.think_open, "<think>"), ids_for(self.specials.think_close, "</think>")

    def forward(self, *, inputs_embeds: Any, cache: Any | None, keep: int = 1) -> tuple[Any, Any]:
        """One causal forward over [B, T, d] embeddings; returns (the last ``keep`` positions' logits
        [B, keep, V] fp32, cache)."""
        import torch

        from codila_cli.models.native import new_cache

        self.forwards += 1
        if cache is None:
            cache = new_cache(self.model)
        with torch.inference_mode():
            out = self.model(inputs_embeds=inputs_embeds, cache=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[:, -keep:].float(), out.cache


def load_ar(path: Path, *, name: str, device: Any, dtype: Any, engine: str | None = None,
            quantize: str = "none") -> ARHelper:
    """``engine``: force "transformers" (a trainable network with gradient checkpointing) or "native"."""
    cfg = read_config(path, name=name)
    family = family_of(cfg)
    if family is not None:
        raise ModelLoadError(
            f"'{name}' is a {family.name} diffusion model, not an autoregressive helper",
            hint="pass a causal LM such as qwen3-0.6b or bundled-ar to --ar",
        )
    tokenizer = load_tokenizer(path, name=name, native=engine_for(path, cfg) == "native")
    specials = resolve_special_tokens(tokenizer, cfg, require_mask=False, name=name)
    model = build_model(cfg, name=name, path=path, device=device, dtype=dtype, causal=True, engine=engine,
                        quantize=quantize)
    return ARHelper(LoadedCheckpoint(name, path, cfg, model, tokenizer, specials, device, dtype, quantize))
