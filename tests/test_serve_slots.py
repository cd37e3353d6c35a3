"""Issue 60, the server's part: no abandoned stream holds a batch slot, no slow body holds a descriptor,
no request path writes a line of its own into the log, and the smaller things real clients hit (a timed
fill's prompt_n, HEAD /, greedy n_cmpl, errors in the request's own words, a key read with its newline).
Each test runs a real ``codila serve`` process on the bundled models and talks to it over real sockets."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
from test_serve import Server

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")


def _abandon(port: int, path: str, body: dict) -> None:
    """Send a whole request, then close the connection before the first byte of the answer."""
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)


def _wait_idle(url: str, seconds: float = 120) -> dict:
    """/health once no slot is taken, or the last answer when ``seconds`` passed first."""
    deadline = time.time() + seconds
    while True:
        health = httpx.get(url + "/health", timeout=30).json()
        if health["running"] == 0 or time.time() > deadline:
            return health
        time.sleep(0.1)


STREAMS = [("/v1/completions", {"prompt": "def f(x):", "max_tokens": 16, "stream": True}),
           ("/infill", {"input_prefix": "def f(x):\n", "input_suffix": "\n", "n_predict": 16, "stream": True}),
           ("/api/generate", {"model": "codila", "prompt": "def f(x):", "options": {"num_predict": 16}})]


def test_abandoned_streams_never_hold_a_batch_slot():
    """A client that closes a streamed request before its first byte (an editor aborting on a keystroke)
    left its slot taken for ever: with --max-batch 2, a burst of such requests filled both slots and every
    later request got 429. Now the slots come back and every endpoint answers afterwards."""
    s = Server("--max-batch", "2", "--max-queue", "4", "-q")
    try:
        for path, body in STREAMS:
            for _ in range(12):
                _abandon(s.port, path, body)
            assert _wait_idle(s.url)["running"] == 0, path
        for path, body in STREAMS:
            r = httpx.post(s.url + path, json={**body, "stream": False}, timeout=120)
            assert r.status_code == 200, (path, r.text)
        assert _wait_idle(s.url)["running"] == 0
    finally:
        s.stop()


def test_a_slow_body_is_answered_408_and_closed_and_the_server_stays_reachable():
    """A head, then a body a byte at a time: the body has --idle-timeout seconds after its head (it had no
    limit, so 1,100 such clients held every descriptor)."""
    s = Server("--idle-timeout", "1", "-q")
    try:
        conns = []
        for _ in range(4):
            c = socket.create_connection(("127.0.0.1", s.port))
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 400\r\n\r\n{")
            conns.append(c)
        answers = []
        for c in conns:
            c.settimeout(60)
            got = b""
            try:
                for _ in range(400):  # a byte at a time until the server closes the connection
                    c.sendall(b" ")
                    chunk = c.recv(4096) if _readable(c, 0.2) else b""
                    got += chunk
                    if chunk == b"" and _closed(c):
                        break
            except OSError:  # reset while writing: the server closed it
                pass
            got += _drain(c)
            answers.append(got)
            c.close()
        for got in answers:
            assert got.startswith(b"HTTP/1.1 408"), got[:200]
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200
    finally:
        s.stop()


def _readable(c: socket.socket, seconds: float) -> bool:
    import select

    return bool(select.select([c], [], [], seconds)[0])


def _closed(c: socket.socket) -> bool:
    try:
        return c.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _drain(c: socket.socket) -> bytes:
    out = b""
    try:
        while _readable(c, 1):
            chunk = c.recv(4096)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    return out


def test_a_request_path_cannot_forge_a_log_line_and_head_is_answered():
    s = Server()
    try:
        assert httpx.get(s.url + "/x%0a127.0.0.1%20GET%20/forged%20200%201ms", timeout=10).status_code == 404
        assert httpx.head(s.url + "/", timeout=10).status_code == 200  # Ollama's clients check a server so
        deadline = time.time() + 10
        while not any("HEAD / 200" in line for line in s.lines) and time.time() < deadline:
            time.sleep(0.05)
        log = "".join(s.lines)
        assert "HEAD / 200" in log
        assert not re.search(r"^127\.0\.0\.1 GET /forged", log, re.MULTILINE), log
        assert "/x\\n127.0.0.1 GET /forged 200 1ms 404" in log  # one line, its line break shown escaped
    finally:
        s.stop()


def test_greedy_n_cmpl_decodes_one_alternative_and_sampled_ones_differ_in_seed():
    """llama.vscode asks for n_cmpl 3 at temperature 0 and drops repeated alternatives: three equal texts
    were three decodes for one suggestion. At temperature 0 codila decodes one (a list of one); a sampled
    request still gets its N alternatives, seeds seed…seed+N−1."""
    s = Server("-q")
    try:
        body = {"input_prefix": "def add(a, b):\n", "input_suffix": "\n", "n_predict": 16, "seed": 3, "n_cmpl": 3}
        before = _forwards(s.url)
        greedy = httpx.post(s.url + "/infill", json=body, timeout=120).json()
        one = _forwards(s.url) - before
        assert isinstance(greedy, list) and len(greedy) == 1 and greedy[0]["codila"]["dlm_forwards"] == one > 0
        sampled = httpx.post(s.url + "/infill", json={**body, "temperature": 0.8}, timeout=120).json()
        assert [a["codila"]["seed"] for a in sampled] == [3, 4, 5]
    finally:
        s.stop()


def _forwards(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r'^codila_forwards_total\{kind="dlm"\} (\S+)$', text, re.MULTILINE))


def test_errors_name_the_requests_own_fields_never_a_command_line_flag():
    """A prompt that fills the context alone, or a token limit out of range, named --max-new-tokens to API
    clients; each endpoint now names its own field (max_tokens, n_predict, options.num_predict)."""
    s = Server("-q", "--max-body", "1048576")
    try:
        long = "x = 1\n" * 4000
        cases = [("/v1/completions", {"prompt": long, "max_tokens": 8}, "max_tokens"),
                 ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}], "max_tokens": 8},
                  "max_tokens"),
                 ("/api/generate", {"model": "codila", "prompt": long, "stream": False}, "options.num_predict"),
                 ("/completion", {"prompt": long, "n_predict": 8}, "n_predict"),
                 ("/infill", {"input_prefix": "def f():", "input_suffix": "\n", "n_predict": 100000}, "n_predict"),
                 ("/v1/completions", {"prompt": "def f():", "suffix": "\n", "max_tokens": 100000}, "max_tokens")]
        for path, body, field in cases:
            r = httpx.post(s.url + path, json=body, timeout=120)
            assert r.status_code == 400, (path, r.text)
            err = r.json()["error"]
            message = err if isinstance(err, str) else err["message"]
            assert "--" not in message and field in message, (path, message)
    finally:
        s.stop()


def test_an_api_key_read_with_its_newline_still_matches_and_the_start_says_so():
    s = Server("-q", env={"CODILA_API_KEY": "  secret-key\n"})
    try:
        assert any("Warning: the API key has spaces or a line break around it" in line for line in s.lines)
        ok = httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer secret-key"}, timeout=10)
        assert ok.status_code == 200
        assert httpx.get(s.url + "/v1/models", timeout=10).status_code == 401
    finally:
        s.stop()


def test_a_block_diffusion_infill_model_is_refused_at_start_and_health_names_each_model_once():
    """Issue 63, item 4: `serve --infill-dlm <an SDAR model>` started, then answered every /infill with 400;
    a model that is both the DLM and the infill model was listed twice."""
    import subprocess
    import sys
    from pathlib import Path

    sdar = Path(__file__).parent / "fixtures" / "sdar" / "checkpoints" / "sdar-tiny-a"
    r = subprocess.run([sys.executable, "-m", "codila_cli", "serve", "--port", "0", "--infill-dlm", str(sdar)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "listening" not in r.stderr, r.stderr
    assert "Error: --infill-dlm" in r.stderr and "block-diffusion" in r.stderr and "Hint:" in r.stderr
    s = Server("-q", "--dlm", "bundled-infill", "--infill-dlm", "bundled-infill")
    try:
        health = httpx.get(s.url + "/health", timeout=10).json()
        assert health["models"] == ["bundled-infill"], health
        names = [m["id"] for m in httpx.get(s.url + "/v1/models", timeout=10).json()["data"]]
        assert len(names) == len(set(names)), names
    finally:
        s.stop()
