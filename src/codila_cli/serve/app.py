"""``codila serve``'s ASGI app: FastAPI (request schemas and the OpenAPI document from one set of
pydantic models) on uvicorn. Endpoints: serve/routes.py; admission, deadlines, metrics: serve/runner.py.

Cross-cutting rules here: a body over ``max_body`` bytes is refused with 413 before it is read in full;
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
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from codila_cli.serve.errors import APIError, error_body


@dataclass
class ServeConfig:
    api_key: str | None = None
    max_batch: int = 8
    max_queue: int = 32
    deadline_s: float = 300.0
    max_body: int = 1 << 20  # bytes
    quiet: bool = False


class BodyLimit:
    """Pure ASGI middleware: 413 for a body over ``limit`` bytes (by Content-Length, or while it streams in)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if scope.get("method") == "POST" and b"content-type" not in headers:  # curl -d, as Ollama's docs send it
            scope = {**scope, "headers": [*scope.get("headers", []), (b"content-type", b"application/json")]}
        length = headers.get(b"content-length")
        try:
            too_big = length is not None and int(length) > self.limit
        except ValueError:
            too_big = False
        if too_big:
            return await self._refuse(scope, send)
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooBig()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooBig:
            await self._refuse(scope, send)

    async def _refuse(self, scope: dict, send: Any) -> None:
        body = error_body(scope.get("path", ""), 413, f"the request body is over the server's limit of {self.limit} bytes",
                          "invalid_request_error")
        await JSONResponse(body, status_code=413)(scope, _no_receive, send)


class _TooBig(Exception):
    pass


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}


def create_app(engine: Any, base: Any, config: ServeConfig) -> FastAPI:
    """``engine`` (engine/core.py::Engine, models loaded), ``base`` (resolve.GenRequest: the server's
    default gen settings), ``config`` the server's limits."""
    from codila_cli.serve.runner import Metrics, Runner

    metrics = Metrics()
    engine.on_batch = metrics.on_batch
    runner = Runner(engine, max_batch=config.max_batch, max_queue=config.max_queue, deadline_s=config.deadline_s,
                    metrics=metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await runner.shutdown()

    app = FastAPI(title="codila", version=_version(), lifespan=lifespan,
                  description="Diffusion-LM code generation with CoDiLA: OpenAI, llama.cpp and Ollama endpoints.")
    app.state.engine, app.state.base, app.state.config = engine, base, config
    app.state.runner, app.state.metrics = runner, metrics

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        t0 = time.perf_counter()
        path = request.url.path
        if config.api_key and path != "/health" and not _authorised(request, config.api_key):
            response: Response = JSONResponse(error_body(path, 401, "missing or wrong API key (Authorization: Bearer KEY)",
                                                         "authentication_error", code="invalid_api_key"),
                                              status_code=401, headers={"WWW-Authenticate": "Bearer"})
        else:
            try:
                response = await call_next(request)
            except Exception as exc:  # noqa: BLE001 - a codila bug: a 500 with its message, the server lives on
                response = JSONResponse(error_body(path, 500, f"internal error: {type(exc).__name__}: {exc}"[:500],
                                                   "server_error"), status_code=500)
        metrics.requests.labels(_endpoint(path), str(response.status_code)).inc()
        if not config.quiet:
            client = request.client.host if request.client else "-"
            sys.stderr.write(f"{client} {request.method} {path} {response.status_code} "
                             f"{(time.perf_counter() - t0) * 1000:.0f}ms\n")
            sys.stderr.flush()
        return response

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

    from codila_cli.serve.routes import router

    app.include_router(router)
    return BodyLimit(app, config.max_body) if config.max_body else app  # type: ignore[return-value]


def _authorised(request: Request, key: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def _endpoint(path: str) -> str:
    known = ("/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/infill", "/api/generate",
             "/api/tags", "/metrics")
    return path if path in known else "other"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("codila")
    except PackageNotFoundError:
        return "0"
