"""``codila serve``'s ASGI app: FastAPI (request schemas and the OpenAPI document from one set of
pydantic models) on uvicorn. Endpoints: serve/routes.py; admission, deadlines, metrics: serve/runner.py.

Cross-cutting rules here (:class:`Gate`): a body over ``max_body`` bytes is refused with 413 before it is read in full;
with an API key, every endpoint but ``/health`` needs ``Authorization: Bearer KEY`` (compared in
constant time); every error is one JSON error object in the schema of the endpoint's ecosystem
(OpenAI's for ``/v1``, llama.cpp's for ``/infill``, Ollama's for ``/api``); a bug in codila is a 500
with a message, never a dropped connection or a dead server; one line per request on stderr.
"""

from __future__ import annotations

import hmac
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from codila_cli.serve.conn import BODY_LATE
from codila_cli.serve.errors import APIError, error_body
from codila_cli.ui.terminal import say


@dataclass
class ServeConfig:
    api_key: str | None = None
    max_batch: int = 8
    max_queue: int = 32
    deadline_s: float = 300.0
    max_body: int = 1 << 20  # bytes
    quiet: bool = False


class Gate:
    """Pure ASGI middleware around the app (no BaseHTTPMiddleware: that one wraps every response body in
    a task of its own, and a stream must run undisturbed until its client leaves): a POST without a
    content type, or with curl -d's form type, is read as JSON (as Ollama's docs send it); a body over ``config.max_body``
    bytes is a 413, by Content-Length or while it streams in; the API key; a codila bug is a 500 with
    its message; the request metric and one stderr line when the response has been sent."""

    def __init__(self, app: Any, config: ServeConfig, metrics: Any) -> None:
        self.app, self.config, self.metrics = app, config, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        origin = scope  # the protocol's own scope (serve/conn.py marks a body that came too slowly there)
        path = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        form = headers.get(b"content-type", b"").startswith(b"application/x-www-form-urlencoded")  # curl -d's default
        if scope.get("method") == "POST" and (b"content-type" not in headers or form):
            kept = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
            scope = {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
        status = 0

        async def sent(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        limit = self.config.max_body
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # an HTTPException: the framework's body reading passes it on (a 413, not its 400)
                    raise _TooBig(limit)
            return message

        try:
            if self.config.api_key and path != "/health" and not _authorised(headers, self.config.api_key):
                await self._answer(scope, sent, 401, "missing or wrong API key (Authorization: Bearer KEY)",
                                   "authentication_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            elif _too_long(headers.get(b"content-length"), limit):
                await self._answer(scope, sent, 413, f"the request body is over the server's limit of {limit} bytes")
            else:
                await self.app(scope, limited, sent)
        except ClientDisconnect:  # the client went away (or sent its body too slowly: serve/conn.py) mid-request
            status = status or (408 if origin.get(BODY_LATE) else 499)
        except _TooBig:
            if not status:
                await self._answer(scope, sent, 413, f"the request body is over the server's limit of {limit} bytes")
        except Exception as exc:  # noqa: BLE001 - a codila bug: a 500 with its message, the server lives on
            if not status:
                await self._answer(scope, sent, 500, f"internal error: {type(exc).__name__}: {exc}"[:500], "server_error")
        self.metrics.requests.labels(_endpoint(path), str(status)).inc()
        if not self.config.quiet:  # one line: a path's own line breaks (%0a) are shown escaped, never kept
            from codila_cli.ui.terminal import printable

            client = (scope.get("client") or ("-",))[0]
            say(printable(f"{client} {scope.get('method')} {path} {status} "
                          f"{(time.perf_counter() - t0) * 1000:.0f}ms") + "\n")
            sys.stderr.flush()

    @staticmethod
    async def _answer(scope: dict, send: Any, status: int, message: str, kind: str = "invalid_request_error",
                      code: str | None = None, headers: dict | None = None) -> None:
        body = error_body(scope.get("path", ""), status, message, kind, code=code)
        await JSONResponse(body, status_code=status, headers=headers)(scope, _no_receive, send)


def _too_long(length: bytes | None, limit: int) -> bool:
    try:
        return length is not None and int(length) > limit
    except ValueError:
        return False


class _TooBig(StarletteHTTPException):
    """A body that streamed in past the limit (chunked, no Content-Length): 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the server's limit of {limit} bytes")


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}


def create_app(engine: Any, config: ServeConfig) -> FastAPI:
    """``engine`` (engine/core.py::Engine: models loaded, ``engine.settings`` the server's resolved gen
    settings, the defaults of every request), ``config`` the server's limits."""
    from codila_cli.serve.runner import Metrics, Runner

    metrics = Metrics()
    engine.on_batch = metrics.on_batch
    runner = Runner(engine, max_batch=config.max_batch, max_queue=config.max_queue, deadline_s=config.deadline_s,
                    metrics=metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import asyncio

        from codila_cli.serve.conn import quiet_accept_errors

        quiet_accept_errors(asyncio.get_running_loop())  # out of descriptors: one line, not a traceback a retry
        yield
        await runner.shutdown()

    app = FastAPI(title="codila", version=_version(), lifespan=lifespan,
                  description="Diffusion-LM code generation with CoDiLA: OpenAI, llama.cpp and Ollama endpoints.")
    app.state.engine, app.state.config = engine, config
    app.state.runner, app.state.metrics = runner, metrics

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(request.url.path, exc.status, exc.message, exc.kind, exc.param, exc.code),
                            status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message = "the body is not valid JSON"
        elif where:
            message = f"{where}: {message}"
        return JSONResponse(error_body(request.url.path, 400, message, "invalid_request_error", where), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(request.url.path, exc.status_code, str(exc.detail), kind),
                            status_code=exc.status_code)

    from codila_cli.serve.meta import router as meta
    from codila_cli.serve.routes import router

    app.include_router(router)
    app.include_router(meta)
    return Gate(app, config, metrics)  # type: ignore[return-value]


def _authorised(headers: dict, key: str) -> bool:
    """``Authorization: Bearer KEY``, the header's bytes against the key's UTF-8 (as clients send a key
    that is not ASCII), in constant time."""
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode("utf-8"))


def _endpoint(path: str) -> str:
    """The route a path belongs to, as declared (``/v1/models/{model_id:path}``), for the metrics' label;
    "other" for a path no route serves (a scan must not grow the label set)."""
    from codila_cli.serve.meta import router as meta
    from codila_cli.serve.routes import router

    for route in (*router.routes, *meta.routes):
        if route.path_regex.match(path):
            return route.path
    return "other"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("codila")
    except PackageNotFoundError:
        return "0"
