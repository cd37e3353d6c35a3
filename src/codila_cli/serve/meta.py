"""The endpoints clients call to find a server and its models (no decoding): ``GET /`` and ``HEAD /`` (Ollama's liveness
text), ``GET /api/version``, ``GET /api/ps`` (the loaded models), ``GET /props`` (llama.cpp's server
properties) and ``GET /v1/models/{id}`` (OpenAI's model object; an unknown id is a 404 in OpenAI's error
schema)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from codila_cli.serve.routes import _check_model, _names, _state

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"])  # Ollama's clients check the server with HEAD /
async def root() -> PlainTextResponse:
    return PlainTextResponse("codila is running (OpenAI, llama.cpp and Ollama endpoints: docs/serve.md)")


@router.get("/api/version")
async def version() -> dict:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return {"version": installed("codila")}
    except PackageNotFoundError:
        return {"version": "0"}


@router.get("/api/ps")
async def running(request: Request) -> dict:
    """Ollama's loaded models: everything a server serves stays loaded until it stops."""
    st = _state(request)
    tags = {m["name"]: m for m in (await _tags(request))["models"]}
    out = []
    for m in [st.engine.models] + ([st.engine.infill_models] if st.engine.infill_models is not None else []):
        tag = tags.get(f"{_names(request)[0 if m is st.engine.models else 2]}:latest", {})
        on_gpu = str(m.dlm.device).startswith("cuda")
        out.append({**tag, "expires_at": "0001-01-01T00:00:00Z", "size_vram": tag.get("size", 0) if on_gpu else 0})
    return {"models": out}


async def _tags(request: Request) -> dict:
    from codila_cli.serve.routes import tags

    return await tags(request)


@router.get("/props")
@router.get("/v1/props")
async def props(request: Request) -> dict:
    """llama.cpp's server properties: llama.vscode reads ``default_generation_settings.n_ctx`` here."""
    st = _state(request)
    dlm = st.engine.models.dlm
    return {"default_generation_settings": {"n_ctx": dlm.context_length, "n_predict": st.engine.settings.config.max_new_tokens,
                                            "model": _names(request)[0]},
            "total_slots": st.config.max_batch, "model_alias": _names(request)[0], "build_info": "codila"}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict:
    _check_model(request, model_id)
    return {"id": model_id.removesuffix(":latest"), "object": "model", "created": int(time.time()), "owned_by": "codila"}
