"""``codila serve``: the engine behind OpenAI, llama.cpp and Ollama endpoints (docs/serve.md)."""

from __future__ import annotations

import ipaddress
import os
import sys
from typing import Annotated, Any

import typer

from codila_cli.cli.options import (
    NoFitCheck,
    Quant,
    Quantize,
    QuantizeAr,
    Quiet,
    ar_option,
    dlm_option,
    knob_option,
    knob_value,
)
from codila_cli.errors import UsageError
from codila_cli.ui.terminal import say


def _loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    dlm: dlm_option("Diffusion model: alias, repo id or directory. [default: bundled-dlm]") = None,
    ar: ar_option("AR helper for CoDiLA. [default: bundled-ar with the bundled DLM]") = None,
    infill_dlm: Annotated[str | None, typer.Option("--infill-dlm", help="Model for fill-in-the-middle requests (suffix, /infill). [default: bundled-infill with the bundled pair, else dreamon where it is cached, else none]")] = None,
    host: Annotated[str, typer.Option(envvar="CODILA_HOST", help="Address to listen on; anything but loopback needs --api-key or --no-auth.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="CODILA_PORT", help="Port to listen on (0: any free port, printed on stderr).")] = 8012,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="CODILA_API_KEY", help="Require Authorization: Bearer KEY on every endpoint but /health.")] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Listen on a non-loopback address without an API key.")] = False,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Rows decoded together at most (a request with n choices takes n); 1–256.")] = 8,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait for a slot; more get 429 with Retry-After.")] = 32,
    timeout: Annotated[float, typer.Option("--timeout", help="Per-request deadline in seconds; past it the request is cancelled (504).")] = 300.0,
    max_body: Annotated[int, typer.Option("--max-body", help="Largest request body in bytes (413 above).")] = 1 << 20,
    idle_timeout: Annotated[float, typer.Option("--idle-timeout", help="Seconds a connection may take to send a whole request head (after it connects or after its last answer), and then its whole body; an idle or slow one is closed then (a slow body gets 408). A request being answered is never cut by it.")] = 10.0,
    deterministic: Annotated[bool, typer.Option("--deterministic", help="Every request runs its own forwards, never stacked with others': its bits are those it gets alone on any hardware (a GPU's GEMMs round by batch size), at the cost of batching's speed-up.")] = False,
    lanes: Annotated[int, typer.Option("--lanes", help="Batched steps that run at once, each on its own cohort of requests with cores/lanes torch threads; 0 = auto: 2 on a CPU with 2 or more cores (a cohort samples while the other's forward runs), 1 on a GPU; 1–8.")] = 0,
    device: knob_option("device") = None,
    dtype: knob_option("dtype") = None,
    no_fit_check: NoFitCheck = False,
    quantize: Quantize = Quant.none,
    quantize_ar: QuantizeAr = Quant.none,
    threads: Annotated[int, typer.Option("--threads", envvar="CODILA_THREADS", min=0, max=1024, help="CPU threads torch runs, shared by the lanes; 0 = auto: every usable core (a server owns its machine; cap it when other work runs there).", rich_help_panel="Runtime")] = 0,
    quiet: Quiet = False,
) -> None:
    """Serve the models over HTTP: OpenAI /v1/completions and /v1/chat/completions, llama.cpp /infill,
    Ollama /api/generate, /metrics. Requests are decoded together, step by step.

    Examples:

        codila serve

        codila serve --host 0.0.0.0 --api-key "$KEY" --max-batch 16
    """
    from codila_cli.config import load_config
    from codila_cli.resolve import resolve_gen

    api_key = _check(host=host, port=port, api_key=api_key, no_auth=no_auth, max_batch=max_batch,
                     max_queue=max_queue, timeout=timeout, max_body=max_body, lanes=lanes, idle_timeout=idle_timeout)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise UsageError("codila serve needs its extra: FastAPI, uvicorn and prometheus-client",
                         hint='pip install "codila[serve]"') from None
    user = load_config()
    # the stacked KV-cached and helper forwards need the native engine: a server uses it for every
    # checkpoint it runs exactly (Dream-Coder-7B, Qwen3-0.6B), not only the bundled ones; CODILA_ENGINE wins
    os.environ.setdefault("CODILA_ENGINE", "native")
    from codila_cli.engine.threads import reproducible_gemm

    reproducible_gemm()  # before the first GEMM: a request alone may then take every core (_lanes)
    if deterministic:  # cuBLAS picks one algorithm per shape only with a fixed workspace; before CUDA starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    flags = {"device": device, "dtype": knob_value(dtype)}
    base = resolve_gen(flags, user=user, dlm=dlm, ar=ar)
    infill_name = infill_dlm or _default_infill(base.dlm)
    _check_infill_model(infill_name)
    from codila_cli.engine import Engine

    engine = Engine.load(dlm=base.dlm, ar=base.ar, infill_dlm=infill_name, device=base.device, dtype=base.dtype,
                         settings=base, threads=threads, server=True, quantize=quantize.value,
                         quantize_ar=quantize_ar.value)
    engine.lanes, engine.stack = _lanes(lanes, engine), not deterministic
    if engine.threads.warning and not quiet:
        say(f"Warning: {engine.threads.warning}\n")
    from codila_cli.serve.app import ServeConfig, create_app

    app = create_app(engine, ServeConfig(api_key=api_key, max_batch=max_batch, max_queue=max_queue,
                                               deadline_s=timeout, max_body=max_body, quiet=quiet))
    from codila_cli.serve.conn import protocol_class, raise_descriptor_limit

    raise_descriptor_limit()  # idle sockets meet --idle-timeout before the descriptor limit
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, lifespan="on", http=protocol_class(idle_timeout))
    server = _server_class()(config)
    server.runner = app.app.state.runner
    if not quiet:
        what = f"{base.dlm} + {base.ar}" if base.ar else base.dlm
        fill = f", infill {infill_name}" if infill_name else ", no infill model"
        say(f"codila serve: {what} ({base.decoder}){fill}; loaded in "
            f"{engine.models.load_seconds:.1f} s; max batch {max_batch}, {engine.lanes} lane(s)"
            f"{'; a request alone uses every core' if engine.wide else ''}"
            f"{'; deterministic: no request shares a forward' if deterministic else ''}\n")
    _announce(server, host, quiet=quiet)
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind: the port was taken after the check above
        if server.started:
            raise
        from codila_cli.errors import PortInUseError

        raise PortInUseError(f"cannot listen on {host}:{port} (taken since codila checked it)",
                             hint="pass another --port") from None


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server that cancels the running requests as soon as SIGTERM / SIGINT arrives (their
        streams end with an error event), instead of after its graceful wait for their connections."""

        runner: Any = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.runner is not None:
                self.runner.stop_now()
            super().handle_exit(sig, frame)

    return Server


def _lanes(asked: int, engine: Any) -> int:
    """--lanes: 0 picks 2 on a CPU with 2+ threads, else 1. On a CPU torch then runs threads/lanes each, so
    the lanes' forwards share the cores instead of fighting over them, and Python hands the GIL on every
    0.2 ms instead of 5: a forward takes the GIL back between its ops, and at the default interval the
    other cohort's sampling held each of those up (8 clients: 1.40× → 1.60× the one-after-another
    tokens/s on the 2-core build machine, benchmarks/serve_load.py). A request alone takes every core
    where the models' bits do not depend on the thread count (engine/threads.py::thread_invariant)."""
    import os

    from codila_cli.engine.threads import thread_invariant, use_threads

    cpu = engine.models.dlm.device.type == "cpu"
    cores = engine.threads.count if engine.threads is not None else (os.cpu_count() or 1)
    lanes = asked or (2 if cpu and cores >= 2 else 1)
    if cpu and lanes > 1:
        narrow = max(1, cores // lanes)
        models = [m.dlm.model for m in (engine.models, engine.infill_models) if m is not None]
        models += [engine.models.ar.model] if engine.models.ar is not None else []
        engine.wide = thread_invariant(list({id(m): m for m in models}.values()), narrow=narrow, wide=cores)
        use_threads(narrow)
        sys.setswitchinterval(0.0002)
    return lanes


def _check(*, host: str, port: int, api_key: str | None, no_auth: bool, max_batch: int, max_queue: int,
           timeout: float, max_body: int, lanes: int, idle_timeout: float = 10.0) -> str | None:
    """Refuse bad limits and an open non-loopback address before anything loads; the API key to use (one
    read from a file keeps its newline: spaces around it are dropped, with a warning)."""
    import math

    if not (math.isfinite(idle_timeout) and 0 < idle_timeout <= 3600):
        raise UsageError(f"--idle-timeout must be more than 0 and at most 3600 seconds, got {idle_timeout}",
                         hint="e.g. --idle-timeout 10")

    if not 0 <= lanes <= 8:
        raise UsageError(f"--lanes must be between 0 (auto) and 8, got {lanes}", hint="e.g. --lanes 2")
    if not 1 <= max_batch <= 256:
        raise UsageError(f"--max-batch must be between 1 and 256, got {max_batch}", hint="e.g. --max-batch 8")
    if not 0 <= max_queue <= 100_000:
        raise UsageError(f"--max-queue must be between 0 and 100000, got {max_queue}", hint="e.g. --max-queue 32")
    if not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout}", hint="e.g. --timeout 300")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {port}", hint="e.g. --port 8012")
    if max_body < 1024:
        raise UsageError(f"--max-body must be at least 1024 bytes, got {max_body}", hint="e.g. --max-body 1048576")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty", hint="give a key, or drop --api-key")
    if not _loopback(host) and not api_key and not no_auth:
        raise UsageError(f"listening on {host} would let anyone on the network use the models",
                         hint="pass --api-key KEY (clients send Authorization: Bearer KEY), or --no-auth to allow it")
    if port:
        _check_port(host, port)
    if api_key is not None and api_key != api_key.strip():
        say("Warning: the API key has spaces or a line break around it; they are dropped (HTTP clients send "
            "a header without them, so the key as given could never match)\n")
        return api_key.strip()
    return api_key


def _check_port(host: str, port: int) -> None:
    """Bind ``host:port`` once, as uvicorn will, so a taken port fails in milliseconds, not after the load."""
    import errno
    import socket

    from codila_cli.errors import PortInUseError

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(f"port {port} on {host} is in use (another server listens there)",
                                     hint=f"stop it, or pass --port {port + 1} (--port 0 takes any free port)") from None
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}", hint="check --host and --port") from None


def _check_infill_model(name: str | None) -> None:
    """Refuse, before anything loads, an infill model whose family cannot fill in the middle (SDAR's blocks
    are written left to right: every /infill would be a 400)."""
    if name is None:
        return
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.families import family_of
    from codila_cli.models.loading import read_config
    from codila_cli.models.registry import resolve_spec

    family = family_of(read_config(resolve_local_dir(resolve_spec(name, kind="dlm")), name=name))
    if family is not None and family.infill == "no":
        raise UsageError(f"--infill-dlm {name} is a block-diffusion model ({family.name}): it writes left to right, block by block, "
                         "and cannot fill in the middle", hint="give a DreamOn or another Dream- or LLaDA-family model "
                         "as --infill-dlm, or leave it out (fill-in-the-middle requests are then refused)")


def _default_infill(dlm: str) -> str | None:
    """bundled-infill with the bundled pair; dreamon where it is in the cache; else none."""
    from codila_cli.models.registry import bundled_available

    if dlm == "bundled-dlm":
        return "bundled-infill" if bundled_available("bundled-infill") else None
    try:
        from codila_cli.models.cache import resolve_local_dir
        from codila_cli.models.registry import resolve_spec

        resolve_local_dir(resolve_spec("dreamon", kind="dlm"))
        return "dreamon"
    except Exception:  # noqa: BLE001 - not cached: fill-in-the-middle requests are refused (400)
        return None


def _announce(server: object, host: str, *, quiet: bool) -> None:
    """Print the address once the socket listens (port 0: the one the OS chose), with -q too."""
    import threading
    import time

    def wait() -> None:
        while not getattr(server, "started", False):
            if getattr(server, "should_exit", False):
                return
            time.sleep(0.05)
        port = next((s.getsockname()[1] for srv in getattr(server, "servers", []) for s in srv.sockets), None)
        shown = f"[{host}]" if ":" in host else host
        say(f"codila serve: listening on http://{shown}:{port}\n")
        sys.stderr.flush()

    threading.Thread(target=wait, daemon=True).start()  # even with -q: a script needs the port
