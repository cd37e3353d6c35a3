"""``codila pull`` (issue 64, item 1) against a hub-shaped HTTP server on 127.0.0.1 (tests/hub.py), with the
real ``huggingface_hub`` client in real ``codila`` processes: a full pull and a load of what it pulled, a
pull resumed after the server drops the connection mid-file, a corrupted byte refused, a gated answer,
a disk too small, and Ctrl-C leaving a resumable state that never looks complete."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub import FakeHub

SDAR = Path(__file__).parent / "fixtures" / "sdar" / "checkpoints" / "sdar-tiny-a"
REPO = "codila-test/tiny"


@pytest.fixture
def repo(tmp_path):
    folder = tmp_path / "remote"
    shutil.copytree(SDAR, folder)
    (folder / "README.md").write_text("# a model card\n")
    (folder / "modeling_sdar.py").write_text("raise SystemExit('remote code must never be fetched')\n")
    return folder


def _pull(hub: FakeHub, cache: Path, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codila_cli", "pull", *args], capture_output=True, text=True,
                          timeout=120, check=False, env=_env(hub, cache, env), **kw)


def _env(hub: FakeHub, cache: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    return {**env, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1", **(extra or {})}


def _snapshot(cache: Path, hub: FakeHub) -> Path:
    return cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / hub.commit


def test_a_pull_fetches_only_what_codila_loads_verifies_it_and_records_the_commit(repo, tmp_path):
    hub = FakeHub(repo, repo_id=REPO)
    cache = tmp_path / "cache"
    try:
        r = _pull(hub, cache, REPO, "--json", env={"HF_TOKEN": "hf_secret"})
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("\n") == 1 and json.loads(r.stdout)["models"][0]["commit"] == hub.commit
        snap = _snapshot(cache, hub)
        assert sorted(p.name for p in snap.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                          "tokenizer.json", "tokenizer_config.json"]
        assert all((snap / n).read_bytes() == (repo / n).read_bytes() for n in ("config.json", "model.safetensors"))
        assert "Bearer hf_secret" in hub.tokens  # HF_TOKEN reaches the hub
        assert (cache / "models--codila-test--tiny" / "refs" / "codila").read_text() == hub.commit
        assert f"@ {hub.commit}" in r.stderr and "verified" in r.stderr
        again = _pull(hub, cache, REPO)
        assert again.returncode == 0 and "already in the cache" in again.stderr
        assert hub.downloads.count("model.safetensors") == 1  # nothing fetched twice
    finally:
        hub.close()
    # the recorded commit is what a later load uses (no refs/main: the pull named no revision)
    gen = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", REPO, "--max-new-tokens", "4", "--json",
                          "def f():"], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "HF_HUB_CACHE": str(cache)})
    assert gen.returncode == 0, gen.stderr
    assert json.loads(gen.stdout)["models"]["dlm"]["path"] == str(_snapshot(cache, hub))


def test_a_dropped_connection_is_resumed_with_a_range_request(repo, tmp_path):
    """The server drops the connection near the end of a 4 MiB file: the pull goes on from where the bytes
    stopped (an HTTP range), and the file is whole and verified."""
    (repo / "model-00002.safetensors").write_bytes(os.urandom(4 * 2**20))
    hub = FakeHub(repo, repo_id=REPO, drop_once="model-00002.safetensors")
    try:
        r = _pull(hub, tmp_path / "cache", REPO)
        assert r.returncode == 0, r.stderr
        assert any(x.startswith("model-00002.safetensors bytes=") and not x.endswith("=0-") for x in hub.ranges), hub.ranges
        got = (_snapshot(tmp_path / "cache", hub) / "model-00002.safetensors").read_bytes()
        assert got == (repo / "model-00002.safetensors").read_bytes()
    finally:
        hub.close()


def test_a_corrupted_byte_is_refused_and_no_snapshot_looks_complete(repo, tmp_path):
    hub = FakeHub(repo, repo_id=REPO, corrupt="model.safetensors")
    try:
        r = _pull(hub, tmp_path / "cache", REPO)
    finally:
        hub.close()
    assert r.returncode == 1 and r.stdout == ""
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and "model.safetensors does not match the hub's checksum" in err[0], r.stderr
    snap = _snapshot(tmp_path / "cache", hub)
    assert not (snap / "config.json").exists() and not (snap / "model.safetensors").exists()


def test_a_gated_repository_names_the_page_where_its_licence_is_accepted(repo, tmp_path):
    hub = FakeHub(repo, repo_id=REPO, gated=True)
    try:
        r = _pull(hub, tmp_path / "cache", REPO)
    finally:
        hub.close()
    assert r.returncode == 1, r.stderr
    assert f"Error: '{REPO}' ({REPO}) is gated: accept its licence at https://huggingface.co/{REPO}" in r.stderr
    assert "Hint:" in r.stderr and "HF_TOKEN" in r.stderr and "Traceback" not in r.stderr


def test_a_disk_too_small_is_refused_before_the_first_byte(repo, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root, or no mount permission)")
    hub = FakeHub(repo, repo_id=REPO)
    try:
        r = _pull(hub, small / "cache", REPO)
        assert r.returncode == 1 and "more on the disk of" in r.stderr and "free" in r.stderr, r.stderr
        assert hub.downloads == []  # refused before the first byte
        assert not any((small / "cache").rglob("config.json"))
    finally:
        hub.close()
        subprocess.run(["umount", str(small)], capture_output=True)


def _interruptible() -> None:
    """In the child: Ctrl-C does its default, even where the test run inherited it ignored (a background job),
    which codila, as Python, then keeps ignoring (tests/test_signals.py)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_a_resumable_pull_that_never_looks_complete(repo, tmp_path):
    (repo / "model-00002.safetensors").write_bytes(os.urandom(6 * 2**20))  # a slow, large second file
    hub = FakeHub(repo, repo_id=REPO, delay=0.03)
    cache = tmp_path / "cache"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "codila_cli", "pull", REPO], env=_env(hub, cache),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_interruptible)
        blobs = cache / "models--codila-test--tiny" / "blobs"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(b.stat().st_size >= 2**21 for b in blobs.glob("*.incomplete")):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert not (_snapshot(cache, hub) / "config.json").exists()  # never a snapshot that looks complete
        assert any(blobs.glob("*.incomplete"))  # what came so far is kept for the next pull
        hub.delay = 0.0
        r = _pull(hub, cache, REPO)
        assert r.returncode == 0, r.stderr
        assert any(x.startswith("model-00002.safetensors bytes=") for x in hub.ranges), hub.ranges  # resumed
        assert (_snapshot(cache, hub) / "config.json").exists()
    finally:
        hub.close()


def test_two_pulls_of_one_model_at_once_both_end_with_a_whole_snapshot(repo, tmp_path):
    """Each file is fetched under the cache's lock: the second pull waits for the first, then finds the file,
    instead of appending to the same partial file."""
    (repo / "model-00002.safetensors").write_bytes(os.urandom(2 * 2**20))
    hub = FakeHub(repo, repo_id=REPO, delay=0.02)
    cache = tmp_path / "cache"
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "codila_cli", "pull", REPO], env=_env(hub, cache),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        snap = _snapshot(cache, hub)
        assert (snap / "model-00002.safetensors").read_bytes() == (repo / "model-00002.safetensors").read_bytes()
        assert hub.downloads.count("model-00002.safetensors") == 1  # fetched once, by whichever came first
    finally:
        hub.close()
