"""What one API request decodes: its settings (the server's resolved defaults, then the request's
own fields, then its ``codila`` object), and the text that is final as decoding goes on.

Nothing here knows HTTP: :func:`gen_settings` and :func:`infill_settings` turn request fields into a
decoder config (a bad value is a ``ValueError`` that the app answers with 400), and
:class:`FinalText` follows a row's step events and says which text can be sent now.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from codila_cli.decoding.events import StepEvent

# the `codila` request object: codila's own decoding choices, any knob of the table (decoding/config.py)
# except those the ecosystems' own fields carry (length, sampling) and the server's (models, device)
_OWN = ("max_new_tokens", "max_middle_tokens", "temperature", "top_p", "top_k", "stop", "device", "dtype")
_OWN_FIELD = ("max_new_tokens", "max_middle_tokens")  # the token limit: each endpoint names it (limit_field)


def _knob_values(codila: dict, table: Any, *, what: str) -> dict:
    """The request's ``codila`` object checked against a knob table: known keys, values of the knob's
    type and range (the config dataclass then checks the rules between knobs)."""
    known = [k for k in table if k not in _OWN]
    unknown = sorted(set(codila) - set(known) - {"stop_lines"})
    if unknown:
        raise ValueError(f"unknown codila {what}setting(s): {', '.join(unknown)} (known: {', '.join(known)}, stop_lines)")
    for key, value in codila.items():
        if key != "stop_lines" and not table[key].in_range(value):
            raise ValueError(f"codila.{key} must be {table[key].range_text() or table[key].kind.__name__}, got {value!r}")
    return codila


def request_terms(message: str, path: str = "/v1/") -> str:
    """A settings error in the request's words: a knob's command-line flag (``--cache``, from the config's
    own checks) becomes its field in the ``codila`` object (``codila.cache``), or the request's own field
    for what the request carries itself (``--max-new-tokens``: the token limit by the name the endpoint
    at ``path`` gives it: ``max_tokens``, llama.cpp's ``n_predict``, Ollama's ``options.num_predict``)."""
    import re

    if "-" not in message:
        return message
    from codila_cli.decoding.config import GEN_KNOBS, INFILL_KNOBS

    limit = limit_field(path)
    fields = {k.option: (limit if k.name in _OWN_FIELD else k.name) if k.name in _OWN else f"codila.{k.name}"
              for t in (GEN_KNOBS, INFILL_KNOBS) for k in t.values() if k.option}
    message = re.sub(r"(?<![\w-])--[a-z][a-z-]*", lambda m: fields.get(m[0], m[0]), message)
    # a config's range check names the flag without its dashes ("max-new-tokens must be …")
    return re.sub(r"^([a-z]+(?:-[a-z]+)+)(?= must)", lambda m: fields.get("--" + m[1], m[1]), message)


def limit_field(path: str) -> str:
    """The name a request to ``path`` gives its token limit."""
    if path.startswith("/api/"):
        return "options.num_predict"
    if path in ("/infill", "/completion"):
        return "n_predict"
    return "max_tokens"


@dataclass(frozen=True)
class GenSettings:
    decoder: str
    config: Any


def token_limit(settings: Any) -> int:
    """The most tokens a job's settings let it write: a fill's longest middle, a completion's canvas."""
    return settings.max_middle_tokens if hasattr(settings, "max_middle_tokens") else settings.config.max_new_tokens


def served_name(name: str) -> str:
    """A model's name as the server shows it: a directory given by an absolute or home-relative path is
    shown by its last part (an answer never reveals the server's file system); aliases and repo ids as given."""
    import os
    from pathlib import PurePath

    return PurePath(name).name if os.path.isabs(name) or name.startswith(("~", "./", "../")) else name


def stop_strings(stop: Any) -> tuple[str, ...]:
    """OpenAI's ``stop``: None, one string, or a list of at most 16 non-empty strings."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else list(stop)
    if len(items) > 16 or not all(isinstance(s, str) and s for s in items):
        raise ValueError("stop must be a non-empty string or a list of at most 16 non-empty strings")
    return tuple(items)


def gen_settings(base: Any, *, max_tokens: int | None, temperature: float | None, top_p: float | None,
                 codila: dict | None) -> GenSettings:
    """The decoder and config for one completion: ``base`` (resolve.GenRequest, the server's defaults:
    flags, config file, helper recommendation) with the request's fields on top. Another decoder than
    the server's (``codila.decoder``) starts from that decoder's config resolved from the same layers
    (``base.configs``). OpenAI ``stop``
    strings are not decoder settings (the text is cut after decoding: :func:`cut_at_stop`);
    ``codila.stop_lines`` are codila's line-start stops, which end decoding too."""
    from codila_cli.decoding.config import GEN_KNOBS, SamplingConfig
    from codila_cli.decoding.knobs import followers
    from codila_cli.resolve import decoder_configs

    codila = _knob_values(dict(codila or {}), GEN_KNOBS, what="")
    decoder = codila.pop("decoder", None) or base.decoder
    if decoder not in decoder_configs():
        raise ValueError(f"codila.decoder must be one of {', '.join(decoder_configs())}, got {decoder!r}")
    if decoder == "codila" and base.ar is None:
        raise ValueError("codila.decoder 'codila' needs an AR helper, and this server has none")
    kind = decoder_configs()[decoder]
    names = {f.name for f in dataclasses.fields(kind)}
    misplaced = sorted(set(codila) - names - {"stop_lines"})
    if misplaced:
        raise ValueError(f"codila setting(s) {', '.join(misplaced)} do not apply to the {decoder} decoder")
    cfg = base.config if decoder == base.decoder else base.configs.get(decoder) or kind()
    samp = cfg.sampling
    if temperature is not None or top_p is not None:
        samp = SamplingConfig(temperature=samp.temperature if temperature is None else float(temperature),
                              top_p=samp.top_p if top_p is None or top_p >= 1.0 else float(top_p), top_k=samp.top_k)
    lines = codila.pop("stop_lines", None)
    fields = {"max_new_tokens": cfg.max_new_tokens if max_tokens is None else max_tokens, "sampling": samp,
              "stop": cfg.stop if lines is None else stop_strings(lines), **codila}
    fields.update(_unrecommended(base, cfg, codila))
    new = dataclasses.replace(cfg, **fields)
    if hasattr(new, "tiling_problem"):  # LLaDA: blocks that tile this request's length, unless it set them
        new = new.fitted({*codila, *(k for k, v in base.sources.items() if v != "default")})
        if (problem := new.tiling_problem()) is not None:
            raise ValueError(problem)
    if temperature is not None:  # knobs that follow the temperature (the helper's), unless the request set them
        new = dataclasses.replace(new, **{k: samp.temperature for k in followers(GEN_KNOBS, "temperature")
                                          if k in names and k not in codila})
    return GenSettings(decoder=decoder, config=new)


def _unrecommended(base: Any, cfg: Any, codila: dict) -> dict:
    """The helper's recommendations that mean nothing or cannot run under the request's settings (the
    table's ``inert_when``: a cache when the request asks for ``ar_verify``, then its window), back at
    their defaults; what the request or the server's own settings chose stays."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.decoding.knobs import flat, inert

    values, out = {**flat(cfg), **codila}, {}
    while gone := [n for n in inert(GEN_KNOBS, values) if base.sources.get(n) == "helper" and n not in codila
                   and n not in out and n in values]:
        for name in gone:
            out[name] = values[name] = GEN_KNOBS.default(name)
    return out


def infill_settings(*, max_middle: int | None, temperature: float | None, top_p: float | None,
                    codila: dict | None, default_max: int = 64) -> Any:
    """DreamOn settings for one fill-in-the-middle request (``max_middle``: the longest middle)."""
    from codila_cli.decoding.config import INFILL_KNOBS, InfillConfig, SamplingConfig

    codila = dict(codila or {})
    codila.pop("decoder", None)
    codila = _knob_values(codila, INFILL_KNOBS, what="infill ")
    if "stop_lines" in codila:
        raise ValueError("codila.stop_lines applies to completions, not to a fill-in-the-middle")
    sampling = SamplingConfig(temperature=0.0 if temperature is None else float(temperature),
                              top_p=None if top_p is None or top_p >= 1.0 else float(top_p))
    n = max(1, default_max if max_middle is None or max_middle < 0 else max_middle)
    if "initial_masks" not in codila:  # a limit under the default start (n_predict 1 or 2): start there
        codila["initial_masks"] = min(n, INFILL_KNOBS.default("initial_masks"))
    return InfillConfig(max_middle_tokens=n, sampling=sampling, **codila)


# fill-in-the-middle templates that clients put into a plain prompt (Tabby's prompt_template, Continue's
# autocomplete templates): (prefix marker, suffix marker, middle marker); the text before the prefix
# marker (repository or file context) stays in front of the prefix
FIM_TEMPLATES = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
                 ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder
                 ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
                 ("<PRE> ", " <SUF>", " <MID>"))  # CodeLlama


def split_fim(prompt: str) -> tuple[str, str] | None:
    """(prefix, suffix) of a prompt written in one of FIM_TEMPLATES, ending with its middle marker;
    None for any other prompt."""
    for pre, suf, mid in FIM_TEMPLATES:
        body = prompt.rstrip() if mid.strip() != mid else prompt
        if pre in prompt and suf in prompt and body.endswith(mid.strip()):
            head, _, rest = prompt.partition(pre)
            prefix, _, tail = rest.partition(suf)
            suffix = tail[: tail.rfind(mid.strip())]
            if mid.startswith(" ") and suffix.endswith(" "):
                suffix = suffix[:-1]
            return head + prefix, suffix
    return None


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """(text before the first stop string, whether one occurred): OpenAI's ``stop``."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


@dataclass
class FinalText:
    """Follows one row's step events: the longest committed prefix of the canvas is final (no decoder
    in codila remasks a committed token), so its text can be sent. ``stops`` (OpenAI stop strings) are
    held back until they can no longer begin in the unsent tail; an incomplete UTF-8 character is held
    back too. With codila's line stops (``lines``, decoding/stops.py) only whole lines are sent, cut
    before the first line that starts with one, as the result is. llama.cpp's editor fields hold back
    what their cut could still remove (serve/editor.py): with ``n_indent`` a later line is sent once its
    indentation is known (its first other character), and nothing from the first line indented less;
    with ``whole_lines`` (a fill's time limit, which keeps whole lines) the text after the last line
    break, once there is one. :meth:`new_text` returns the text to send now, once."""

    tokenizer: Any
    mask_id: int
    stop_ids: frozenset
    stops: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    at_line_start: bool = True  # the prompt ends a line (read with ``lines``)
    n_indent: int | None = None  # llama.cpp's n_indent
    whole_lines: bool = False  # a time limit will keep whole lines only
    sent: str = ""
    stopped: bool = False
    def new_text(self, event: StepEvent) -> str:
        from codila_cli.engine.prompts import committed_text

        if self.stopped:
            return ""
        text = committed_text(self.tokenizer, event.canvas, mask_id=self.mask_id, stop_ids=self.stop_ids)
        while text.endswith("\ufffd"):  # a character whose bytes are not all committed yet
            text = text[:-1]
        if self.lines:
            from codila_cli.decoding.stops import stop_offset

            cut = stop_offset(text, self.lines, at_line_start=self.at_line_start)
            text = text[: text.rfind("\n") + 1] if cut is None else text[:cut]
        if self.stops:
            text, hit = cut_at_stop(text, self.stops)
            if hit:
                self.stopped = True
            else:  # a stop could still begin in the last len(stop) − 1 characters
                text = text[: max(len(self.sent), len(text) - max(len(s) for s in self.stops) + 1)]
        if self.n_indent:
            text = self._indent_cut(text)
        if self.whole_lines and "\n" in text:
            text = text[: text.rindex("\n") + 1]
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        out, self.sent = text[len(self.sent) :], text
        return out

    def _indent_cut(self, text: str) -> str:
        """``text`` cut as the answer will be (serve/editor.py::cut_indent; then nothing more is sent), else
        without a last line whose indentation is not known yet (blank so far)."""
        from codila_cli.serve.editor import cut_indent

        text, cut = cut_indent(text, self.n_indent)
        if cut:
            self.stopped = True
            return text
        last = text.rfind("\n")
        return text[: last + 1] if last >= 0 and not text[last + 1 :].strip() else text

    def rest(self, final: str) -> str:
        """What is left to send of ``final`` (the whole completion)."""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""
