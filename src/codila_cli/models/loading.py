"""Load checkpoints from a resolved directory: safetensors only, no remote code, device and dtype.

Dream-family checkpoints (``model_type: "Dream"``) are rebuilt as transformers' own ``Qwen2ForCausalLM``
with bidirectional attention (see models/dream.py). AR helpers are any causal LM that transformers
knows by ``model_type``. A config that only works with ``trust_remote_code`` is refused: codila never
executes code shipped inside a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codila_cli.errors import ModelLoadError, UsageError
from codila_cli.models.validate import read_config

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES_HELP = "auto, cpu, cuda, cuda:N or mps"


def _from_env(var: str, value: str) -> str:
    """" (from VAR)" when the environment variable holds this value: the user did not type it as a flag."""
    import os

    return f" (the value comes from {var})" if os.environ.get(var) == value else ""


def choose_device(device: str) -> Any:
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"invalid --device '{device}'{_from_env('CODILA_DEVICE', device)}", hint=f"use {DEVICES_HELP}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but no CUDA GPU is available", hint="use --device cpu")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps was asked for but MPS is not available", hint="use --device cpu")
    return dev


BF16_ON_CPU_FROM = 2 * 2**30  # weight files at least this large run in their stored bf16 on a CPU under auto


def choose_dtype(dtype: str, device: Any, *, bf16_on_cpu: bool = False) -> Any:
    """The compute dtype. ``auto``: bf16 on CUDA; on a CPU bf16 when ``bf16_on_cpu`` (see
    :func:`bf16_on_cpu`), else fp32."""
    import torch

    if dtype not in DTYPES:
        raise UsageError(f"invalid --dtype '{dtype}'{_from_env('CODILA_DTYPE', dtype)}", hint=f"use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or bf16_on_cpu else torch.float32
    return getattr(torch, dtype)


def _stored(path: Path, *, name: str) -> tuple[str, int]:
    """(the dtype config.json says the weights are stored in, "" if it does not say; bytes of weight files)."""
    cfg = read_config(path, name=name)
    stored = str(cfg.get("dtype") or cfg.get("torch_dtype") or "").removeprefix("torch.")
    return stored, sum(f.stat().st_size for f in _weight_files(path, name=name))


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU has Intel AMX tiles (native bf16 matrix products). Without them bf16 matmuls run
    slower than fp32 on a CPU; with them the bundled DLM's forward ran 1.57× faster in bf16."""
    import torch

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def auto_on_cpu(path: Path, *, name: str, role: str) -> tuple[bool, str]:
    """(whether ``--dtype auto`` runs this checkpoint in bf16 on a CPU, why: "" where nothing was measured
    or sized). Only a checkpoint stored in bf16 (its weights are exact there), and then:

    * a large one (weight files of BF16_ON_CPU_FROM bytes or more: the real 7B files), any role: in fp32 a
      7B DLM needs about 30 GB, and bf16 ran a 245 M-parameter DLM 2.6× faster on an AVX2 CPU;
    * else where the probe (models/probe.py) measures this CPU multiplying the model's own shapes, at its
      role's row counts, faster in bf16; with the probe off (``CODILA_DTYPE_PROBE=0``), a diffusion model
      on a CPU with AMX (the rule before the probe: the bundled DLM 1.57× faster there)."""
    cfg = read_config(path, name=name)
    stored, size = _stored(path, name=name)
    if stored != "bfloat16":
        return False, ""  # fp32 keeps its weights exact: nothing to explain
    if size >= BF16_ON_CPU_FROM:
        return True, "stored in bf16, 2 GiB or more"
    from codila_cli.models import probe

    if not probe.enabled():
        return role == "dlm" and cpu_multiplies_bf16(), ""  # the rule before the probe
    verdict = probe.bf16_faster(**probe.mlp_shape(cfg), role=role)
    return verdict.bf16, verdict.words()


def assert_materialised(model: Any, *, name: str) -> None:
    """Refuse a model with a parameter or buffer still on the meta device (no weights were loaded for it)."""
    left = [k for k, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ModelLoadError(f"'{name}': no weights for {left[:3]}", hint="the checkpoint is incomplete")


def _hf_config(cfg: dict, *, name: str) -> Any:
    """A transformers config object of the checkpoint's network (``network_type``: Dream's is Qwen2's)."""
    from transformers import AutoConfig

    from codila_cli.models.families import network_type

    fields = {k: v for k, v in cfg.items() if k not in ("auto_map", "architectures", "model_type", "transformers_version")}
    try:
        return AutoConfig.for_model(network_type(cfg), **fields)
    except (ValueError, KeyError) as exc:
        remote = " (it asks for remote code)" if "auto_map" in cfg else ""
        raise ModelLoadError(
            f"'{name}': model_type '{cfg['model_type']}' is not supported by transformers{remote}",
            hint="codila never runs trust_remote_code; use a checkpoint whose architecture transformers ships",
        ) from exc


def _weight_files(path: Path, *, name: str) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        from codila_cli.models.files import read_json

        try:
            shards = sorted(set(read_json(index, name=name)["weight_map"].values()))
        except (TypeError, AttributeError, KeyError) as exc:
            raise ModelLoadError(f"'{name}': damaged model.safetensors.index.json: {exc}",
                                 hint="the checkpoint is damaged: copy it again") from exc
        if any(not isinstance(s, str) or "/" in s or "\\" in s or s.startswith(".") for s in shards):
            raise ModelLoadError(f"'{name}': model.safetensors.index.json names a shard outside its folder",
                                 hint="the checkpoint is damaged: copy it again")
        files = [path / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"'{name}': missing weight shards {missing[:3]}", hint="re-download the model")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"'{name}' has no safetensors weights", hint="codila loads *.safetensors only")
    return files


def load_state_dict(path: Path, *, name: str, device: Any, dtype: Any) -> dict:
    from safetensors.torch import load_file

    state: dict = {}
    for file in _weight_files(path, name=name):
        try:
            part = load_file(str(file), device=str(device) if device.type != "cpu" else "cpu")
        except Exception as exc:  # safetensors raises SafetensorError / OSError on truncated files
            raise ModelLoadError(
                f"'{name}': weight file {file.name} is damaged or truncated ({exc})",
                hint="delete it from the cache and download the model again",
            ) from exc
        for k in list(part):  # cast file by file, tensor by tensor: never two copies of the checkpoint
            v = part.pop(k)
            state[k] = v.to(dtype) if v.is_floating_point() else v
    return state


ENGINES = ("auto", "native", "transformers")


def engine_for(path: Path, cfg: dict) -> str:
    """"native" (models/native.py, torch only) or "transformers" for this checkpoint.

    ``CODILA_ENGINE`` = auto (default: native for the bundled models, transformers for everything else),
    native (every checkpoint whose architecture models/native.py runs exactly) or transformers.
    """
    import os

    from codila_cli.models.registry import BUNDLED_DIR

    choice = os.environ.get("CODILA_ENGINE", "auto").strip().lower() or "auto"
    if choice not in ENGINES:
        raise UsageError(f"invalid CODILA_ENGINE '{choice}'", hint="use auto, native or transformers")
    if choice == "transformers":
        return "transformers"
    from codila_cli.models.native import NativeConfig

    supported = NativeConfig.from_dict(cfg) is not None
    from codila_cli.models.families import family_of

    family = family_of(cfg)
    if family is not None and family.native_only:
        return "native"  # transformers has no class that runs it right, and codila runs no remote code
    if choice == "native":
        return "native" if supported else "transformers"
    bundled = path.resolve().is_relative_to(BUNDLED_DIR.resolve())
    return "native" if bundled and supported else "transformers"


def _check_weights(model: Any, state: dict, *, tied: bool, name: str) -> None:
    """Strict key check of a checkpoint against the network built from its config."""
    expected = set(model.state_dict().keys())
    missing = sorted(expected - set(state) - ({"lm_head.weight"} if tied else set()))
    unexpected = sorted(k for k in set(state) - expected if not k.endswith("rotary_emb.inv_freq"))
    if missing or unexpected:
        raise ModelLoadError(
            f"'{name}': weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})",
            hint="the checkpoint is incomplete or belongs to another architecture",
        )


def build_model(cfg: dict, *, name: str, path: Path, device: Any, dtype: Any, causal: bool,
                engine: str | None = None, quantize: str = "none") -> Any:
    """Instantiate the network (models/native.py or transformers, see :func:`engine_for`; ``engine``
    forces one, e.g. transformers for training) and load its safetensors weights with strict key checks.
    ``quantize`` (models/quantize.py): the weights are read on the CPU, their projections turned into
    8- or 4-bit codes one at a time on ``device``, and only then is the rest moved there (a GPU never
    holds the full-precision weights); the native network's layers as each is fused, so that no more
    than one layer's full-precision copy exists beside the stored (mapped) files."""
    each = None
    if quantize != "none":
        from codila_cli.models.quantize import quantizer

        quantize_part = quantizer(quantize, dtype=dtype, device=device, name=name)

        def each(part: Any) -> None:
            quantize_part(part)
            release_freed()  # the layer's full-precision copy and its chunks' temporaries
    model = _build(cfg, name=name, path=path, device=device if each is None else _cpu(), dtype=dtype,
                   causal=causal, engine=engine, each=each)
    if each is not None:
        quantize_part(model)  # a transformers network's projections (a native one's are done); released below
    if each is not None or (_is_native(model) and device.type == "cpu"):
        _off_the_map(model, device)
        model.to(device)  # the buffers
    release_freed()
    return model


def release_freed() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; False where there is none).
    A load frees many large temporaries (a fused layer's full-precision copy, the fp32 chunks it is quantized
    in, a file cast to the run dtype); glibc serves blocks of up to 32 MiB from its heap once one such block
    was freed, and keeps what is freed there: a LLaDA-8B-width int4 load held 1,278 MiB of anonymous memory
    after loading for 451 MiB of weights, 470 MiB with this (benchmarks/quantize.py, docs/results)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc (musl has no malloc_trim)
        return False
    trim(0)
    return True


def _is_native(model: Any) -> bool:
    from codila_cli.models.native import NativeLM

    return isinstance(model, NativeLM)


def _off_the_map(model: Any, device: Any) -> None:
    """Copy the parameters that may still view a mapped safetensors file (all but the views of the native
    network's fused matrices) into memory of their own, so the file is unmapped. Fused and quantized weights are copies already; beside them the mapping kept every page of
    the file it had read in the process (an SDAR-1.7B-shape bf16 load held 4.6 GB for 2.8 GB of weights,
    an int8 one 4.4 GB for 1.4 GB of codes)."""
    fused = set()
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        for t in (*(getattr(layer.self_attn, "qkv", None) or ()), getattr(layer.mlp, "gate_up", None)):
            if hasattr(t, "untyped_storage"):
                fused.add(t.untyped_storage().data_ptr())
    for p in model.parameters():
        if p.untyped_storage().data_ptr() not in fused:
            p.data = p.data.to(device, copy=True)


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


def _build(cfg: dict, *, name: str, path: Path, device: Any, dtype: Any, causal: bool, engine: str | None,
           each: Any) -> Any:
    import torch

    from codila_cli.models.validate import check_shapes, check_weights_against_config

    # the headers against the config before a byte of weights is read or a layer built (issue 60)
    check_weights_against_config(cfg, _weight_files(path, name=name), name=name, path=path)
    state = load_state_dict(path, name=name, device=device, dtype=dtype)
    if (engine or engine_for(path, cfg)) == "native":
        from codila_cli.models.native import NativeConfig, NativeLM, load_native

        native_cfg = NativeConfig.from_dict(cfg)
        if native_cfg.kind == "llada":
            from codila_cli.models.llada_layout import rename_state

            rename_state(state)
        with torch.device("meta"):
            model = NativeLM(native_cfg, causal=causal)
        _check_weights(model, state, tied=native_cfg.tie_word_embeddings, name=name)
        check_shapes(model, state, name=name, path=path)
        model = load_native(model, state, device=device, dtype=dtype, each=each)
        assert_materialised(model, name=name)
        return model
    from transformers import AutoModelForCausalLM

    hf_cfg = _hf_config(cfg, name=name)
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype)
    tied = bool(getattr(hf_cfg, "tie_word_embeddings", False))
    _check_weights(model, state, tied=tied, name=name)
    check_shapes(model, state, name=name, path=path)
    # the loaded tensors become the parameters (assign): one copy of the weights, not two
    model.load_state_dict(state, strict=False, assign=True)
    state.clear()
    if tied:
        model.tie_weights()
    for mod_name, module in list(model.named_modules()):  # non-persistent buffers were left on meta
        if mod_name.endswith("rotary_emb"):
            parent = model.get_submodule(mod_name.rsplit(".", 1)[0])
            with torch.device(device):
                parent.rotary_emb = type(module)(config=hf_cfg)
    assert_materialised(model, name=name)
    if not causal:
        n = 0
        for module in model.modules():
            if hasattr(module, "is_causal"):
                module.is_causal = False
                n += 1
        if n == 0:
            raise ModelLoadError(f"'{name}': cannot make attention bidirectional for this architecture",
                                 hint="use a Dream-family checkpoint as the DLM")
    model.eval()
    model.requires_grad_(False)
    return model


@dataclass
class LoadedCheckpoint:
    name: str
    path: Path
    config: dict
    model: Any
    tokenizer: Any
    specials: Any
    device: Any
    dtype: Any
    quantize: str = "none"  # models/quantize.py: "int8" / "int4" weight-only codes
    dtype_note: str = ""  # why ``--dtype auto`` chose ``dtype`` (models/loading.py::auto_on_cpu), "" if named

    @property
    def vocab_rows(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    @property
    def context_length(self) -> int:
        from codila_cli.models.families import family_of

        n = int(self.config.get("max_position_embeddings") or self.config.get("max_sequence_length") or 2048)
        family = family_of(self.config)  # a family may cap it (Dream's README: 2048 whatever the config says)
        return min(n, family.context) if family is not None and family.context else n
