"""The command line is a package of thin commands over the library: what the commands used to do
inline (settings layering, prompt reading, -n sampling, status lines) is reachable without Typer."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import codila_cli
from codila_cli.config import UserConfig, load_config
from codila_cli.errors import UsageError

SRC = Path(codila_cli.__file__).parent


def _with_recommendation(tmp_path: Path, ar: Path, rec: dict) -> Path:
    import shutil

    helper = tmp_path / "helper"
    shutil.copytree(ar, helper)
    cfg = json.loads((helper / "config.json").read_text())
    cfg["codila_decoding"] = rec
    (helper / "config.json").write_text(json.dumps(cfg))
    return helper


def test_resolve_gen_layers_flag_file_recommendation_default(tiny, tmp_path):
    from codila_cli.resolve import resolve_gen

    helper = _with_recommendation(tmp_path, tiny["ar"], {"block_size": 8, "candidate_blocks": 3, "ar_context": 5})
    conf = tmp_path / "c.toml"
    conf.write_text("[gen]\ncandidate_blocks = 2\n[runtime]\ndevice = \"cpu\"\n")
    user = load_config(conf)
    req = resolve_gen({"block_size": None, "ar_context": 7}, user=user, dlm=str(tiny["dlm"]), ar=str(helper))
    assert req.decoder == "codila"  # auto, with a helper
    cfg = req.config
    assert (cfg.block_size, cfg.candidate_blocks, cfg.ar_context) == (8, 2, 7)  # recommendation, file, flag
    assert cfg.max_new_tokens == 128 and cfg.cache == "none" and req.device == "cpu" and req.dtype == "auto"
    plain = resolve_gen({}, user=UserConfig(conf, False), dlm=str(tiny["dlm"]), ar=None)
    assert plain.decoder == "dream" and plain.ar is None  # no helper: the plain DLM, nothing recommended


def test_a_flag_the_running_decoder_does_not_read_is_refused_and_says_who_reads_it(tiny, monkeypatch):
    """A flag of another decoder would change nothing (-B when dream runs because no helper is set):
    refused, naming the decoders that read it; a CODILA_* variable is a standing preference and may
    hold any decoder's settings; a knob every decoder reads is never refused."""
    from codila_cli.resolve import resolve_gen, unread_flag

    def resolve_gen_cli(flags, **kw):  # what `codila gen` does with its flags
        req = resolve_gen(flags, **kw)
        if unread_flag(req):
            raise unread_flag(req)
        return req

    user = UserConfig(Path("none.toml"), False)
    dlm, ar = str(tiny["dlm"]), str(tiny["ar"])
    with pytest.raises(UsageError, match="--block-size is a setting of the codila decoder, and dream runs") as e:
        resolve_gen_cli({"block_size": 8}, user=user, dlm=dlm, ar=None)
    assert "--ar" in e.value.hint  # codila needs a helper, and none is configured
    with pytest.raises(UsageError, match="--tokens-per-step is a setting of the dream decoder, and codila runs"):
        resolve_gen_cli({"decoder": "codila", "tokens_per_step": 2}, user=user, dlm=dlm, ar=ar)
    with pytest.raises(UsageError, match="--block-length is a setting of the threshold, llada and block decoders, and codila runs"):
        resolve_gen_cli({"block_length": 16}, user=user, dlm=dlm, ar=ar)
    with pytest.raises(UsageError, match="--ar-context is a setting of the codila decoder, and threshold runs"):
        resolve_gen_cli({"decoder": "threshold", "ar_context": 3}, user=user, dlm=dlm, ar=None)
    # the threshold config this flag makes cannot run (16 slots, blocks of 32): the flag is named, not that
    with pytest.raises(UsageError, match="--threshold-convention is a setting of the threshold decoder, and dream runs"):
        resolve_gen_cli({"decoder": "dream", "convention": "fast-dllm", "max_new_tokens": 16}, user=user, dlm=dlm, ar=ar)
    with pytest.raises(UsageError, match="multiple of --block-length"):  # when threshold runs, the rule is the error
        resolve_gen_cli({"decoder": "threshold", "convention": "fast-dllm", "max_new_tokens": 16}, user=user, dlm=dlm, ar=ar)
    with pytest.raises(UsageError, match="--alg origin is a rule of the dream decoder, and codila runs"):
        resolve_gen_cli({"alg": "origin"}, user=user, dlm=dlm, ar=ar)
    assert resolve_gen_cli({"alg": "origin"}, user=user, dlm=dlm, ar=None).configs["dream"].alg == "origin"
    assert resolve_gen_cli({"alg": "maskgit_plus"}, user=user, dlm=dlm, ar=ar).config.alg == "maskgit_plus"
    assert resolve_gen_cli({"decoder": "threshold", "cache": "prefix"}, user=user, dlm=dlm, ar=None).decoder == "threshold"
    assert resolve_gen_cli({"temperature": 0.5, "stop": ("def ",)}, user=user, dlm=dlm, ar=None).decoder == "dream"
    assert resolve_gen({"block_length": 16}, user=user, dlm=dlm, ar=ar).decoder == "codila"  # a server's layer
    from typer.testing import CliRunner

    from codila_cli.cli import app

    monkeypatch.setenv("CODILA_BLOCK_SIZE", "8")
    monkeypatch.setenv("CODILA_TOKENS_PER_STEP", "2")
    for helper in ([], ["--ar", ar]):
        r = CliRunner().invoke(app, ["gen", "--json", "--dlm", dlm, *helper, "--max-new-tokens", "8", "--seed", "0",
                                     "def f("])
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["decoder"] == ("codila" if helper else "dream")
        assert doc["settings_sources"]["block_size"] == doc["settings_sources"]["tokens_per_step"] == "env"
    r = CliRunner().invoke(app, ["gen", "--dlm", dlm, "-B", "2", "--max-new-tokens", "8", "def f("])
    assert r.exit_code == 2 and r.stdout == "" and "Error: --block-size is a setting of the codila decoder" in r.stderr


def test_resolve_gen_refuses_what_cannot_run(tiny):
    from codila_cli.resolve import resolve_gen

    user = UserConfig(Path("none.toml"), False)
    with pytest.raises(UsageError, match="needs an AR helper"):
        resolve_gen({"decoder": "codila"}, user=user, dlm=str(tiny["dlm"]), ar=None)
    with pytest.raises(UsageError, match="--cache needs a block decoder"):
        resolve_gen({"decoder": "dream", "cache": "prefix"}, user=user, dlm=str(tiny["dlm"]), ar=None)
    with pytest.raises(UsageError, match="block-size"):  # every decoder's config is validated, whichever runs
        resolve_gen({"decoder": "dream", "block_size": 0}, user=user, dlm=str(tiny["dlm"]), ar=None)


def test_read_prompt_joins_piped_stdin_before_a_prompt(monkeypatch, tmp_path):
    """Piped text beside a prompt is context before it (stdin, a blank line, the prompt; issue 50), and
    the Prompt says how much of it stdout must not repeat; no argument or `-` reads stdin alone; more than
    4 MiB is refused."""
    from codila_cli.prompts import MAX_PROMPT_BYTES, read_prompt, read_prompt_parts

    class Pipe(io.TextIOWrapper):
        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdin", Pipe(io.BytesIO(b"spec line\n")))
    got = read_prompt_parts("write it", None)
    assert got.text == "spec line\n\nwrite it" and got.text[got.context:] == "write it"
    monkeypatch.setattr(sys, "stdin", Pipe(io.BytesIO(b"")))
    assert read_prompt("write it", None) == "write it"  # an empty pipe adds nothing
    monkeypatch.setattr(sys, "stdin", Pipe(io.BytesIO(b"spec line\n")))
    assert read_prompt("write it", None, with_stdin=True) == "spec line\n\nwrite it"
    monkeypatch.setattr(sys, "stdin", Pipe(io.BytesIO(b"spec line\n")))
    assert read_prompt(None, None) == "spec line\n"
    monkeypatch.setattr(sys, "stdin", Pipe(io.BytesIO(b"x" * (MAX_PROMPT_BYTES + 1))))
    with pytest.raises(UsageError, match="too large"):
        read_prompt("-", None)
    with pytest.raises(UsageError, match="--stdin"):
        read_prompt(None, None, with_stdin=True)
    monkeypatch.setattr(sys, "stdin", Pipe(io.BytesIO(b"\xff")))
    with pytest.raises(UsageError, match="stdin is not UTF-8 text"):
        read_prompt("-", None)
    f = tmp_path / "p.txt"
    f.write_text("from a file")
    assert read_prompt(None, f) == "from a file"
    with pytest.raises(UsageError, match="not both"):
        read_prompt("arg", f)


def test_sample_many_gives_each_seed_its_own_view_and_the_single_run_text(tiny_models):
    from codila_cli.decoding.config import DreamConfig, SamplingConfig
    from codila_cli.engine.generate import generate
    from codila_cli.samples import all_greedy, sample_many, sample_seeds, samples_document

    cfg = DreamConfig(max_new_tokens=6, tokens_per_step=2, sampling=SamplingConfig(temperature=1.0))
    seeds = sample_seeds(11, 3)
    assert seeds == [11, 12, 13] and not all_greedy(cfg)
    opened: list[int] = []

    class View:
        def __init__(self, i: int) -> None:
            self.i, self.events = i, 0

        def __enter__(self):
            opened.append(self.i)
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def __call__(self, event) -> None:
            self.events += 1

    out = sample_many(tiny_models, "def f(", decoder="dream", config=cfg, seeds=seeds, view=View)
    assert opened == [0, 1, 2] and not out.batched  # a CPU: one sample after another, a view each
    for r, s in zip(out.results, seeds):
        assert r.text == generate(tiny_models, "def f(", decoder="dream", config=cfg, seed=s).text
    doc = samples_document(out, tiny_models)
    assert [s["seed"] for s in doc["samples"]] == seeds and "models" not in doc["samples"][0]
    assert doc["batch"]["row_dlm_forwards"] == sum(r.metrics["dlm_forwards"] for r in out.results)


def test_report_lines_are_plain_strings(tiny_models):
    from codila_cli.decoding.config import DreamConfig
    from codila_cli.report import settings_line, syntax_line
    from codila_cli.syntax import check_python

    assert syntax_line(check_python("x = 1\n")) == "syntax: parses"
    assert syntax_line(check_python("def f(:\n")).startswith("syntax: ")
    line = settings_line("dream", DreamConfig(max_new_tokens=8, tokens_per_step=2), tiny_models)
    assert line.startswith("settings: dream:K=2  dlm: ") and "(cpu, float32)" in line


def _import_graph() -> dict[str, set[str]]:
    mods = {}
    for p in SRC.rglob("*.py"):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):  # function-level imports count too
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("codila_cli"):
                graph[m] |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods}
                graph[m] |= {node.module} & set(mods)
            elif isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names} & set(mods)
    return graph


def test_no_import_cycle_anywhere_in_the_package():
    graph = _import_graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_command_modules_stay_thin():
    """Every module of the cli package under 300 lines, every command body under 60."""
    for p in sorted((SRC / "cli").glob("*.py")):
        text = p.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 300, p.name
        for fn in ast.parse(text).body:
            if isinstance(fn, ast.FunctionDef):
                first = fn.body[1] if isinstance(fn.body[0], ast.Expr) and len(fn.body) > 1 else fn.body[0]
                assert fn.end_lineno - first.lineno + 1 <= 60, f"{p.name}:{fn.name}"


def test_no_module_of_the_package_over_400_lines():
    """The limit issue 38 set: a module that grows past it is split by what it does."""
    sizes = {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in SRC.rglob("*.py")}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_help_imports_no_torch():
    code = ("import sys\nfrom codila_cli.cli.app import app\n"
            "print(sorted(m for m in ('torch', 'transformers', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
