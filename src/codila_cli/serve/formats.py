"""Answers and stream chunks in each ecosystem's format (styles: ``openai-completion``,
``openai-chat``, ``llama``, ``ollama``, ``ollama-chat``). OpenAI and llama.cpp stream server-sent events
(``data: {…}\\n\\n``; OpenAI ends with ``data: [DONE]``); Ollama streams one JSON object per line."""

from __future__ import annotations

import json
import time
from typing import Any


def _sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


def _ndjson(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _usage(outs: list) -> dict:
    p = sum(o.prompt_tokens for o in outs[:1])  # every choice reads the same prompt
    c = sum(o.completion_tokens for o in outs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _codila(outs: list) -> dict:
    return {"choices": [o.codila for o in outs]}


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def document(job: Any, style: str, outs: list) -> dict | list:
    """The whole (non-streamed) answer; llama.cpp's for several completions (``n_cmpl``) is a list of them."""
    if style == "openai-completion":
        return {"id": job.id, "object": "text_completion", "created": job.created, "model": job.model,
                "choices": [{"text": o.text, "index": i, "logprobs": None, "finish_reason": o.finish_reason}
                            for i, o in enumerate(outs)], "usage": _usage(outs), "codila": _codila(outs)}
    if style == "openai-chat":
        return {"id": "chat" + job.id, "object": "chat.completion", "created": job.created, "model": job.model,
                "choices": [{"index": i, "message": {"role": "assistant", "content": o.text}, "logprobs": None,
                             "finish_reason": o.finish_reason} for i, o in enumerate(outs)],
                "usage": _usage(outs), "codila": _codila(outs)}
    if style == "llama":
        return _llama(job, outs[0]) if len(outs) == 1 and not job.listed else [_llama(job, o) for o in outs]
    return _ollama_final(job, style, outs[0])


def _llama(job: Any, o: Any) -> dict:
    """One llama.cpp answer: the text, and the fields llama.vscode and llama.vim read."""
    from codila_cli.serve.requests import token_limit

    ms = o.codila.get("wall_seconds", 0.0) * 1000

    cut = o.codila.get("context") or {}
    truncated = job.clamped is not None or "stopped_at_ms" in o.codila \
        or cut.get("prefix_kept", 0) < cut.get("prefix_tokens", 0) \
        or cut.get("suffix_kept", 0) < cut.get("suffix_tokens", 0)
    models = job.engine.models if job.kind == "gen" else job.engine.infill_models
    return {"content": o.text, "stop": True, "stop_type": "eos" if o.finish_reason == "stop" else "limit",
            "tokens_predicted": o.completion_tokens, "tokens_evaluated": o.prompt_tokens, "tokens_cached": 0,
            "truncated": bool(truncated), "model": job.model, "codila": o.codila,
            # what llama.vscode and llama.vim read: the context size, the limit, the timings
            "generation_settings": {"n_ctx": models.dlm.context_length, "model": job.model,
                                    "n_predict": token_limit(job.settings)},
            "timings": {"prompt_n": o.prompt_tokens, "prompt_ms": 0.0, "prompt_per_second": 0.0,
                        "predicted_n": o.completion_tokens, "predicted_ms": ms,
                        "predicted_per_second": o.completion_tokens / ms * 1000 if ms else 0.0}}


def _ollama_text(style: str, text: str) -> dict:
    """Ollama's generate answers in ``response``, its chat in ``message``."""
    return {"message": {"role": "assistant", "content": text}} if style == "ollama-chat" else {"response": text}


def _ollama_final(job: Any, style: str, o: Any, text: str | None = None) -> dict:
    seconds = o.codila.get("wall_seconds", 0.0)
    return {"model": job.model, "created_at": _stamp(), **_ollama_text(style, o.text if text is None else text),
            "done": True,
            "done_reason": o.finish_reason, "total_duration": int(seconds * 1e9), "prompt_eval_count": o.prompt_tokens,
            "eval_count": o.completion_tokens, "eval_duration": int(seconds * 1e9), "codila": o.codila}


def select(doc: dict | list, fields: list[str] | None) -> dict | list:
    """llama.cpp's ``response_fields``: only the listed fields, each under its own path as the key
    (``"timings/predicted_n"``); a path that names nothing is left out; no list: the whole answer."""
    if not fields:
        return doc
    if isinstance(doc, list):
        return [select(d, fields) for d in doc]
    out = {}
    for name in fields:
        value: Any = doc
        for part in name.split("/"):
            value = value.get(part, select) if isinstance(value, dict) else select
        if value is not select and name:
            out[name] = value
    return out


def opening(job: Any, style: str) -> list[str]:
    """Chunks sent before any text (OpenAI chat: the assistant role of each choice)."""
    if style != "openai-chat":
        return []
    return [_sse(_chat_chunk(job, i, {"role": "assistant", "content": ""}, None)) for i in range(job.n)]


def _chat_chunk(job: Any, i: int, delta: dict, finish: str | None) -> dict:
    return {"id": "chat" + job.id, "object": "chat.completion.chunk", "created": job.created, "model": job.model,
            "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def _text_chunk(job: Any, i: int, text: str, finish: str | None) -> dict:
    return {"id": job.id, "object": "text_completion", "created": job.created, "model": job.model,
            "choices": [{"text": text, "index": i, "logprobs": None, "finish_reason": finish}]}


def piece(job: Any, style: str, i: int, text: str) -> str:
    """A chunk of final text for choice ``i``."""
    if style == "openai-completion":
        return _sse(_text_chunk(job, i, text, None))
    if style == "openai-chat":
        return _sse(_chat_chunk(job, i, {"content": text}, None))
    if style == "llama":
        return _sse({"content": text, "stop": False})
    return _ndjson({"model": job.model, "created_at": _stamp(), **_ollama_text(style, text), "done": False})


def last(job: Any, style: str, i: int, out: Any) -> str:
    """The chunk that ends choice ``i`` (its finish reason; Ollama and llama.cpp: the whole answer's stats)."""
    one = {"usage": _usage([out]), "codila": _codila([out])} if job.n == 1 else {}  # the last chunk: usage too
    if style == "openai-completion":
        return _sse({**_text_chunk(job, i, "", out.finish_reason), **one})
    if style == "openai-chat":
        return _sse({**_chat_chunk(job, i, {}, out.finish_reason), **one})
    if style == "llama":
        return _sse({**document(job, style, [out]), "content": ""})
    return _ndjson(_ollama_final(job, style, out, text=""))


def closing(job: Any, style: str, outs: list) -> list[str]:
    """After every choice ended: OpenAI's usage chunk for several choices (one choice had it in its last
    chunk) and ``[DONE]``."""
    if style.startswith("openai") and job.n == 1:
        return ["data: [DONE]\n\n"]
    if style == "openai-completion":
        tail = {**_text_chunk(job, 0, "", None), "choices": [], "usage": _usage(outs), "codila": _codila(outs)}
        return [_sse(tail), "data: [DONE]\n\n"]
    if style == "openai-chat":
        tail = {**_chat_chunk(job, 0, {}, None), "choices": [], "usage": _usage(outs), "codila": _codila(outs)}
        return [_sse(tail), "data: [DONE]\n\n"]
    return []


def failure(job: Any, style: str, err: Any) -> str:
    """An error after the stream began (the status line is already sent): one error event."""
    from codila_cli.serve.errors import error_body

    ollama = style.startswith("ollama")
    body = error_body("/api/" if ollama else "/infill" if style == "llama" else "/v1/", err.status, err.message, err.kind, err.param, err.code)
    return _ndjson(body) if ollama else _sse(body)
