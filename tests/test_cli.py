"""The `codila` command as users and scripts see it: stdout payload only, stderr messages, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app

runner = CliRunner()


def gen(*args, input=None):
    return runner.invoke(app, ["gen", *args], input=input)


def test_help_does_not_import_torch():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom codila_cli.cli import app\n"
            "r = CliRunner().invoke(app, ['--help']); r2 = CliRunner().invoke(app, ['gen', '--help'])\n"
            "assert r.exit_code == 0 and r2.exit_code == 0\n"
            "print(sorted(m for m in ('torch', 'transformers', 'tree_sitter') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_json_schema_and_tokens_per_step(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "def f(", "--json", "-K", "4", "--max-new-tokens", "16", "--seed", "3",
            "--no-early-stop")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {"schema_version", "command", "text", "models", "seed", "settings", "syntax", "metrics"}
    assert doc["command"] == "gen" and doc["seed"] == 3
    assert set(doc["syntax"]) == {"valid", "parses", "looks_wrong", "checked", "language", "errors", "warnings"}
    assert doc["syntax"]["checked"] is True and doc["syntax"]["language"] == "python"
    for e in doc["syntax"]["errors"]:
        assert set(e) == {"line", "column", "kind", "message", "where"} and e["message"] and e["where"] in ("generated", "given")
    m = doc["metrics"]
    for key in ("dlm_forwards", "ar_forwards", "tokens", "tokens_per_step", "tokens_per_second", "wall_seconds"):
        assert key in m
    assert m["tokens_per_step"] == 4.0 and m["dlm_forwards"] == 4
    assert doc["text"].startswith("def f(")


def test_codila_json_reports_b_and_order(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--decoder", "codila", "--block-size", "4",
            "--json", "--max-new-tokens", "16", "--no-early-stop", "--seed", "0", "def f(")
    assert r.exit_code == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    assert m["tokens_per_step"] == 4.0 and m["order_spearman"] is not None and m["ar_forwards"] > 0


def test_helper_recommended_decoding_sits_below_flags_and_config(tiny, tmp_path, monkeypatch):
    """An AR checkpoint's ``codila_decoding`` (like a generation config) sets CoDiLA defaults; the user's
    config file and flags override it; unknown keys and values of the wrong type are ignored."""
    import shutil

    from codila_cli.helper_card import recommended_decoding

    ar = tmp_path / "ar"
    shutil.copytree(tiny["ar"], ar)
    cfg = json.loads((ar / "config.json").read_text())
    cfg["codila_decoding"] = {"candidate_blocks": 1, "ar_context": 8, "tau": 0.5, "block_size": "8",
                              "ar_repetition_penalty": 1.2, "cache_blocks": 3}
    (ar / "config.json").write_text(json.dumps(cfg))
    assert recommended_decoding(str(ar)) == {"candidate_blocks": 1, "ar_context": 8, "ar_repetition_penalty": 1.2,
                                             "cache_blocks": 3}
    assert recommended_decoding(str(tmp_path / "missing")) == {}
    base = ("--dlm", str(tiny["dlm"]), "--ar", str(ar), "--json", "--max-new-tokens", "8", "--seed", "0", "def f(")
    settings = lambda *extra: json.loads(gen(*extra, *base).stdout)["settings"]
    s = settings()
    assert (s["candidate_blocks"], s["ar_context"], s["block_size"], s["ar_repetition_penalty"]) == (1, 8, 4, 1.2)
    assert s["cache"] == "none" and s["cache_blocks"] is None  # the window is recommended for a cache only
    s = settings("--ar-context", "0", "--ar-repetition-penalty", "1")
    assert (s["candidate_blocks"], s["ar_context"], s["ar_repetition_penalty"]) == (1, 0, 1.0)
    assert (settings("--cache", "prefix")["cache_blocks"], settings("--cache", "dual", "--cache-blocks", "2")["cache_blocks"]) == (3, 2)
    assert gen("--cache-blocks", "2", *base).exit_code == 2  # given without a cache: still an error
    conf = tmp_path / "config.toml"
    conf.write_text("[gen]\ncandidate_blocks = 3\n")
    monkeypatch.setenv("CODILA_CONFIG", str(conf))
    assert settings()["candidate_blocks"] == 3
    monkeypatch.delenv("CODILA_CONFIG")
    assert settings("--decoder", "dream")["max_new_tokens"] == 8  # another decoder: nothing to recommend
    # a recommended cache is on unless a flag, the environment or the config file says otherwise
    cfg["codila_decoding"].update(cache="prefix")
    (ar / "config.json").write_text(json.dumps(cfg))
    assert recommended_decoding(str(ar))["cache"] == "prefix"
    assert (settings()["cache"], settings()["cache_blocks"]) == ("prefix", 3)
    assert (settings("--cache", "none")["cache"], settings("--cache", "none")["cache_blocks"]) == ("none", None)
    assert settings("--cache", "dual")["cache"] == "dual"
    assert settings("--decoder", "threshold")["cache"] == "none"  # the recommendation is CoDiLA's
    s = settings("--ar-verify")  # verification cannot run with a cache: the recommended one and its window drop
    assert (s["ar_verify"], s["cache"], s["cache_blocks"]) == (True, "none", None)
    assert gen("--ar-verify", "--cache", "prefix", *base).exit_code == 2  # asked for together: still an error
    monkeypatch.setenv("CODILA_CACHE", "none")
    assert settings()["cache"] == "none"
    monkeypatch.delenv("CODILA_CACHE")
    for bad in ("fast", 1, None):  # not a cache mode: ignored, as other values of the wrong type
        cfg["codila_decoding"].update(cache=bad)
        (ar / "config.json").write_text(json.dumps(cfg))
        assert "cache" not in recommended_decoding(str(ar)) and settings()["cache"] == "none"
    cfg["codila_decoding"].update(cache="prefix", cache_blocks=-2)  # out of range: ignored too
    (ar / "config.json").write_text(json.dumps(cfg))
    assert recommended_decoding(str(ar))["cache"] == "prefix" and "cache_blocks" not in recommended_decoding(str(ar))



def test_helper_may_recommend_top_k_conditioning(tiny, tmp_path):
    """``conditioning`` "topk:K" in a helper's ``codila_decoding`` (session 19) is what gen runs unless
    --conditioning says otherwise; a malformed value is ignored; eval's default label spells it out."""
    import shutil

    from codila_cli.eval.settings import parse_setting, recommended_label
    from codila_cli.helper_card import recommended_decoding

    ar = tmp_path / "ar"
    shutil.copytree(tiny["ar"], ar)
    cfg = json.loads((ar / "config.json").read_text())
    base = ("--dlm", str(tiny["dlm"]), "--ar", str(ar), "--json", "--max-new-tokens", "8", "--seed", "0", "def f(")
    settings = lambda *extra: json.loads(gen(*extra, *base).stdout)["settings"]
    for value, expected in (("topk:16", "topk:16"), ("topk:0", "soft"), ("top16", "soft"), (16, "soft")):
        cfg["codila_decoding"] = {"conditioning": value, "candidate_blocks": 1}
        (ar / "config.json").write_text(json.dumps(cfg))
        assert settings()["conditioning"] == expected, value
    cfg["codila_decoding"] = {"conditioning": "topk:16", "candidate_blocks": 1}
    (ar / "config.json").write_text(json.dumps(cfg))
    assert settings("--conditioning", "soft")["conditioning"] == "soft"
    label = recommended_label(recommended_decoding(str(ar)))
    assert label == "codila:B=4,W=1,cond=topk:16"
    assert parse_setting(label, max_new_tokens=8).config.conditioning == "topk:16"


def test_helper_recommendation_for_one_block_size_applies_at_that_size(tiny, tmp_path, monkeypatch):
    """``by_block_size`` {"8": {...}} replaces the general recommendation when the block size is 8 (the
    user's -B, config or environment), and nowhere else; its own block_size and bad values are ignored."""
    import shutil

    from codila_cli.helper_card import recommended_decoding

    ar = tmp_path / "ar"
    shutil.copytree(tiny["ar"], ar)
    cfg = json.loads((ar / "config.json").read_text())
    cfg["codila_decoding"] = {"ar_context": 8, "ar_repetition_penalty": 1.3,
                              "by_block_size": {"8": {"ar_repetition_penalty": 1.7, "block_size": 2, "ar_context": "x"},
                                                "2": "not a table"}}
    (ar / "config.json").write_text(json.dumps(cfg))
    assert recommended_decoding(str(ar)) == {"ar_context": 8, "ar_repetition_penalty": 1.3}  # default B = 4
    assert recommended_decoding(str(ar), block_size=8) == {"ar_context": 8, "ar_repetition_penalty": 1.7}
    assert recommended_decoding(str(ar), block_size=2) == {"ar_context": 8, "ar_repetition_penalty": 1.3}
    base = ("--dlm", str(tiny["dlm"]), "--ar", str(ar), "--json", "--max-new-tokens", "8", "--seed", "0", "def f(")
    settings = lambda *extra: json.loads(gen(*extra, *base).stdout)["settings"]
    assert settings()["ar_repetition_penalty"] == 1.3
    s = settings("-B", "8")
    assert (s["block_size"], s["ar_repetition_penalty"], s["ar_context"]) == (8, 1.7, 8)
    assert settings("-B", "8", "--ar-repetition-penalty", "1.1")["ar_repetition_penalty"] == 1.1  # a flag wins
    conf = tmp_path / "config.toml"
    conf.write_text(f"[models]\nar = {json.dumps(str(ar))}\n[gen]\nblock_size = 8\n")
    monkeypatch.setenv("CODILA_CONFIG", str(conf))
    assert settings()["ar_repetition_penalty"] == 1.7
    from codila_cli.config import load_config
    from codila_cli.info import effective_settings

    rows = {r["key"]: r for r in effective_settings(load_config())}
    assert rows["gen.ar_repetition_penalty"]["value"] == 1.7 and "recommended by" in rows["gen.ar_repetition_penalty"]["source"]
    # the helper itself recommends B = 8: its B = 8 settings apply without a flag
    monkeypatch.delenv("CODILA_CONFIG")
    cfg["codila_decoding"]["block_size"] = 8
    (ar / "config.json").write_text(json.dumps(cfg))
    assert recommended_decoding(str(ar))["ar_repetition_penalty"] == 1.7
    assert settings("-B", "4")["ar_repetition_penalty"] == 1.3


def test_syntax_guard_comes_from_flag_env_config_or_helper(tiny, tmp_path, monkeypatch):
    """``ar_syntax_guard`` is off by default; a helper may recommend it; the config file, CODILA_AR_SYNTAX_GUARD
    and --ar-syntax-guard / --no-ar-syntax-guard override in that order; -v names it."""
    import shutil

    ar = tmp_path / "ar"
    shutil.copytree(tiny["ar"], ar)
    base = ("--dlm", str(tiny["dlm"]), "--ar", str(ar), "--json", "--max-new-tokens", "8", "--seed", "0", "def f(")
    guard = lambda *extra: json.loads(gen(*extra, *base).stdout)["settings"]["ar_syntax_guard"]
    assert guard() is False and guard("--ar-syntax-guard") is True
    cfg = json.loads((ar / "config.json").read_text())
    cfg["codila_decoding"] = {"ar_syntax_guard": True}
    (ar / "config.json").write_text(json.dumps(cfg))
    assert guard() is True and guard("--no-ar-syntax-guard") is False
    conf = tmp_path / "config.toml"
    conf.write_text("[gen]\nar_syntax_guard = false\n")
    monkeypatch.setenv("CODILA_CONFIG", str(conf))
    assert guard() is False
    monkeypatch.setenv("CODILA_AR_SYNTAX_GUARD", "1")
    assert guard() is True
    r = gen("-v", *[a for a in base if a != "--json"])
    assert r.exit_code == 0 and "sg=1" in r.stderr


def test_no_repeat_ngram_comes_from_flag_env_config_or_helper(tiny, tmp_path, monkeypatch):
    """``ar_no_repeat_ngram`` is 0 by default; a helper may recommend it; config file, env and flag override
    in that order; an out-of-range value is one Error line (exit 2); -v names it."""
    import shutil

    ar = tmp_path / "ar"
    shutil.copytree(tiny["ar"], ar)
    base = ("--dlm", str(tiny["dlm"]), "--ar", str(ar), "--json", "--max-new-tokens", "8", "--seed", "0", "def f(")
    ngram = lambda *extra: json.loads(gen(*extra, *base).stdout)["settings"]["ar_no_repeat_ngram"]
    assert ngram() == 0 and ngram("--ar-no-repeat-ngram", "6") == 6
    cfg = json.loads((ar / "config.json").read_text())
    cfg["codila_decoding"] = {"ar_no_repeat_ngram": 8}
    (ar / "config.json").write_text(json.dumps(cfg))
    assert ngram() == 8 and ngram("--ar-no-repeat-ngram", "0") == 0
    conf = tmp_path / "config.toml"
    conf.write_text("[gen]\nar_no_repeat_ngram = 12\n")
    monkeypatch.setenv("CODILA_CONFIG", str(conf))
    assert ngram() == 12
    monkeypatch.setenv("CODILA_AR_NO_REPEAT_NGRAM", "5")
    assert ngram() == 5
    r = gen("-v", *[a for a in base if a != "--json"])
    assert r.exit_code == 0 and "ng=5" in r.stderr
    bad = gen("--ar-no-repeat-ngram", "1", *base)
    assert bad.exit_code == 2 and bad.stdout == "" and "Error:" in bad.stderr and "no-repeat-ngram" in bad.stderr

def test_stdout_is_payload_only(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "-K", "4", "--max-new-tokens", "8", "--seed", "1", "def f(", "-v")
    assert r.exit_code == 0
    assert "\x1b[" not in r.stdout
    assert r.stdout.startswith("def f(") and "syntax:" not in r.stdout and "seed:" not in r.stdout
    assert "syntax:" in r.stderr and "seed: 1" in r.stderr
    assert "settings: dream:K=4  dlm: " in r.stderr and "(cpu, float32)" in r.stderr  # what ran, where, in what dtype


def test_quiet_leaves_only_payload(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "-K", "4", "--max-new-tokens", "8", "--seed", "1", "-q", "def f(")
    assert r.exit_code == 0 and r.stderr == ""


def test_seed_is_reported_when_random(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--json", "def f(")
    assert isinstance(json.loads(r.stdout)["seed"], int)


def test_missing_model_exits_3_with_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    r = gen("--dlm", "dream-coder", "def f(")
    assert r.exit_code == 3
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and str(tmp_path / "cache") in lines[0]
    assert lines[1] == "Hint: codila pull dream-coder"  # the pinned revision (issue 64: codila fetches it)


@pytest.mark.parametrize("flags", [
    ["-K", "0"], ["--steps", "-1"], ["--steps", "4", "-K", "2"], ["--top-p", "1.5"], ["--threshold", "0"],
    ["--max-new-tokens", "0"], ["--max-new-tokens", "10000000"], ["--conditioning", "topk:x"],
    ["--block-size", "0"], ["--temperature", "-1"], ["--decoder", "nope"],
])
def test_bad_flags_exit_2(tiny, flags):
    r = gen("--dlm", str(tiny["dlm"]), *flags, "def f(")
    assert r.exit_code == 2, (flags, r.stdout, r.stderr)
    assert r.stdout == ""


@pytest.mark.parametrize("flags,needle", [(["--cache-blocks", "2"], "--cache prefix"),
                                          (["--cache", "dual", "--cache-blocks", "0"], "cache-blocks")])
def test_bad_codila_cache_flags_exit_2(tiny, flags, needle):
    r = gen("--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), *flags, "def f(")
    assert r.exit_code == 2 and r.stdout == "" and needle in r.stderr, (r.stdout, r.stderr)


def test_codila_without_ar_is_usage_error(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "--decoder", "codila", "def f(")
    assert r.exit_code == 2 and "AR helper" in r.stderr


def test_strict_exits_4_on_invalid_code(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0", "--strict", "def f(")
    assert r.exit_code == 4
    assert r.stdout.startswith("def f(")  # the result is still printed
    assert "Error:" in r.stderr


def test_prompt_too_long_for_context(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "--max-new-tokens", "500", "x = 1\n" * 50)
    assert r.exit_code == 2 and "context" in r.stderr
    assert r.stdout == ""  # the streamer (on: no terminal, so no live view) wrote none of the prompt lines
    room = int(r.stderr.split("Hint: lower --max-new-tokens to ")[1].split()[0])  # the largest canvas that fits
    ok = gen("--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", str(room), "--seed", "0", "x = 1\n" * 50)
    assert ok.exit_code == 0, ok.stderr
    again = gen("--dlm", str(tiny["dlm"]), "--max-new-tokens", str(room + 1), "x = 1\n" * 50)
    assert again.exit_code == 2
    huge = gen("--dlm", str(tiny["dlm"]), "x = 1\n" * 600)
    assert huge.exit_code == 2 and "Hint: shorten the prompt to 384 tokens or less" in huge.stderr  # 512 − 128
    assert huge.stdout == ""


@pytest.mark.parametrize("prompt", ["", "   \n\t"])
def test_empty_prompt_exit_2(tiny, prompt):
    r = gen("--dlm", str(tiny["dlm"]), prompt)
    assert r.exit_code == 2 and r.stderr.startswith("Error: the prompt is empty")


def test_stdin_prompt_and_dash(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0", "--json", "-",
            input="def g(")
    assert json.loads(r.stdout)["text"].startswith("def g(")
    base = ("--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0")
    joined = json.loads(gen(*base, "--json", "def h(", input="# context").stdout)
    alone = json.loads(gen(*base, "--json", "def h(", input="").stdout)
    asked = json.loads(gen(*base, "--json", "--stdin", "def h(", input="# context").stdout)
    # piped text beside a prompt is context before it: the model reads it (more prompt tokens), and
    # neither stdout's text nor its syntax report holds it
    assert joined["text"] == asked["text"]  # --stdin only insists on waiting for stdin
    assert joined["text"].startswith("def h(") and "# context" not in joined["text"]
    assert joined["prompt_context"] == "# context\n\n" and "prompt_context" not in alone
    assert joined["metrics"]["prompt_tokens"] > alone["metrics"]["prompt_tokens"]
    assert gen(*base, "def h(", input="# context").stdout.startswith("def h(")


def test_gen_in_a_while_read_loop_runs_once_per_line_with_its_stdin_closed(tiny, tmp_path):
    """The shell loop of issue 41, in a real shell. Piped text beside a prompt is context (issue 50, as llm
    and ollama read it), so each call in such a loop gives ``< /dev/null`` (docs/usage.md): then each
    `codila gen "$line"` gets its own line. Without it the first call reads the rest of the file as its
    context, as documented, instead of silently dropping it."""
    import shutil

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def one(\ndef two(\ndef three(\n")

    def loop(redirect: str) -> list[str]:
        script = (f'while read -r line; do "{sys.executable}" -m codila_cli gen --dlm "{tiny["dlm"]}" -K 8 '
                  f'--max-new-tokens 8 --seed 0 -q --json "$line" {redirect} | "{sys.executable}" -c '
                  '"import json,sys; d = json.load(sys.stdin); print(d[\'text\'][:len(sys.argv[1])], '
                  'repr(d.get(\'prompt_context\')))" "$line"; done < ' + str(prompts))
        out = subprocess.run([shutil.which("bash") or "/bin/bash", "-c", script], capture_output=True, text=True,
                             timeout=300, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    assert loop("< /dev/null") == ["def one( None", "def two( None", "def three( None"]
    assert loop("") == ["def one( 'def two(\\ndef three(\\n\\n'"]


def test_invalid_utf8_stdin_exit_2(tiny):
    r = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "-"], input=b"\xff\xfe def")
    assert r.exit_code == 2 and "UTF-8" in r.stderr


def test_prompt_file(tiny, tmp_path):
    f = tmp_path / "p.py"
    f.write_text("def k(")
    r = gen("--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--json", "-f", str(f))
    assert json.loads(r.stdout)["text"].startswith("def k(")
    r = gen("--dlm", str(tiny["dlm"]), "-f", str(tmp_path / "missing.py"))
    assert r.exit_code == 2


def test_internal_errors_are_one_line_without_traceback(tiny, monkeypatch):
    import codila_cli.engine.generate as rt

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(rt, "generate", boom)
    r = gen("--dlm", str(tiny["dlm"]), "def f(")
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: internal error: RuntimeError: kaboom")
    assert "Traceback" not in r.stderr


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("codila ")


@pytest.mark.parametrize("gpu", [False, True])
def test_num_samples_json_consecutive_seeds(tiny, monkeypatch, gpu):
    import codila_cli.engine.generate as rt
    """-n N batches where batching pays (a GPU: one forward per step serves every row) and decodes the
    samples one after another on a CPU, where a batch is slower; the samples are the same either way."""

    monkeypatch.setattr(rt, "batching_pays", lambda models, config=None: gpu)
    # a step waits for every row (not 10 ms): on a loaded machine a row late from its own sampling caught the
    # next step instead, and the forward count depended on the load (issue 63: found beside a CPU hog)
    from codila_cli.decoding.batch import StepBatcher

    monkeypatch.setitem(StepBatcher.__init__.__kwdefaults__, "gather_s", 60.0)
    r = gen("--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--decoder", "codila", "-n", "3", "--temperature", "1",
            "--ar-temperature", "1", "--max-new-tokens", "16", "--seed", "40", "--json", "def f(")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["command"] == "gen" and [s["seed"] for s in doc["samples"]] == [40, 41, 42]
    assert all(s["text"].startswith("def f(") for s in doc["samples"])
    b = doc["batch"]
    rows = [s["metrics"]["dlm_forwards"] for s in doc["samples"]]
    assert b["rows"] == 3 and b["row_dlm_forwards"] == sum(rows) and b["batched"] is gpu
    assert b["batched_dlm_forwards"] == (max(rows) if gpu else sum(rows))
    # sample 2 is exactly what a single run with its seed gives
    one = gen("--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--decoder", "codila", "--temperature", "1",
              "--ar-temperature", "1", "--max-new-tokens", "16", "--seed", "41", "--json", "def f(")
    assert json.loads(one.stdout)["text"] == doc["samples"][1]["text"]


def test_num_samples_text_has_one_header_per_sample(tiny):
    r = gen("--dlm", str(tiny["dlm"]), "-n", "2", "-K", "4", "--max-new-tokens", "8", "--seed", "5", "def f(")
    assert r.exit_code == 0, r.stderr
    heads = [line for line in r.stdout.splitlines() if line.startswith("# codila sample")]
    assert heads == ["# codila sample 1/2 (seed 5)", "# codila sample 2/2 (seed 6)"]
    assert "every sample is the same" in r.stderr and "samples parse" in r.stderr


def test_origin_samples_differ_at_temperature_0_and_are_not_called_the_same(tiny):
    """Dream's origin rule draws which slots a step reveals, so at --temperature 0 two seeds still give two texts:
    no "every sample is the same" warning (there was one), and --exact refuses it as a rule that draws."""
    base = ("--dlm", str(tiny["dlm"]), "--decoder", "dream", "--alg", "origin", "--temperature", "0",
            "--max-new-tokens", "16", "--seed", "3")
    r = gen(*base, "-n", "4", "--json", "def f(")
    assert r.exit_code == 0, r.stderr
    assert len({s["text"] for s in json.loads(r.stdout)["samples"]}) > 1 and "every sample is the same" not in r.stderr
    r = gen(*base, "--exact", "def f(")
    assert r.exit_code == 2 and "Error: --exact verifies deterministic steps" in r.stderr


def test_temperature_reaches_the_codila_helper(tiny):
    """Static CoDiLA's helper writes every token, so --temperature alone must make it sample (it used
    to leave the helper greedy: N samples with N seeds were the same text and no warning said so)."""
    base = ("--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--decoder", "codila", "--max-new-tokens", "16",
            "--seed", "7", "-n", "4", "--json")
    r = gen(*base, "--temperature", "1.5", "def f(")
    assert r.exit_code == 0, r.stderr
    samples = json.loads(r.stdout)["samples"]
    assert {s["settings"]["ar_temperature"] for s in samples} == {1.5}
    assert len({s["text"] for s in samples}) > 1 and "every sample is the same" not in r.stderr
    # an explicit --ar-temperature wins; 0 keeps the helper greedy, and the warning says why
    r = gen(*base, "--temperature", "1.5", "--ar-temperature", "0", "def f(")
    samples = json.loads(r.stdout)["samples"]
    assert {s["settings"]["ar_temperature"] for s in samples} == {0.0}
    assert len({s["text"] for s in samples}) == 1
    assert "every sample is the same" in r.stderr and "--ar-temperature" in r.stderr


@pytest.mark.parametrize("n", ["0", "-1", "65", "100000"])
def test_num_samples_out_of_range_is_a_usage_error(tiny, n):
    r = gen("--dlm", str(tiny["dlm"]), "-n", n, "def f(")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith("Error: --num-samples must be between 1 and 64")


def test_parse_errors_are_plain_error_lines():
    """A flag the parser rejects ends with one plain `Error:` line (no Rich panel), exit 2."""
    r = CliRunner().invoke(app, ["gen", "--max-new-tokens", "abc", "x"])
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "--max-new-tokens" in lines[-1]
    assert "╭" not in r.stderr and "│" not in r.stderr


def test_console_parse_errors_get_one_error_line_and_a_hint():
    """Through the real entry point: exactly `Error: …` + `Hint: …` on stderr, nothing on stdout, exit 2;
    a bare `codila` prints its help (exit 2, as before)."""
    import subprocess
    import sys

    run = lambda *a: subprocess.run([sys.executable, "-m", "codila_cli", *a], capture_output=True, text=True, timeout=60)
    for args, words in ((["gen", "--max-new-tokens", "abc", "x"], "--max-new-tokens"), (["gen", "--bogus"], "--bogus"),
                        (["nope"], "nope"), (["plan", "--attention", "x", "p"], "--attention")):
        r = run(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert len(lines) == 2 and lines[0].startswith("Error: ") and words in lines[0], r.stderr
        assert lines[1].startswith("Hint: see `codila")
    r = run()
    assert r.returncode == 2 and r.stderr.startswith("Usage: codila") and "Error" not in r.stderr
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("codila ")


def test_stderr_report_lines_are_not_wrapped_into_a_pipe(tiny):
    """stderr into a pipe or a log: each report is one line, however long (Rich used to wrap at 80
    columns, splitting a syntax message across lines that grep and log parsers then miss)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]),
                        "-v", "--no-stream", "--max-new-tokens", "32", "--seed", "3", "def f(" + "x, " * 30],
                       capture_output=True, text=True, timeout=120, env=env, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert [line.split(":")[0].split(" (")[0] for line in lines] == [
        "syntax", "the canvas", "seed", "settings", "dlm forwards"], r.stderr
    assert max(len(line) for line in lines) > 80  # long enough that a wrap would show


@pytest.fixture(scope="module")
def chat_dlm(tiny, tmp_path_factory):
    """The tiny DLM with a chat template in its tokenizer_config.json (how Dream-Coder-Instruct ships)."""
    import shutil

    d = tmp_path_factory.mktemp("chat") / "dlm"
    shutil.copytree(tiny["dlm"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_system_message_with_and_without_a_chat_template(tiny, chat_dlm):
    """Chat models get --system as the system message (mode chat, prompt tokens include it, stdout is the
    extracted code, never the prompt); raw models read it as plain text, and a warning says so."""
    base = ("--decoder", "dream", "-K", "4", "--max-new-tokens", "8", "--seed", "0", "--json")
    plain = json.loads(gen("--dlm", str(chat_dlm), *base, "def f(").stdout)
    r = gen("--dlm", str(chat_dlm), *base, "--system", "You write Python.", "def f(")
    assert r.exit_code == 0 and "Warning" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "chat" and plain["mode"] == "chat"
    assert doc["metrics"]["prompt_tokens"] > plain["metrics"]["prompt_tokens"]
    from codila_cli.syntax import extract_code

    assert doc["text"] == extract_code(doc["completion"])  # stdout: the code, not the prompt
    r = gen("--dlm", str(tiny["dlm"]), *base, "--system", "You write Python.", "def f(")
    raw = json.loads(r.stdout)
    assert r.exit_code == 0 and raw["mode"] == "raw"
    assert r.stderr.startswith("Warning: ") and "no chat template" in r.stderr
    assert raw["text"].rstrip("\n") == ("def f(" + raw["completion"]).rstrip("\n")  # not the system text
    no_system = json.loads(gen("--dlm", str(tiny["dlm"]), *base, "def f(").stdout)
    assert raw["metrics"]["prompt_tokens"] > no_system["metrics"]["prompt_tokens"]  # but the model read it
    assert "Warning" not in gen("--dlm", str(tiny["dlm"]), *base, "-q", "--system", "x", "def f(").stderr


def test_unfinished_code_is_explained(tiny):
    """Invalid code from a canvas that ran out before the model's end token gets a line saying so
    (`metrics.ended` false); the JSON says whether the model ended."""
    args = ("--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--max-new-tokens", "8", "--seed", "0", "def f(")
    doc = json.loads(gen(*args, "--json").stdout)
    assert doc["metrics"]["ended"] is False and not doc["syntax"]["valid"]  # a random tiny model never ends
    r = gen(*args)
    assert r.stderr.splitlines()[1] == "the canvas (--max-new-tokens 8) filled up before the model wrote its end"
    r = gen(*args, "-n", "2", "--temperature", "1")
    assert "0 of 2 samples parse; the model had not finished 2 of them" in r.stderr
    assert len(gen(*args, "-q").stderr) == 0


def test_ended_is_true_when_the_model_writes_its_end_token(tiny_models, monkeypatch):
    from codila_cli.decoding.config import DreamConfig
    from codila_cli.engine.generate import generate

    eos = tiny_models.dlm.specials.eos
    real = tiny_models.dlm.logits

    def ending(x, **kw):  # every slot's argmax is the end token
        z = real(x, **kw).clone()
        z[..., eos] = 1e4
        return z

    monkeypatch.setattr(tiny_models.dlm, "logits", ending)
    res = generate(tiny_models, "def f(", decoder="dream", config=DreamConfig(max_new_tokens=8, tokens_per_step=2),
                   seed=0)
    assert res.metrics["ended"] is True and res.completion == ""


def test_long_work_says_how_far_it_is_on_a_piped_stderr(tiny, tmp_path):
    """gen -n and eval on a non-terminal stderr: one plain line per finished item with the count and the
    time left (issue 41); -q: none; stdout unchanged."""
    base = ["--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0", "-n", "3",
            "--temperature", "0.7", "def f("]
    r = gen(*base)
    assert r.exit_code == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("gen ")]
    assert [x.split()[1] for x in lines] == ["1/3", "2/3", "3/3"] and "left" in lines[0] and "seed 1)" in lines[1]
    quiet = gen(*base, "-q")
    assert not [x for x in quiet.stderr.splitlines() if x.startswith("gen ")] and quiet.stdout == r.stdout
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t/{i}", "prompt": f"def f{i}(x):\n", "test": "", "entry_point": None})
                             + "\n" for i in range(2)))
    ev = runner.invoke(app, ["eval", "-b", str(tasks), "--dlm", str(tiny["dlm"]), "--setting", "dream:K=8",
                             "--max-new-tokens", "8", "-o", str(tmp_path / "out")])
    assert ev.exit_code == 0, ev.stderr
    assert [x.split()[1] for x in ev.stderr.splitlines() if x.startswith("eval ")] == ["1/2", "2/2"]


def test_consistent_output_flags(tiny, tmp_path):
    """Issue 41's flags: gen --completion-only leaves the prompt out of stdout (streamed or not); eval
    --json prints one object with the summary and provenance, -v says where the files went and what made
    the numbers; doctor -q prints no table."""
    base = ["--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0", "def f("]
    full = gen(*base)
    for extra in ([], ["--no-stream"]):
        only = gen(*base, "--completion-only", *extra)
        assert only.exit_code == 0 and "def f(" + only.stdout == full.stdout
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"task_id": "t/0", "prompt": "def f(x):\n", "test": "", "entry_point": None}) + "\n")
    ev = runner.invoke(app, ["eval", "-b", str(tasks), "--dlm", str(tiny["dlm"]), "--setting", "dream:K=8",
                             "--max-new-tokens", "8", "-o", str(tmp_path / "out"), "--json", "-v"])
    assert ev.exit_code == 0, ev.stderr
    doc = json.loads(ev.stdout)
    assert doc["command"] == "eval" and doc["summary"][0]["setting"] == "dream:K=8"
    assert doc["provenance"]["models"]["dlm"]["dtype"] == "float32" and "static_findings" in doc["summary"][0]
    assert "Made by `codila" in ev.stderr and "torch" in ev.stderr and str(tmp_path / "out") in ev.stderr
    quiet = runner.invoke(app, ["doctor", "-q"])
    assert quiet.stdout == ""


@pytest.mark.parametrize("args, says", [
    (["gen", "--seed", "99999999999999999999", "def f("], "--seed"),  # was "Overflow when unpacking long long"
    (["gen", "--seed", "-1", "def f("], "--seed"),
    (["eval", "--timeout", "nan", "--limit", "1"], "--timeout must be a number of seconds above 0"),
    (["eval", "--timeout", "inf", "--limit", "1"], "--timeout must be a number of seconds above 0"),
    (["plan", ""], "the prompt is empty"),  # refused before any model loads
])
def test_bad_numbers_and_empty_plans_are_usage_errors(args, says):
    r = subprocess.run([sys.executable, "-m", "codila_cli", *args], capture_output=True, text=True, timeout=120,
                       check=False)  # the console script's own error format (CliRunner bypasses main's)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and says in r.stderr.splitlines()[0], r.stderr
    assert "Traceback" not in r.stderr and "Overflow" not in r.stderr


def test_control_characters_from_paths_and_task_ids_never_reach_the_terminal_raw(tiny, tmp_path):
    """Issue 40: a --dlm path and a task id carrying escape sequences are shown escaped in the Error line
    and in eval's progress lines."""
    r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", "/nope/\x1b[31mred\x07", "x"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode in (2, 3) and "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "\\x1b[31mred\\x07" in r.stderr
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"task_id": "t/\x1b]0;pwned\x07", "prompt": "def f(x):\n", "test": "",
                                 "entry_point": None}) + "\n")
    ev = runner.invoke(app, ["eval", "-b", str(tasks), "--dlm", str(tiny["dlm"]), "--setting", "dream:K=8",
                             "--max-new-tokens", "8", "-o", str(tmp_path / "out")])
    assert ev.exit_code == 0, ev.stderr
    assert "\x1b" not in ev.stderr and "\\x1b]0;pwned\\x07" in ev.stderr
    config = tmp_path / "c.toml"  # a config section's name reaches a Warning line; the completion its report
    config.write_text('["\\u001b[2Jwiped"]\nx = 1\n')
    g = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(tiny["dlm"]), "--max-new-tokens", "4",
                        "def f(x):\n    return 1"], capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "CODILA_CONFIG": str(config), "CODILA_NOTICE": "0"})
    assert g.returncode == 0, g.stderr
    assert "Warning: unknown config section [\\x1b[2Jwiped]" in g.stderr and "\x1b" not in g.stderr
