"""8- and 4-bit weights (models/quantize.py, ``--quantize``): the codes reproduce the weights within the
scheme's error, a row's product does not depend on the other rows, every family loads and decodes
quantized on both engines, batched rows decode as alone, the fit check sizes and suggests quantized
loads, and what cannot be quantized is refused with one error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from codila_cli.models.quantize import QuantWeight, quantize_weight

FIXTURES = Path(__file__).parent / "fixtures"
FAMILY_CKPTS = {"llada": FIXTURES / "llada" / "checkpoints" / "llada-tiny-a",
                "sdar": FIXTURES / "sdar" / "checkpoints" / "sdar-tiny-a",
                "dreamon": FIXTURES / "dreamon" / "checkpoints" / "dreamon-tiny-a",
                "stable-diffcoder": FIXTURES / "stable_diffcoder" / "checkpoints" / "sdc-tiny-a"}
CPU = torch.device("cpu")


def _weight(n: int = 64, k: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn((n, k), generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("scheme, bound", [("int8", 0.01), ("int4", 0.12)])
def test_codes_reproduce_the_weights_within_the_schemes_error(scheme, bound):
    """The widened codes are the weight within the scheme's rounding (int8: ½ step of max/127 per row;
    int4: ½ step of (max−min)/15 per group), and both kernels (PyTorch's packed CPU one, and the widening
    path other devices run) compute the same product up to bf16's rounding."""
    w = _weight()
    packed = quantize_weight(w, scheme, dtype=torch.float32, device=CPU)
    plain = quantize_weight(w, scheme, dtype=torch.float32, device=CPU, kernel=False)
    assert packed.kernel and not plain.kernel
    back = plain.widened()
    err = (back - w).abs()
    if scheme == "int8":
        assert (err <= w.abs().amax(1, keepdim=True) / 127 / 2 + 1e-7).all()
    else:
        g = w.view(64, -1, plain.group)
        step = ((g.amax(-1) - g.amin(-1)) / 15)[..., None].expand_as(g).reshape(64, -1)
        assert (err <= step / 2 + 1e-6).all()
    assert (back - w).norm() / w.norm() < bound
    x = torch.randn(5, 256)
    exact = F.linear(x, back)
    assert torch.allclose(F.linear(x, packed), exact, rtol=1e-4, atol=1e-4)
    assert torch.allclose(F.linear(x, plain), exact, rtol=1e-5, atol=1e-5)
    bits = 8 if scheme == "int8" else 4
    assert packed.q.numel() * packed.q.element_size() == 64 * 256 * bits // 8  # 1 or ½ byte a weight


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_weight_widened_in_place_is_the_formula_bit_for_bit(scheme, dtype):
    """The widening path (CUDA, MPS) computes ``q · s`` / ``(q − 8) · s + z`` in place on one buffer: the same
    bits as the formula written out, which held a temporary per operation."""
    w = _weight(n=96, k=256, seed=3)
    q = quantize_weight(w, scheme, dtype=dtype, device=CPU, kernel=False)
    if scheme == "int8":
        formula = q.q.to(dtype) * q.scales[:, None]
    else:
        codes = torch.stack([q.q & 15, q.q >> 4], dim=-1).view(96, 256 // q.group, q.group)
        scale, zero = q.scales[..., 0].t()[..., None], q.scales[..., 1].t()[..., None]
        formula = ((codes.to(dtype) - 8) * scale + zero).view(96, 256)
    assert torch.equal(q.widened(), formula)


def test_the_fit_check_counts_a_widened_weight_off_a_cpu():
    """Off a CPU each quantized product widens its weight to the run dtype (one at a time): the estimate adds
    the largest layer weight in that dtype (natively the fused [gate; up]: two of them), and int4's unpacked
    codes; on a CPU, whose kernels read the codes, nothing."""
    import json

    from codila_cli.models.fit import estimate
    from codila_cli.models.loading import _weight_files
    from codila_cli.models.validate import weight_headers

    ckpt = FAMILY_CKPTS["sdar"]
    cfg, files = json.loads((ckpt / "config.json").read_text()), _weight_files(ckpt, name="s")
    biggest = max(shape[0] * shape[1] for key, (_, shape) in weight_headers(files, name="s").items()
                  if ".layers." in key and len(shape) == 2)
    for scheme, extra in (("int8", 2 * biggest), ("int4", 3 * biggest)):
        for native, fused in ((False, 1), (True, 2)):
            kw = {"name": "s", "dtype": "bfloat16", "files": files, "quantize": scheme, "native": native}
            cpu, gpu = estimate(ckpt, cfg, **kw), estimate(ckpt, cfg, widened=True, **kw)
            assert gpu.activations - cpu.activations == fused * extra and gpu.weights == cpu.weights
    plain = {"name": "s", "dtype": "bfloat16", "files": files}
    assert estimate(ckpt, cfg, widened=True, **plain) == estimate(ckpt, cfg, **plain)  # bf16 weights: no widening


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_rows_product_does_not_depend_on_the_other_rows(scheme, dtype):
    """The server's same-text rule quantized: rows stacked into one product get the bits each gets alone
    (PyTorch's weight-only CPU kernels compute a row on its own), at 1 to 64 rows."""
    qw = quantize_weight(_weight(n=96, k=128), scheme, dtype=dtype, device=CPU)
    x = torch.randn(64, 128).to(dtype)
    together = F.linear(x, qw)
    for rows in (1, 3, 17, 64):
        assert torch.equal(F.linear(x[:rows], qw), together[:rows])
    assert torch.equal(torch.cat([F.linear(x[i : i + 1], qw) for i in range(64)]), together)


def test_a_weight_that_requires_grad_keeps_no_graph():
    """Loaded weights are parameters that may still require grad while a load quantizes them: the codes and
    scales must not hold an autograd graph (it kept every chunk's fp32 temporaries: SDAR-1.7B's int8 load
    took 16.5 GB instead of 1.9 GB before quantize_weight ran without grad)."""
    w = torch.nn.Parameter(_weight())
    for scheme in ("int8", "int4"):
        qw = quantize_weight(w, scheme, dtype=torch.float32, device=CPU)
        assert qw.scales.grad_fn is None and not qw.scales.requires_grad and qw.q.grad_fn is None


def test_a_quant_weight_takes_part_only_in_linear():
    qw = quantize_weight(_weight(), "int8", dtype=torch.float32, device=CPU)
    with pytest.raises(TypeError, match="only in F.linear"):
        torch.matmul(torch.randn(2, 256), qw)  # type: ignore[arg-type]


def _quantized(model) -> list:
    found = [m.weight for m in model.modules() if isinstance(getattr(m, "weight", None), QuantWeight)]
    for layer in getattr(getattr(model, "model", None), "layers", []):
        found += [w for w in (getattr(layer.self_attn, "qkv", (None,))[0], getattr(layer.mlp, "gate_up", None))
                  if isinstance(w, QuantWeight)]
    return found


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("family", ["dream-native", "dream-transformers", "llada", "sdar", "dreamon", "stable-diffcoder"])
def test_every_family_loads_and_decodes_quantized(family, scheme, tiny, monkeypatch):
    """A tiny checkpoint of each family, quantized: every projection is codes (the head and embeddings
    stay), the weights take less memory, the first forward's logits stay near the bf16 ones, and gen
    decodes through the real loader."""
    from codila_cli.decoding.registry import decoder_configs
    from codila_cli.engine.generate import generate
    from codila_cli.engine.models import load_models

    monkeypatch.setenv("CODILA_ENGINE", family.split("-")[1] if family.startswith("dream-") else "auto")
    path = str(tiny["dlm"]) if family.startswith("dream-") else str(FAMILY_CKPTS[family])
    full = load_models(dlm=path, ar=None, device="cpu", dtype="bfloat16")
    quant = load_models(dlm=path, ar=None, device="cpu", quantize=scheme)
    assert quant.dlm.ckpt.dtype == torch.bfloat16 and quant.dlm.ckpt.quantize == scheme  # auto: bf16 products
    codes = _quantized(quant.dlm.model)
    layers = quant.dlm.ckpt.config.get("num_hidden_layers") or quant.dlm.ckpt.config.get("n_layers")
    assert len(codes) >= 4 * layers
    plain = [p for n, p in quant.dlm.model.named_parameters() if p.dim() == 2 and "embed" not in n and "head" not in n
             and "wte" not in n]
    assert plain == []  # no projection kept its bf16 weight
    full_bytes = sum(p.numel() * 2 for n, p in full.dlm.model.named_parameters() if ".layers." in n and p.dim() == 2)
    assert sum(c.nbytes for c in codes) < full_bytes * (0.6 if scheme == "int8" else 0.4)
    ids = torch.randint(5, 200, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        a = full.dlm.model(input_ids=ids).logits.float()
        b = quant.dlm.model(input_ids=ids).logits.float()
    assert (a - b).norm() / a.norm() < (0.1 if scheme == "int8" else 0.4)
    own = quant.dlm.family.decoders[0]  # each family's own sampler (its row's first decoder)
    extra = {"block_length": 8} if own == "llada" else {}  # LLaDA's blocks must tile the canvas
    config = decoder_configs()[own](max_new_tokens=8, **extra)
    result = generate(quant, "def add(a, b):", decoder=own, config=config, seed=0)
    assert result.decoder == own and 1 <= result.metrics["tokens"] <= 8 and result.metrics["dlm_forwards"] >= 1


def test_quantized_rows_decode_as_alone_batched():
    """The bundled pair with int8 and int4 weights (bf16 products): four prompts of other lengths decoded
    together give, row by row, the texts each gives alone (Dream and CoDiLA, seeded sampling)."""
    from codila_cli.decoding.config import CodilaConfig, DreamConfig, SamplingConfig
    from codila_cli.engine.generate import generate, generate_many
    from codila_cli.engine.models import load_models

    prompts = ["def fib(n):", "def is_prime(n):\n", "def parse(line):", "class Stack:\n"]
    seeds = [3, 4, 5, 6]
    hot = SamplingConfig(temperature=0.8)
    for scheme in ("int8", "int4"):
        models = load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", quantize=scheme, quantize_ar=scheme)
        head = models.dlm.model.lm_head.weight  # the one bf16 product left: the head's
        x = torch.randn(4, 40, head.shape[1]).to(torch.bfloat16)
        if not torch.equal(F.linear(x, head)[0], F.linear(x[:1], head)[0]):
            pytest.skip("this CPU's bf16 matrix product rounds a row by the batch's size (the head's): not codila's")
        for decoder, cfg in (("dream", DreamConfig(max_new_tokens=24, tokens_per_step=2, sampling=hot)),
                             ("codila", CodilaConfig(max_new_tokens=24, block_size=4, ar_temperature=0.8, sampling=hot))):
            alone = [generate(models, p, decoder=decoder, config=cfg, seed=s).completion for p, s in zip(prompts, seeds)]
            together = generate_many(models, prompts, decoder=decoder, config=cfg, seeds=seeds, batched=True)
            assert together.batched and [r.completion for r in together.results] == alone, (scheme, decoder)


def _codila(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codila_cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_gen_runs_quantized_and_json_says_what_ran():
    out = _codila("gen", "--quantize", "int4", "--quantize-ar", "int8", "--json", "--max-new-tokens", "16", "--seed", "1",
                  "-v", "def add(a, b):")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["models"]["dlm"]["quantize"] == "int4" and doc["models"]["ar"]["quantize"] == "int8"
    assert doc["models"]["dlm"]["dtype"] == "bfloat16"
    assert "int4 weights" in out.stderr and "int8 weights" in out.stderr  # -v's settings line


def test_what_cannot_be_quantized_is_one_error():
    """A checkpoint 48 wide has no int4 group (32, 64, 128): one Error: line naming it and a Hint:, exit 1,
    no traceback; an unknown scheme is a usage error (exit 2)."""
    narrow = FIXTURES / "sdar" / "checkpoints" / "sdar-tiny-b"
    out = _codila("gen", "--dlm", str(narrow), "--quantize", "int4", "--max-new-tokens", "8", "def f(x):")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "int4" in errors[0] and "multiples of 32" in errors[0], out.stderr
    assert "Hint:" in out.stderr
    out = _codila("gen", "--quantize", "int3", "def f(x):")
    assert out.returncode == 2 and "int3" in out.stderr


def test_the_fit_check_sizes_quantized_loads_and_names_the_first_that_fits(tiny):
    """The estimate of int8 and int4 weights is below bf16's; a limit between the bf16 and the int8 need
    is refused with `--quantize int8 needs …: fits`, and the same command with --quantize int8 loads."""
    from codila_cli.engine.models import sized

    path = FAMILY_CKPTS["llada"]
    from codila_cli.models.fit import canvas_for

    needs, options = sized([("m", path, torch.bfloat16, "none")], canvas=canvas_for(8))  # gen's canvas below
    bf16 = needs[0].total
    int8, int4 = options["--quantize int8"][0].total, options["--quantize int4"][0].total
    assert int4 < int8 < bf16 and "--dtype bfloat16" not in options
    from codila_cli.models.fit import RUNTIME

    limit = RUNTIME + (bf16 + int8) // 2
    args = ["gen", "--dlm", str(path), "--decoder", "llada", "--max-new-tokens", "8", "--dtype", "bfloat16", "def f(x):"]
    out = _codila(*args, env={"CODILA_MEMORY_LIMIT": str(limit)})
    assert out.returncode == 1 and "Hint: --quantize int8 needs" in out.stderr and ": fits" in out.stderr, out.stderr
    out = _codila(*args[:-1], "--quantize", "int8", args[-1], env={"CODILA_MEMORY_LIMIT": str(limit)})
    assert out.returncode == 0, out.stderr


def test_infill_plan_and_eval_take_quantize(tmp_path):
    """Every command that loads a DLM takes --quantize (and --quantize-ar where a helper loads), and its
    --json names what ran."""
    src = tmp_path / "m.py"
    src.write_text("def add(a, b):\n    pass\n\nprint(add(1, 2))\n")
    out = _codila("infill", str(src), "--line", "2", "--quantize", "int8", "--json", "--seed", "0")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["models"]["dlm"]["quantize"] == "int8"
    assert src.read_text().startswith("def add(a, b):\n    pass")  # --json alone writes nothing to the file
    out = _codila("plan", "--quantize", "int4", "--json", "--seed", "0", "Parse a CSV line into fields.")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["models"]["dlm"]["quantize"] == "int4"
    run = tmp_path / "eval"
    out = _codila("eval", "--benchmark", "heldout", "--limit", "1", "--setting", "dream:K=4", "--max-new-tokens", "16",
                  "--quantize", "int8", "--quantize-ar", "int4", "--output", str(run), "--quiet")
    assert out.returncode == 0, out.stderr


def test_the_server_runs_quantized_and_health_says_so():
    import httpx
    from test_serve import Server

    s = Server("--quantize", "int8", "--quantize-ar", "int4")
    try:
        health = httpx.get(s.url + "/health", timeout=30).json()
        assert (health["quantize"], health["quantize_ar"], health["dtype"]) == ("int8", "int4", "bfloat16")
        assert health["dtype_note"] == "int8 weights: products in bf16"
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 8, "seed": 0},
                       timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 8
    finally:
        s.stop()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantizing_chunk_by_chunk_gives_the_whole_weights_codes(scheme, monkeypatch):
    """A weight quantized (and int4-packed) a chunk of rows at a time, which bounds a load's transient memory,
    has the same codes and scales as the whole weight at once (PyTorch's int4 CPU packing is per 64 rows)."""
    from codila_cli.models import fit
    from codila_cli.models.quantize import quantize_weight

    w = _weight(n=208, k=256, seed=3)  # 208 rows: 3 chunks of 64 and a tail of 16
    monkeypatch.setattr(fit, "QUANT_CHUNK", 10**9)
    whole = quantize_weight(w, scheme, dtype=torch.bfloat16, device=CPU)
    monkeypatch.setattr(fit, "QUANT_CHUNK", 64 * 256)
    chunked = quantize_weight(w, scheme, dtype=torch.bfloat16, device=CPU)
    assert torch.equal(whole.q, chunked.q) and torch.equal(whole.scales, chunked.scales)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert torch.equal(torch.nn.functional.linear(x, whole), torch.nn.functional.linear(x, chunked))


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantizing_leaves_the_weight_it_reads(scheme):
    """Each chunk's codes are computed in place on the chunk's own fp32 copy: an fp32 weight (whose
    ``.to(float32)`` would be the weight itself) is left as it was."""
    w = _weight(n=128, k=256, seed=5).float()
    before = w.clone()
    quantize_weight(w, scheme, dtype=torch.float32, device=CPU)
    assert torch.equal(w, before)


def test_a_native_load_quantizes_attention_before_fusing_the_mlp_and_hands_memory_back(monkeypatch):
    """A native layer's attention is fused and quantized before its MLP is fused, so one full-precision fused
    copy exists at a time (models/fit.py sizes the [gate; up] one); after each quantized part and after the
    load, freed heap memory goes back to the system (models/loading.py::release_freed: glibc's malloc_trim,
    which kept 800 MiB of a LLaDA-8B-width int4 load otherwise; docs/results/quantize-s35.md)."""
    import platform

    from codila_cli.engine.models import load_models
    from codila_cli.models import loading, native
    from codila_cli.models import quantize as q

    events: list[str] = []
    real_fuse, real_attn, real_mlp, real_release = native.MLP.fuse, q._native_attention, q._native_mlp, loading.release_freed
    monkeypatch.setattr(native.MLP, "fuse", lambda self: (events.append("fuse mlp"), real_fuse(self))[1])
    monkeypatch.setattr(q, "_native_attention", lambda *a, **k: (events.append("quantize attention"), real_attn(*a, **k))[1])
    monkeypatch.setattr(q, "_native_mlp", lambda *a, **k: (events.append("quantize mlp"), real_mlp(*a, **k))[1])
    monkeypatch.setattr(loading, "release_freed", lambda: (events.append("release"), real_release())[1])
    m = load_models(dlm=str(FAMILY_CKPTS["llada"]), ar=None, device="cpu", quantize="int8")
    layers = m.dlm.ckpt.config["n_layers"]
    step = ["quantize attention", "release", "fuse mlp", "quantize mlp", "release"]
    assert events == step * layers + ["release"]  # and once after the load
    assert real_release() is (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc")
