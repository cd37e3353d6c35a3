"""Dream-family diffusion LMs on transformers' Qwen2 modules, with bidirectional attention.

Dream keeps the autoregressive convention: the raw output at position i predicts token i+1. Every
consumer in codila gets *shifted* logits from :func:`shift_logits`, the one place the shift happens, so
that ``logits[:, i]`` predicts token ``i`` (algorithms.md §1.3). Position 0 has no predictor and keeps
its own row (it is never masked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codila_cli.errors import ModelLoadError
from codila_cli.models.loading import LoadedCheckpoint, build_model, is_dream, read_config
from codila_cli.models.tokens import load_tokenizer, resolve_special_tokens


def shift_logits(raw: Any) -> Any:
    """[B, N, V] raw Dream logits -> [B, N, V] where row i predicts token i (row 0 copied)."""
    import torch

    return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)


class DreamDenoiser:
    """A bidirectional Qwen2 network whose :meth:`logits` are already shifted.

    Forward count is kept in ``forwards`` so decoders and tests can account NFEs.
    """

    def __init__(self, ckpt: LoadedCheckpoint) -> None:
        self.ckpt = ckpt
        self.model = ckpt.model
        self.tokenizer = ckpt.tokenizer
        self.specials = ckpt.specials
        self.device = ckpt.device
        self.name = ckpt.name
        self.forwards = 0

    @property
    def context_length(self) -> int:
        return self.ckpt.context_length

    @property
    def vocab_rows(self) -> int:
        return self.ckpt.vocab_rows

    def raw_logits(self, x: Any, *, attention_mask: Any | None = None) -> Any:
        """One full bidirectional forward. x: [B, N] ids; attention_mask: [B, N] (1 = real, 0 = pad)."""
        import torch

        self.forwards += 1
        with torch.inference_mode():
            if attention_mask is None or bool(attention_mask.all()):
                out = self.model(input_ids=x, attention_mask={"full_attention": None}, use_cache=False)
            else:
                from transformers.masking_utils import create_bidirectional_mask

                # Dream's padding convention: positions count real tokens only; pads get position 1.
                position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
                embeds = self.model.get_input_embeddings()(x)
                mask = create_bidirectional_mask(config=self.model.config, inputs_embeds=embeds,
                                                 attention_mask=attention_mask.bool())
                out = self.model(inputs_embeds=embeds, attention_mask={"full_attention": mask},
                                 position_ids=position_ids, use_cache=False)
        return out.logits

    def logits(self, x: Any, *, attention_mask: Any | None = None, pair_mask: Any | None = None,
               position_ids: Any | None = None) -> Any:
        """Shifted logits [B, N, V] in fp32: row i is the distribution of token i.

        ``pair_mask`` [N, N] bool (query row may attend to key column) and ``position_ids`` [B, N] let
        SDDC isolate canvases; they replace ``attention_mask``.
        """
        if pair_mask is None:
            return shift_logits(self.raw_logits(x, attention_mask=attention_mask)).float()
        import torch

        self.forwards += 1
        with torch.inference_mode():
            out = self.model(input_ids=x, attention_mask={"full_attention": pair_mask[None, None]},
                             position_ids=position_ids, use_cache=False)
        return shift_logits(out.logits).float()


def load_dlm(path: Path, *, name: str, device: Any, dtype: Any) -> DreamDenoiser:
    cfg = read_config(path, name=name)
    if not is_dream(cfg):
        raise ModelLoadError(
            f"'{name}' is a '{cfg.get('model_type')}' model, not a Dream-family diffusion model",
            hint="use --dlm with a Dream checkpoint (model_type \"Dream\"), e.g. dream-coder or bundled-dlm",
        )
    tokenizer = load_tokenizer(path, name=name)
    specials = resolve_special_tokens(tokenizer, cfg, require_mask=True, name=name)
    model = build_model(cfg, name=name, path=path, device=device, dtype=dtype, causal=False)
    return DreamDenoiser(LoadedCheckpoint(name, path, cfg, model, tokenizer, specials, device, dtype))
