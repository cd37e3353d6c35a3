"""A torch-only Qwen2 / Qwen3 / Llama / LLaDA network (each family's row names its: models/families.py) for
the small bundled models (its tokenizer: models/native_tokenizer.py) and the families transformers cannot run.

Why: a short ``codila gen`` on the bundled pair spent most of its start-up importing transformers
(``Qwen2ForCausalLM`` pulls in torch.distributed, torch._dynamo and sympy: about 2 s here, against a
decode of about 1 s), and transformers' generic forward (mask builders, cache classes, output objects)
costs more per call than the small networks themselves. So codila runs them with this module: the
same weights, state-dict names and maths, only torch (docs/decoders.md, "Engines"; equal to transformers
to 1e-5: tests/test_native.py). The block-diffusion families and LLaDA run here; other checkpoints on transformers
unless ``CODILA_ENGINE`` (models/loading.py::engine_for) or a server (native) says otherwise.

The call surface mirrors the subset of transformers that codila uses:
``model(input_ids= | inputs_embeds=, attention_mask=, position_ids=, cache=, use_cache=, logits_to_keep=)``
returning ``.logits`` and ``.cache``; ``attention_mask`` is ``{"full_attention": None | bool [1|B, 1, N, M]}``
or a 2-D padding mask [B, N] (1 = real token); a cache has ``layers[i].keys/values`` and ``update``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from codila_cli.models.families import network_type

QK_NORM, BIAS_FROM_CONFIG = ("qwen3",), ("qwen3", "llama")  # q/k norms; biases as the config asks
ARCHITECTURES = ("qwen2", "qwen3", "llama")  # a family's network (models/families.py::network_type): Dream's is qwen2


@dataclass(frozen=True)
class NativeConfig:
    kind: str  # the network: "qwen2" | "qwen3" | "llama" | "llada"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int

    @classmethod
    def from_dict(cls, cfg: dict) -> NativeConfig | None:
        """The config when this module can run it exactly, else None (then transformers runs it)."""
        kind = network_type(cfg)
        if kind == "llada":  # its own config names (models/llada.py)
            from codila_cli.models.llada_layout import native_fields

            fields = native_fields(cfg)
            return cls(**fields) if fields is not None else None
        if kind not in ARCHITECTURES or cfg.get("hidden_act", "silu") != "silu" or cfg.get("mlp_bias"):
            return None
        rope = cfg.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling") or cfg.get("use_sliding_window"):
            return None
        heads = int(cfg["num_attention_heads"])
        return cls(kind=kind, vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
                   intermediate_size=int(cfg["intermediate_size"]), num_hidden_layers=int(cfg["num_hidden_layers"]),
                   num_attention_heads=heads, num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
                   head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
                   rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                   tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   attention_bias=bool(cfg.get("attention_bias", False)) if kind in BIAS_FROM_CONFIG else True,
                   max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)))


@dataclass
class LayerKV:
    keys: torch.Tensor
    values: torch.Tensor


@dataclass
class NativeCache:
    """Per-layer keys/values ([B, H_kv, T, d], RoPE applied) that grow as tokens are appended."""

    layers: list[LayerKV] = field(default_factory=list)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if layer < len(self.layers):
            kv = self.layers[layer]
            kv.keys = torch.cat([kv.keys, keys], dim=2)
            kv.values = torch.cat([kv.values, values], dim=2)
        else:
            self.layers.append(LayerKV(keys, values))
            kv = self.layers[layer]
        return kv.keys, kv.values

    def get_seq_length(self) -> int:
        return int(self.layers[0].keys.shape[2]) if self.layers else 0


@dataclass
class Output:
    logits: torch.Tensor
    cache: NativeCache | None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight · x / rms(x) over the last dim, statistics in fp32 and the weight applied after the cast
    back (transformers' Qwen2RMSNorm); one op in fp32 when ``weight`` is [dim] (the casts are no-ops),
    else ``weight`` broadcasts over the leading dims (the fused per-head q/k norm)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight=weight, eps=eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x·cos + rotate_half(x)·sin, rotate_half([a, b]) = [−b, a] being roll([a, b]) times ``sin``'s sign."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: NativeConfig, index: int) -> None:
        super().__init__()
        d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.index, self.head_dim, self.heads, self.kv_heads = index, d, h, kv
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.kind in (*BIAS_FROM_CONFIG, "llada") and cfg.attention_bias)
        if cfg.kind in QK_NORM:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.eps = cfg.rms_norm_eps
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by fuse() (load_native)
        self.qk_norm: torch.Tensor | None = None

    def fuse(self) -> None:
        """Inference layout: q, k and v come from one [q; k; v] matmul, and Qwen3's two per-head norms
        are one norm with a [heads + kv_heads, head_dim] weight, so q and k are rotated in one pass too.
        The three Linear weights become views of the fused matrix: nothing is stored twice and the
        state-dict names stay. Call it after the weights are loaded and cast (load_native does)."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        sizes = [p.weight.shape[0] for p in projs]
        w = torch.cat([p.weight.detach() for p in projs])  # no graph: it would keep the originals
        for p, part in zip(projs, w.split(sizes)):
            p.weight = nn.Parameter(part, requires_grad=False)
        bias = None
        if self.q_proj.bias is not None:
            bias = torch.cat([p.bias.detach() for p in projs])
            for p, part in zip(projs, bias.split(sizes)):
                p.bias = nn.Parameter(part, requires_grad=False)
        self.qkv = (w, bias)
        if hasattr(self, "q_norm"):
            d = self.head_dim
            self.qk_norm = torch.cat([self.q_norm.weight.expand(self.heads, d),
                                      self.k_norm.weight.expand(self.kv_heads, d)])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                causal: bool, cache: NativeCache | None) -> torch.Tensor:
        b, n, _ = x.shape
        h, kv = self.heads, self.kv_heads
        qkv = F.linear(x, *self.qkv).view(b, n, h + 2 * kv, self.head_dim)
        qk, v = qkv[:, :, : h + kv], qkv[:, :, h + kv :].transpose(1, 2)
        if self.qk_norm is not None:
            qk = rms_norm(qk, self.qk_norm, self.eps)
        qk = _rotate(qk.transpose(1, 2).to(cos.dtype), cos, sin).to(v.dtype)  # [b, h + kv, n, d]
        q, k = qk[:, :h], qk[:, h:]
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        if isinstance(mask, Packed):
            out = mask.attend(q, k, v, gqa=self.heads != self.kv_heads, layer=self.index)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None and n > 1,
                                                 enable_gqa=self.heads != self.kv_heads)
        return F.linear(out.transpose(1, 2).reshape(b, n, -1), self.o_proj.weight, self.o_proj.bias)


@dataclass(frozen=True)
class Packed:
    """Rows packed back to back into one [1, N] sequence (models/batched.py); row i's new tokens are
    ``spans[i]`` = (start, n), and it attends to its own cached keys ``past[i][layer]`` ([1, H, T_i, d]
    or none) and new keys with the mask it has alone (none for the DLM, causal for the helper): the very
    call it makes alone, so it gets its lone result in bf16 too, where a padded, masked attention
    rounds otherwise (issue 52)."""

    spans: tuple[tuple[int, int], ...]
    past: tuple[list | None, ...]  # per row: per-layer (keys, values), or None
    causal: bool

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gqa: bool, layer: int) -> torch.Tensor:
        outs = []
        for (s, n), past in zip(self.spans, self.past):
            kk, vv = k[:, :, s : s + n], v[:, :, s : s + n]
            cached = 0
            if past:
                pk, pv = past[layer]
                cached = int(pk.shape[2])
                kk, vv = torch.cat([pk, kk], dim=2), torch.cat([pv, vv], dim=2)
            mask, is_causal = None, self.causal and cached == 0 and n > 1  # as NativeLM._mask for one row
            if self.causal and cached and n > 1:
                mask = (torch.arange(cached + n, device=q.device)[None]
                        <= torch.arange(cached, cached + n, device=q.device)[:, None])[None, None]
            outs.append(F.scaled_dot_product_attention(q[:, :, s : s + n], kk, vv, attn_mask=mask,
                                                       is_causal=is_causal, enable_gqa=gqa))
        return torch.cat(outs, dim=2)


class MLP(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None  # set by fuse()

    def fuse(self) -> None:
        """One [gate; up] matmul instead of two (the Linear weights become views of it, as Attention.fuse)."""
        w = torch.cat([self.gate_proj.weight.detach(), self.up_proj.weight.detach()])
        self.gate_proj.weight, self.up_proj.weight = (nn.Parameter(t, requires_grad=False) for t in w.chunk(2))
        self.gate_up = w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj.weight)


class Layer(nn.Module):
    def __init__(self, cfg: NativeConfig, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, index)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, causal, cache):
        # submodules run through .forward and F.linear, not Module.__call__: a one-token step of the small
        # helper is dispatch-bound, and the hook machinery was a tenth of it (nothing here uses hooks)
        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        x = x + self.self_attn.forward(rms_norm(x, ln1.weight, ln1.eps), cos, sin, mask, causal, cache)
        return x + self.mlp.forward(rms_norm(x, ln2.weight, ln2.eps))


class Body(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        # given its weight, Embedding skips its random init: on the meta device that init (normal_) runs
        # a Python reference kernel that imports torch._dynamo, about 1 s of a short `codila gen`
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class NativeLM(nn.Module):
    """Causal (Qwen2/Qwen3) or bidirectional (Dream) LM with transformers' state-dict names."""

    def __init__(self, cfg: NativeConfig, *, causal: bool) -> None:
        super().__init__()
        self.config = cfg
        self.causal = causal
        self.model = Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.inv_freq = rope_inv_freq(cfg)  # a plain fp32 tensor, not a buffer: .to(dtype) leaves it fp32
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin ([b, 1, n, head_dim], ``dtype``) at ``position_ids``, read from a table that
        is computed once per device and dtype (the same fp32 arithmetic as computing them per call)."""
        table = self._rope_table
        if table is None or table[0].shape[0] < need or table[0].dtype != dtype or table[0].device != position_ids.device:
            size = max(need, self.config.max_position_embeddings)
            pos = torch.arange(size, device=position_ids.device).float()
            freqs = pos[:, None] * self.inv_freq[None, :].to(position_ids.device)
            emb = torch.cat([freqs, freqs], dim=-1)
            half = emb.shape[-1] // 2
            sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(position_ids.device)
            table = self._rope_table = (emb.cos().to(dtype), (emb.sin() * sign).to(dtype))
        return table[0][position_ids][:, None], table[1][position_ids][:, None]

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def _mask(self, attention_mask: Any, b: int, n: int, m: int, past: int, device: Any) -> tuple[Any, bool]:
        """(sdpa attn_mask or None, causal flag for sdpa)."""
        if isinstance(attention_mask, dict):
            attention_mask = attention_mask.get("full_attention")
            if attention_mask is None:
                return None, False  # explicit full attention (Dream)
            if isinstance(attention_mask, Packed):
                return attention_mask, False
            return attention_mask.to(device=device, dtype=torch.bool), False
        keep = None
        if attention_mask is not None:  # 2-D padding mask over the keys
            keep = attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]  # [b, 1, 1, m]
        if not self.causal:
            return keep, False
        if keep is None and past == 0:
            return None, True
        if keep is None and n == 1:  # one new query sees every cached key: no mask at all
            return None, False
        rows = torch.arange(past, past + n, device=device)[:, None]
        cols = torch.arange(m, device=device)[None, :]
        allowed = (cols <= rows)[None, None]
        return (allowed if keep is None else allowed & keep), False

    def forward(self, input_ids: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
                attention_mask: Any = None, position_ids: torch.Tensor | None = None,
                cache: NativeCache | None = None, use_cache: bool = False, logits_to_keep: Any = 0,
                **_: Any) -> Output:
        x, cache = self.hidden_states(input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                      position_ids=position_ids, cache=cache, use_cache=use_cache)
        if isinstance(logits_to_keep, torch.Tensor):  # row indices (transformers' convention)
            x = x[:, logits_to_keep]
        elif logits_to_keep:
            x = x[:, -logits_to_keep:]
        return Output(F.linear(x, self.lm_head.weight), cache)

    def hidden_states(self, input_ids: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
                      attention_mask: Any = None, position_ids: torch.Tensor | None = None,
                      cache: NativeCache | None = None, use_cache: bool = False) -> tuple[torch.Tensor, Any]:
        """The final-norm hidden states [b, n, d] (what the head projects) and the cache."""
        x = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        b, n, _ = x.shape
        past = cache.get_seq_length() if (cache is not None and use_cache) else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=x.device)[None].expand(b, n)
            need = past + n
        else:
            need = int(position_ids.max()) + 1
        # LLaDA rotates q and k in fp32 whatever the model's dtype (its rope_full_precision)
        cos, sin = self._rope(position_ids, torch.float32 if self.config.kind == "llada" else x.dtype, need)
        mask, causal = self._mask(attention_mask, b, n, past + n, past, x.device)
        cache = cache if use_cache else None
        for layer in self.model.layers:
            x = layer.forward(x, cos, sin, mask, causal, cache)
        return rms_norm(x, self.model.norm.weight, self.model.norm.eps), cache


def new_cache(model: Any) -> Any:
    """An empty KV cache of the right kind for ``model`` (native or transformers)."""
    if isinstance(model, NativeLM):
        return NativeCache()
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def drop_last(cache: Any, n: int) -> Any:
    """Remove the last ``n`` positions from a KV cache (native, or transformers' DynamicCache, whose
    ``crop`` takes the count to remove as a negative number); returns the cache."""
    if n <= 0:
        return cache
    if isinstance(cache, NativeCache):
        for kv in cache.layers:
            kv.keys, kv.values = kv.keys[:, :, :-n], kv.values[:, :, :-n]
    else:
        cache.crop(-n)
    return cache


def rope_inv_freq(cfg: NativeConfig) -> torch.Tensor:
    """RoPE inverse frequencies [head_dim / 2] in fp32, as transformers' default rotary embedding."""
    # on the CPU even for a meta-device model (meta arithmetic imports torch._dynamo: about 1 s)
    steps = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device="cpu").float()
    return 1.0 / (cfg.rope_theta ** (steps / cfg.head_dim))


def load_native(model: NativeLM, state: dict, *, device: Any, dtype: Any, each: Any = None) -> NativeLM:
    """Materialise a meta-device ``model`` (keys already checked) from ``state`` (tensors already on
    ``device`` in ``dtype``), which it consumes: the loaded tensors become the parameters (no second
    copy of the weights, no fp32 staging), and ``state`` is emptied so that each layer's unfused
    projections are freed as soon as their fused matrix exists. Peak memory: the weights plus one
    layer's fused matrices. ``each(part)``: called on each layer's attention and MLP once it is fused
    (quantization: then only one of them is a full-precision copy at a time)."""
    model.to(dtype)  # on the meta device only the recorded dtype changes
    model.load_state_dict(state, strict=False, assign=True)
    state.clear()
    model.tie_weights()
    for layer in model.model.layers:
        for part in (layer.self_attn, layer.mlp):  # one fused copy at a time beside the mapped files
            part.fuse()
            if each is not None:
                each(part)
    model.inv_freq = rope_inv_freq(model.config).to(device)  # it was built on the meta device
    model._rope_table = None
    return model.eval().requires_grad_(False)
