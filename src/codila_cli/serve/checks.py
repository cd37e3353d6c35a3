"""What a decoding request is checked and fitted against before it is admitted (serve/stream.py::Job): the
request's settings on the server's, its stop strings, a token limit clamped to the context the prompt
leaves, and the served name of a model. Each failure is an APIError (a 4xx), never a broken stream."""

from __future__ import annotations

from typing import Any

from codila_cli.serve.errors import APIError


def served(name: str) -> str:
    from codila_cli.serve.requests import served_name

    return served_name(name)


def request_settings(base: Any, **kw: Any) -> Any:
    from codila_cli.serve.requests import gen_settings

    try:
        return gen_settings(base, **kw)
    except (ValueError, TypeError) as exc:
        raise APIError(400, str(exc), param="codila") from None


def stop_list(stop: Any) -> tuple[str, ...]:
    from codila_cli.serve.requests import stop_strings

    try:
        return stop_strings(stop)
    except ValueError as exc:
        raise APIError(400, str(exc), param="stop") from None


def fitted(models: Any, prompt: str, settings: Any, settings_for: Any, *, system: str | None,
            messages: list | None) -> tuple[Any, int | None]:
    """``settings``, or when its canvas is longer than the context the prompt leaves, ``settings_for(room)``
    (as llama.cpp and Ollama clamp a token limit; Continue asks for 4,096 by default) and the room; a
    prompt that fills the context alone is a 400."""
    from codila_cli.engine.prompts import encode_prompt

    if prompt.strip() or messages:
        ids, _ = encode_prompt(models.dlm.tokenizer, models.dlm.specials, prompt, system=system, messages=messages)
        room = models.dlm.context_length - len(ids)
        if 0 < room < settings.config.max_new_tokens:
            settings = settings_for(room)
            check_context(models, prompt, settings.config, system=system, messages=messages)
            return settings, room
    check_context(models, prompt, settings.config, system=system, messages=messages)
    return settings, None


def check_context(models: Any, prompt: str, config: Any, *, system: str | None, messages: list | None) -> None:
    from codila_cli.engine.generate import _prepare
    from codila_cli.errors import CodilaError

    try:
        _prepare(models, prompt, config, system, messages)
    except CodilaError as exc:
        raise APIError(400, str(exc), param="prompt", code="context_length_exceeded"
                       if "context" in str(exc) else None) from None
