"""The endpoints, each in its ecosystem's schema (unknown fields are ignored, as other servers do):

* OpenAI: ``GET /v1/models``, ``POST /v1/completions`` (``suffix`` → fill-in-the-middle),
  ``POST /v1/chat/completions``; SSE streams of OpenAI chunks ending in ``data: [DONE]``;
* llama.cpp: ``POST /infill`` (``input_prefix``, ``input_suffix``, ``input_extra``, ``prompt``, ``n_predict``);
* Ollama: ``POST /api/generate`` (``suffix`` → fill-in-the-middle; NDJSON stream by default), ``GET /api/tags``;
* ``GET /health``, ``GET /metrics`` (Prometheus).

Every decoding request may carry a ``codila`` object (decoder, block_size, tau, cache, …;
serve/requests.py) and every answer carries one back (forwards, tokens per forward, syntax report). A
code request may name its ``language`` or ``filename`` (codila's fields): the syntax report checks that
language, and without either it is ``{"checked": false}`` (a chat answer's code fence may name it).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from codila_cli.serve.errors import APIError
from codila_cli.serve.stream import Job, run_job

router = APIRouter()
Prompt = str | list[str]


Temperature = Annotated[float | None, Field(ge=0, le=2)]
TopP = Annotated[float | None, Field(gt=0, le=1)]
Seed = Annotated[int | None, Field(ge=0, lt=2**63)]
Count = Annotated[int | None, Field(ge=0)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        """JSON may escape a lone UTF-16 surrogate (\\ud800), which is no character: refused here (a 400),
        where it would fail later, in the tokenizer or in the answer's own encoding."""
        stack = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError("a string holds a lone surrogate (such as \\ud800), which is not text") from None
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        return data


class _Located(_Body):
    """codila's own fields on a code request: the language the syntax report checks (a name, an alias or
    an editor's language id) or the file's name (its extension says); neither: no report."""

    language: str | None = None
    filename: str | None = None


class _OpenAIRequest(_Located):
    """The fields OpenAI's completions and chat completions share."""

    model: str | None = None
    max_tokens: Count = None
    temperature: Temperature = None
    top_p: TopP = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=8)
    seed: Seed = None
    stream: bool = False
    codila: dict[str, Any] | None = None
    n_predict: Count = None  # llama.cpp's name for max_tokens, which its OpenAI endpoints take too (llama.vim)


class CompletionRequest(_OpenAIRequest):
    prompt: Prompt = ""
    suffix: str | None = None


class Message(_Body):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = ""


class ChatRequest(_OpenAIRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Count = None


class ExtraChunk(_Body):
    filename: str = ""
    text: str = ""


class InfillRequest(_Located):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = []
    prompt: str = ""
    n_predict: int | None = None
    temperature: Temperature = None
    top_p: TopP = None
    seed: int | None = Field(None, ge=-1, lt=2**64)  # llama.cpp: -1 = random; Tabby sends a u64
    stop: list[str] | None = None
    stream: bool = False
    codila: dict[str, Any] | None = None
    response_fields: list[str] | None = None  # llama.cpp: answer only these ("timings/predicted_n": a path)
    t_max_predict_ms: int | None = Field(None, ge=0)  # a fill returns what is committed by then (0: no limit)
    n_indent: int | None = Field(None, ge=0)  # a fill ends before a later line indented less
    n_cmpl: int = Field(1, ge=1, le=8)  # alternatives (llama.vscode asks for 3): a list of answers
    id_slot: int | None = None  # llama.cpp's slot: read and ignored (no request cancels another client's)


class LlamaCompletion(_Located):
    prompt: str = ""
    n_predict: int | None = None
    temperature: Temperature = None
    top_p: TopP = None
    seed: int | None = Field(None, ge=-1, lt=2**64)  # -1 = random; Tabby sends a u64
    stop: list[str] | None = None
    stream: bool = False
    codila: dict[str, Any] | None = None


class OllamaOptions(_Body):
    temperature: Temperature = None
    top_p: TopP = None
    num_predict: int | None = None
    seed: Seed = None
    stop: str | list[str] | None = None  # Ollama's Modelfile parameter; Continue's type allows one string


class OllamaChat(_Body):
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = True
    options: OllamaOptions = OllamaOptions()
    codila: dict[str, Any] | None = None


class OllamaShow(_Body):
    model: str | None = None
    name: str | None = None  # the older spelling, which Continue sends


class OllamaGenerate(_Located):
    model: str
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    stream: bool = True
    options: OllamaOptions = OllamaOptions()
    codila: dict[str, Any] | None = None


def _state(request: Request) -> Any:
    return request.app.state


def _names(request: Request) -> list[str]:
    from codila_cli.serve.requests import served_name

    st = _state(request)
    names = [served_name(st.engine.models.dlm.name), "codila"]
    if st.engine.infill_models is not None:
        names.append(served_name(st.engine.infill_models.dlm.name))
    return list(dict.fromkeys(names))  # a model that is both the DLM and the infill model is named once


def _check_model(request: Request, model: str | None) -> None:
    if not model:
        return
    name = model.removesuffix(":latest")
    if name not in _names(request):
        raise APIError(404, f"the model {model!r} is not served here (serving: {', '.join(_names(request))})",
                       kind="invalid_request_error", param="model", code="model_not_found")


def _one_prompt(prompt: Prompt) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise APIError(400, "prompt must be a string or a list of exactly one string", param="prompt")
        return prompt[0]
    return prompt


@router.get("/health")
async def health(request: Request) -> dict:
    st = _state(request)
    dlm = st.engine.models.dlm
    return {"status": "ok", "models": _names(request)[:1] + _names(request)[2:], "running": st.runner.in_use,
            "rows_decoding": st.engine.batcher.active, "max_batch": st.config.max_batch,
            "device": str(dlm.device), "dtype": str(dlm.ckpt.dtype).removeprefix("torch."), "family": family(dlm),
            "quantize": dlm.ckpt.quantize, "dtype_note": dlm.ckpt.dtype_note,
            "quantize_ar": st.engine.models.ar.ckpt.quantize if st.engine.models.ar is not None else None,
            "infill_family": family(st.engine.infill_models.dlm) if st.engine.infill_models is not None else None,
            "lanes": st.engine.lanes, "lone_request_uses_every_core": st.engine.wide,
            "deterministic": not st.engine.stack}


@router.get("/v1/models")
async def models(request: Request) -> dict:
    created = int(time.time())
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "codila"}
                                       for n in _names(request)]}


@router.get("/api/tags")
async def tags(request: Request) -> dict:
    from codila_cli.serve.requests import served_name

    st = _state(request)
    out = []
    for m in [st.engine.models] + ([st.engine.infill_models] if st.engine.infill_models is not None else []):
        path = m.dlm.ckpt.path
        size = sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else 0
        name = served_name(m.dlm.name)
        out.append({"name": f"{name}:latest", "model": f"{name}:latest", "size": size,
                    "modified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "digest": uuid.uuid5(uuid.NAMESPACE_URL, str(path)).hex,
                    "details": {"format": "safetensors", "family": family(m.dlm), "families": [family(m.dlm)]}})
    return {"models": out}


def family(dlm: Any) -> str:
    """The family a loaded DLM belongs to (models/families.py, from its config), as Ollama's ``family``."""
    from codila_cli.models.families import family_of

    f = family_of(dlm.ckpt.config)
    return f.name if f is not None else str(dlm.ckpt.config.get("model_type", "unknown")).lower()


@router.post("/api/chat")
async def ollama_chat(body: OllamaChat, request: Request) -> Response:
    _check_model(request, body.model)
    o = body.options
    job = Job.chat(request, messages=_messages(body.messages),
                   max_tokens=o.num_predict if o.num_predict is None or o.num_predict >= 0 else None,
                   temperature=o.temperature, top_p=o.top_p, stop=o.stop, n=1, seed=o.seed, codila=body.codila,
                   model=body.model)
    return await run_job(request, job, style="ollama-chat", stream=body.stream)


@router.post("/api/show")
async def show(body: OllamaShow, request: Request) -> dict:
    """Ollama's model card. Clients read FIM support from the template: Continue enables its
    fill-in-the-middle path when the template mentions ``.Suffix``, as codila's does (``suffix`` →
    DreamOn infilling). ``parameters`` holds one ``key value`` per line, as Ollama writes them."""
    name = body.model or body.name
    if not name:
        raise APIError(400, "model is required", param="model")
    _check_model(request, name)
    st = _state(request)
    dlm = st.engine.models.dlm
    fim = st.engine.infill_models is not None
    return {"modelfile": f"FROM {_names(request)[0]}\n", "parameters": f"num_ctx {dlm.context_length}",
            "template": "{{ .Prompt }}" + ("{{ .Suffix }}" if fim else ""),
            "details": {"format": "safetensors", "family": family(dlm), "families": [family(dlm)]},
            "model_info": {"general.architecture": family(dlm), f"{family(dlm)}.context_length": dlm.context_length},
            "capabilities": ["completion", "insert"] if fim else ["completion"]}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    body, kind = _state(request).metrics.render()
    return Response(body, media_type=kind)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    _check_model(request, body.model)
    prompt = _one_prompt(body.prompt)
    job = Job.completion(request, prompt=prompt, suffix=body.suffix,
                         max_tokens=body.max_tokens if body.max_tokens is not None else body.n_predict,
                         temperature=body.temperature, top_p=body.top_p, stop=body.stop, n=body.n, seed=body.seed,
                         codila=body.codila, model=body.model)
    return await run_job(request, job.located(body.language, body.filename), style="openai-completion",
                         stream=body.stream)


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request) -> Response:
    _check_model(request, body.model)
    limits = (body.max_completion_tokens, body.max_tokens, body.n_predict)
    job = Job.chat(request, messages=_messages(body.messages), max_tokens=next((n for n in limits if n is not None), None),
                   temperature=body.temperature, top_p=body.top_p, stop=body.stop, n=body.n, seed=body.seed,
                   codila=body.codila, model=body.model)
    return await run_job(request, job.located(body.language, body.filename), style="openai-chat", stream=body.stream)


@router.post("/infill")
async def infill(body: InfillRequest, request: Request) -> Response:
    extra = "".join(_chunk(c) for c in body.input_extra if c.text)
    if body.n_cmpl > 1 and body.stream:
        raise APIError(400, "n_cmpl > 1 answers with a list of completions, which does not stream", param="n_cmpl")
    job = Job.infill(request, prefix=extra + body.input_prefix + body.prompt, suffix=body.input_suffix,
                     max_middle=body.n_predict, temperature=body.temperature, top_p=body.top_p,
                     seed=None if body.seed in (None, -1) else body.seed, codila=body.codila, model=None,
                     stop=body.stop or None, n=body.n_cmpl)
    job.listed = body.n_cmpl > 1
    if job.n > 1 and job.settings.sampling.temperature == 0:  # greedy: every alternative would be this text
        job.n = 1
    job.context = len(extra)  # the other files' text: the model reads it, the syntax report does not
    job.fields, job.deadline_ms, job.n_indent = body.response_fields, body.t_max_predict_ms or None, body.n_indent
    return await run_job(request, job.located(body.language, body.filename), style="llama", stream=body.stream)


def _chunk(chunk: ExtraChunk) -> str:
    """An ``input_extra`` chunk as the model reads it: its file name in a comment of its own language."""
    if not chunk.filename:
        return f"{chunk.text}\n"
    from codila_cli.languages import GENERIC, for_path

    return f"{(for_path(chunk.filename) or GENERIC).comment_line(chunk.filename)}\n{chunk.text}\n"


@router.post("/completion")
async def llama_completion(body: LlamaCompletion, request: Request) -> Response:
    """llama.cpp's own completion endpoint (Continue's llama.cpp provider, Tabby's llama.cpp/completion):
    a prompt in a FIM template (serve/requests.py::FIM_TEMPLATES) fills the middle."""
    n = body.n_predict if body.n_predict is None or body.n_predict >= 0 else None
    job = Job.completion(request, prompt=body.prompt, suffix=None, max_tokens=n, temperature=body.temperature,
                         top_p=body.top_p, stop=body.stop or None, n=1, seed=None if body.seed in (None, -1) else body.seed,
                         codila=body.codila, model=None)
    return await run_job(request, job.located(body.language, body.filename), style="llama", stream=body.stream)


@router.post("/api/generate")
async def generate(body: OllamaGenerate, request: Request) -> Response:
    _check_model(request, body.model)
    o = body.options
    if not body.prompt and not body.suffix and not body.system:  # Ollama's load request: nothing to decode
        return JSONResponse({"model": body.model, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "response": "", "done": True, "done_reason": "load"})
    if body.suffix:
        job = Job.infill(request, prefix=body.prompt, suffix=body.suffix, max_middle=o.num_predict,
                         temperature=o.temperature, top_p=o.top_p, seed=o.seed, codila=body.codila, model=body.model,
                         stop=o.stop)
    else:
        job = Job.completion(request, prompt=body.prompt, suffix=None,
                             max_tokens=o.num_predict if o.num_predict is None or o.num_predict >= 0 else None,
                             temperature=o.temperature, top_p=o.top_p, stop=o.stop, n=1, seed=o.seed,
                             codila=body.codila, model=body.model, system=body.system)
    return await run_job(request, job.located(body.language, body.filename), style="ollama", stream=body.stream)


def _messages(messages: list[Message]) -> list[dict]:
    return [{"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)} for m in messages]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))

