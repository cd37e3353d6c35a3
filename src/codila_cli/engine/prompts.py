"""Prompts in, text out: the chat template or raw completion, and the canvas's text up to its end."""

from __future__ import annotations

from typing import Any

from codila_cli.models.tokens import encode_text


def is_chat(tokenizer: Any) -> bool:
    """A chat model (its tokenizer has a chat template): prompts go through the template and the code is
    extracted from the answer; otherwise raw completion."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer: Any, specials: Any, prompt: str, *, system: str | None = None,
                  messages: list[dict] | None = None) -> tuple[list[int], str]:
    """(ids, mode). mode "chat" when the tokenizer has a chat template, else "raw" (bos + text).
    ``messages`` (a whole conversation, chat models only) replaces ``system`` + ``prompt``."""
    if is_chat(tokenizer):
        if messages is None:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        try:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # noqa: BLE001 - a checkpoint's template (Jinja) is not codila's code
            from codila_cli.errors import ModelLoadError

            raise ModelLoadError(f"the model's chat template failed: {type(exc).__name__}: {str(exc)[:200]}",
                                 hint="the checkpoint's chat_template (tokenizer_config.json or chat_template.jinja) "
                                      "is broken: fix it, or use a checkpoint without one") from None
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids], "chat"
    text = (system + "\n\n" + prompt) if system else prompt
    ids = encode_text(tokenizer, text)  # a prompt's "<|endoftext|>" is text, not the end of the input
    return ([specials.bos] if specials.bos is not None else []) + list(ids), "raw"


def decode_text(tokenizer: Any, specials: Any, canvas: list[int]) -> str:
    """Text of the canvas up to the first stop token (special tokens dropped)."""
    stops = set(specials.stop_ids)
    cut = next((i for i, t in enumerate(canvas) if t in stops), len(canvas))
    ids = [t for t in canvas[:cut] if t != specials.mask]
    return tokenizer.decode(ids, skip_special_tokens=True)


def committed_text(tokenizer: Any, canvas: Any, *, mask_id: int, stop_ids: Any) -> str:
    """Text of the canvas's committed prefix: up to its first masked slot or stop token. No decoder in
    codila remasks a committed token, so this text is final (what a stream may send)."""
    ids = []
    for t in canvas:
        if t == mask_id or t in stop_ids:
            break
        ids.append(t)
    return tokenizer.decode(ids, skip_special_tokens=True)
