"""Configuration precedence, malformed files, and the models / doctor / config commands."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.config import load_config
from codila_cli.errors import UsageError

runner = CliRunner()


def write_config(tmp_path, monkeypatch, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("CODILA_CONFIG", str(path))
    return path


def test_precedence_flag_env_file_default(tiny, tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, f'[models]\ndlm = "{tiny["dlm"]}"\n[gen]\ntokens_per_step = 2\nmax_new_tokens = 8\n')
    base = ["gen", "--json", "--seed", "0", "--no-early-stop", "def f("]
    doc = json.loads(runner.invoke(app, base).stdout)  # file
    assert doc["settings"]["tokens_per_step"] == 2 and doc["settings"]["max_new_tokens"] == 8
    monkeypatch.setenv("CODILA_TOKENS_PER_STEP", "4")  # env beats file
    doc = json.loads(runner.invoke(app, base).stdout)
    assert doc["settings"]["tokens_per_step"] == 4
    doc = json.loads(runner.invoke(app, [*base[:-1], "-K", "8", "def f("]).stdout)  # flag beats env
    assert doc["settings"]["tokens_per_step"] == 8
    assert doc["metrics"]["tokens_per_step"] == 8.0


def test_malformed_config_names_file_and_line(tmp_path, monkeypatch, tiny):
    path = write_config(tmp_path, monkeypatch, '[gen]\nblock_size = 4\nbad line here\n')
    r = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "def f("])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"Error: config file {path} line 3")
    assert r.stdout == ""


def test_unknown_key_warns_and_wrong_type_fails(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, '[gen]\nblock_size = 4\nbogus = 1\n[other]\nx = 2\n')
    cfg = load_config()
    assert cfg.get("gen", "block_size") == 4
    assert any("gen.bogus" in w for w in cfg.warnings) and any("[other]" in w for w in cfg.warnings)
    write_config(tmp_path, monkeypatch, '[gen]\nblock_size = "four"\n')
    with pytest.raises(UsageError, match="block_size must be int"):
        load_config()
    write_config(tmp_path, monkeypatch, '[gen]\ntau = true\n')
    with pytest.raises(UsageError):
        load_config()


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_config_parser_only_raises_usage_errors(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(path)
    except UsageError:
        pass


def test_config_path_and_show_json(tmp_path, monkeypatch):
    path = write_config(tmp_path, monkeypatch, '[gen]\nblock_size = 8\n')
    r = runner.invoke(app, ["config", "path"])
    assert r.stdout.strip() == str(path)
    monkeypatch.setenv("CODILA_TAU", "0.25")
    doc = json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)
    rows = {s["key"]: s for s in doc["settings"]}
    assert rows["gen.block_size"]["value"] == 8 and rows["gen.block_size"]["source"].startswith("file")
    assert rows["gen.tau"]["source"] == "env CODILA_TAU"
    assert rows["gen.max_new_tokens"]["source"] == "default"


def test_config_show_names_what_gen_will_use(tmp_path, monkeypatch):
    """With no flag, `gen` on the bundled pair uses the helper's recommended CoDiLA settings and an AR
    temperature that follows --temperature; `config show` says so instead of the static defaults."""
    import dataclasses

    import codila_cli.engine.generate as runtime
    from codila_cli.helper_card import recommended_decoding

    write_config(tmp_path, monkeypatch, '[gen]\ntemperature = 0.3\n')
    rec = recommended_decoding("bundled-ar")
    assert rec, "the bundled helper carries codila_decoding in its config.json"
    rows = {r["key"]: r for r in json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)["settings"]}
    for key, value in rec.items():  # the cache window too: the helper also recommends a cache
        assert rows[f"gen.{key}"] == {"key": f"gen.{key}", "value": value, "source": "recommended by bundled-ar"}
    assert rows["gen.ar_temperature"]["value"] == 0.3 and rows["gen.ar_temperature"]["source"] == "follows gen.temperature"
    assert rows["models.dlm"]["value"] == "bundled-dlm" and rows["models.ar"]["value"] == "bundled-ar"
    # the same values are what gen runs with
    seen = {}

    def capture(models, text, *, config, **kw):
        seen.update(dataclasses.asdict(config))
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime, "generate", capture)
    runner.invoke(app, ["gen", "-q", "def f("])
    assert seen["ar_temperature"] == 0.3
    assert all(seen[k] == v for k, v in rec.items())
    # the cache turned off in the file: the recommended window is not shown (nor used)
    write_config(tmp_path, monkeypatch, '[gen]\ncache = "none"\n')
    rows = {r["key"]: r for r in json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)["settings"]}
    assert rows["gen.cache"]["value"] == "none" and rows["gen.cache"]["source"].startswith("file")
    assert rows["gen.cache_blocks"] == {"key": "gen.cache_blocks", "value": None, "source": "default"}
    seen.clear()
    runner.invoke(app, ["gen", "-q", "def f("])
    assert seen["cache"] == "none" and seen["cache_blocks"] is None
    monkeypatch.setenv("CODILA_MODEL", "dream-coder")  # a non-bundled DLM has no default helper
    rows = {r["key"]: r for r in json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)["settings"]}
    assert rows["models.ar"]["value"] is None and rows["gen.ar_context"]["source"] == "default"


def test_models_json_and_cache_status(tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tiny["hub"]))
    r = runner.invoke(app, ["models", "--json"])
    assert r.exit_code == 0 and "\x1b[" not in r.stdout
    doc = json.loads(r.stdout)
    aliases = {m["alias"]: m for m in doc["models"]}
    assert aliases["dream-coder"]["repo"] == "Dream-org/Dream-Coder-v0-Instruct-7B"
    assert aliases["dream-coder"]["cached"] is False and aliases["qwen3-0.6b"]["kind"] == "AR"
    r = runner.invoke(app, ["models", "-q"])
    assert all(line in aliases for line in r.stdout.split())


def test_doctor_reports_missing_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CODILA_MODEL", "dream-coder")
    r = runner.invoke(app, ["doctor", "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and any("dream-coder" in p for p in doc["problems"])
    assert "Error:" in r.stderr


def test_doctor_ok_with_local_models(tiny, monkeypatch):
    monkeypatch.setenv("CODILA_MODEL", str(tiny["dlm"]))
    monkeypatch.setenv("CODILA_AR_MODEL", str(tiny["ar"]))
    r = runner.invoke(app, ["doctor"])
    assert r.exit_code == 0, r.stdout + r.stderr


def test_every_gen_setting_with_a_default_can_be_set_in_the_config_file():
    """config.toml's [gen] table accepts every `codila gen` setting that has a library default (the
    file sits between the environment and the defaults in the precedence)."""
    from codila_cli.config import SCHEMA
    from codila_cli.resolve import GEN_DEFAULTS

    runtime = {"device", "dtype"}
    assert set(GEN_DEFAULTS) - runtime == set(SCHEMA["gen"])
    assert runtime == set(SCHEMA["runtime"])


def test_doctor_plans_dtype_and_memory_and_flags_weights_that_do_not_fit(tiny, monkeypatch):
    """doctor says what `--dtype auto` resolves to per model and how much memory the weights take, and
    fails (exit 1, Error + Hint) when the load's fit check would refuse them."""
    monkeypatch.setenv("CODILA_MODEL", str(tiny["dlm"]))
    monkeypatch.setenv("CODILA_AR_MODEL", str(tiny["ar"]))
    monkeypatch.setenv("CODILA_DEVICE", "cpu")
    r = runner.invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert "in float32 on cpu (--dtype auto)" in checks["weights dlm"]["value"]
    assert checks["memory"]["ok"]
    monkeypatch.setenv("CODILA_DTYPE", "bfloat16")
    checks = {c["name"]: c for c in json.loads(runner.invoke(app, ["doctor", "--json"]).stdout)["checks"]}
    assert "in bfloat16 on cpu (--dtype bfloat16)" in checks["weights ar"]["value"]
    monkeypatch.setenv("CODILA_MEMORY_LIMIT", "1M")  # the fit check every load runs decides (models/fit.py)
    r = runner.invoke(app, ["doctor"])
    assert r.exit_code == 1
    assert "BAD  memory" in r.stdout
    err = r.stderr.strip().splitlines()
    assert err[0].startswith("Error: the models need about") and "(CODILA_MEMORY_LIMIT)" in err[0]
    assert err[-1].startswith("Hint:")


def test_config_set_checks_the_key_and_the_value_and_keeps_the_rest_of_the_file(tmp_path):
    """`codila config set`: a known key with a value in its knob's range is written (comments and other
    keys kept); an unknown key or a value out of range is a usage error and the file is unchanged;
    `unset` removes the key."""
    from codila_cli.config import load_config, set_value
    from codila_cli.errors import UsageError

    cfg = tmp_path / "c.toml"
    cfg.write_text("# mine\n[gen]\nmax_new_tokens = 64  # short\n")
    set_value("gen.block_size", "8", path=cfg)
    set_value("gen.stop", "def ,class ", path=cfg)
    assert "# mine" in cfg.read_text() and "# short" in cfg.read_text()
    user = load_config(cfg)
    assert (user.get("gen", "block_size"), user.get("gen", "max_new_tokens"), user.get("gen", "stop")) == (8, 64, ("def ", "class "))
    before = cfg.read_text()
    for key, value, says in (("gen.nope", "1", "unknown config key"), ("gen.block_size", "0", "1–256"),
                             ("gen.ar_syntax_guard", "maybe", "bool"), ("runtime.dtype", "float8", "float32")):
        with pytest.raises(UsageError, match=says):
            set_value(key, value, path=cfg)
    assert cfg.read_text() == before
    set_value("gen.block_size", None, path=cfg)
    assert load_config(cfg).get("gen", "block_size") is None


def test_config_set_writes_only_over_a_regular_file_and_keeps_its_link_mode_and_owner(tmp_path):
    """Issue 53: `codila config set` replaced a FIFO, a device, a symlinked or hard-linked config and reset
    the mode, and read /dev/zero until memory ran out. Now: what is not a regular file is refused
    untouched (a FIFO, a link to /dev/zero, a directory; nothing read past the config limit), a
    hard-linked one too; a symlink's target is written and the link kept; the mode and owner stay."""
    import stat

    from codila_cli.config import set_value
    from codila_cli.errors import CodilaError

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    for path in (fifo, zero, folder):
        with pytest.raises(CodilaError, match="not a"):
            set_value("gen.block_size", "8", path=path)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.readlink(zero) == "/dev/zero" and folder.is_dir()
    real = tmp_path / "real.toml"
    real.write_text("[gen]\nmax_new_tokens = 64\n")
    os.chmod(real, 0o640)
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    set_value("gen.block_size", "8", path=link)
    assert link.is_symlink() and "block_size = 8" in real.read_text() and "max_new_tokens = 64" in real.read_text()
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o640 and os.stat(real).st_uid == os.getuid()
    twin = tmp_path / "twin.toml"
    os.link(real, twin)
    before = real.read_text()
    with pytest.raises(CodilaError, match="hard links"):
        set_value("gen.block_size", "16", path=real)
    assert real.read_text() == twin.read_text() == before and os.stat(real).st_nlink == 2


def test_a_change_made_while_codila_writes_is_never_lost(tmp_path, monkeypatch):
    """Issue 53: an edit saved during codila's write and fsync was overwritten. The version on disk is
    checked against what codila read as it is swapped in: the other writer's stays, codila's goes beside
    it (FileChangedError names it), for `config set` and for `infill --in-place` alike."""
    from codila_cli import atomic
    from codila_cli.config import set_value
    from codila_cli.infill_files import FileChangedError, read_source, write_in_place

    cfg = tmp_path / "c.toml"
    cfg.write_text("[gen]\nmax_new_tokens = 64\n")
    real_fsync = os.fsync

    def editor_saves(path, text):
        def fsync(fd):
            real_fsync(fd)
            path.write_text(text)  # the user's editor saves while codila's new version is being synced
        return fsync

    monkeypatch.setattr(atomic.os, "fsync", editor_saves(cfg, "[gen]\nmax_new_tokens = 99\n"))
    with pytest.raises(FileChangedError, match="changed on disk"):
        set_value("gen.block_size", "8", path=cfg)
    assert cfg.read_text() == "[gen]\nmax_new_tokens = 99\n"
    assert "block_size = 8" in (tmp_path / "c.toml.codila-new").read_text()
    src_path = tmp_path / "m.py"
    src_path.write_text("def f(x):\n    return x\n")
    src = read_source(str(src_path))
    from codila_cli import infill_files

    monkeypatch.setattr(infill_files.os, "fsync", editor_saves(src_path, "def f(x):\n    return x + 1  # mine\n"))
    with pytest.raises(FileChangedError):
        write_in_place(src, "def f(x):\n    return 2 * x\n")
    assert src_path.read_text() == "def f(x):\n    return x + 1  # mine\n"
    assert (tmp_path / "m.py.codila-new").read_text() == "def f(x):\n    return 2 * x\n"
    monkeypatch.setattr(infill_files.os, "fsync", real_fsync)
    monkeypatch.setattr(atomic.os, "fsync", real_fsync)
    (tmp_path / "m.py.codila-new").unlink()
    src = read_source(str(src_path))
    write_in_place(src, "def f(x):\n    return 3 * x\n")  # no one else wrote: it is swapped in
    assert src_path.read_text() == "def f(x):\n    return 3 * x\n" and not (tmp_path / "m.py.codila-new").exists()
