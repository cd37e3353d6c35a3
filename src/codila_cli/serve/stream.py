"""One decoding request from admission to its last byte: :class:`Job` (what to decode, validated before
anything is admitted, so a bad request is a 4xx and never a broken stream) and :func:`run_job` (its
rows in worker threads, then one JSON answer or a stream in the endpoint's format).

Streamed text is final text only: the committed prefix of each row's canvas (serve/requests.py::
FinalText), sent after each step that extends it, so the first chunk follows the first committed
block. The last chunk carries ``finish_reason`` and ``usage``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from codila_cli.serve.checks import fitted, request_settings, served, stop_list
from codila_cli.serve.errors import APIError
from codila_cli.serve.events import Stream, as_api_error, count, events, stopped


@dataclass
class RowOut:
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    codila: dict


@dataclass
class Job:
    kind: str  # "gen" | "infill"
    engine: Any
    settings: Any  # GenSettings (gen) or InfillConfig (infill)
    n: int = 1
    prompt: str = ""
    suffix: str = ""
    system: str | None = None
    messages: list[dict] | None = None
    stops: tuple[str, ...] = ()
    seed: int | None = None
    model: str = "codila"
    language: Any = None  # languages.Language the syntax report checks (located); None: not checked
    named: str | None = None  # the language or file name the request gave, as given
    context: int = 0  # characters at the start of ``prompt`` that are other files' text (/infill's input_extra)
    clamped: int | None = None  # the token limit a request asked beyond the context was lowered to
    fields: list[str] | None = None  # llama.cpp's response_fields: the answer holds only these paths
    listed: bool = False  # llama.cpp's n_cmpl > 1: the answer is a list, even of one
    deadline_ms: int | None = None  # llama.cpp's t_max_predict_ms: a fill returns what is committed by then
    n_indent: int | None = None  # llama.cpp's n_indent: a fill ends before a line indented less (serve/editor.py)
    nothing: bool = False  # asked for 0 tokens (llama.vscode's cache warm-up): answered empty, nothing decoded
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: "cmpl-" + uuid.uuid4().hex[:24])

    @classmethod
    def completion(cls, request: Request, *, prompt: str, suffix: str | None, max_tokens: int | None,
                   temperature: float | None, top_p: float | None, stop: Any, n: int, seed: int | None,
                   codila: dict | None, model: str | None, system: str | None = None) -> Job:
        from codila_cli.serve.requests import split_fim

        fim = (prompt, suffix) if suffix else split_fim(prompt)
        if fim is not None:  # a suffix, or a prompt in a FIM template: DreamOn fills the middle
            return cls.infill(request, prefix=fim[0], suffix=fim[1], max_middle=max_tokens, temperature=temperature,
                              top_p=top_p, seed=seed, codila=codila, model=model, n=n, stop=stop)
        st = request.app.state
        def settings_for(limit: int | None) -> Any:
            return request_settings(st.engine.settings, max_tokens=limit, temperature=temperature, top_p=top_p, codila=codila)

        settings, clamped = fitted(st.engine.models, prompt, settings_for(max_tokens or None), settings_for,
                                    system=system, messages=None)
        return cls("gen", st.engine, settings, n=n, prompt=prompt, system=system, stops=stop_list(stop),
                   seed=seed, model=model or served(st.engine.models.dlm.name), nothing=max_tokens == 0,
                   clamped=clamped)

    @classmethod
    def chat(cls, request: Request, *, messages: list[dict], max_tokens: int | None, temperature: float | None,
             top_p: float | None, stop: Any, n: int, seed: int | None, codila: dict | None, model: str | None) -> Job:
        from codila_cli.engine.prompts import is_chat

        st = request.app.state
        def settings_for(limit: int | None) -> Any:
            return request_settings(st.engine.settings, max_tokens=limit, temperature=temperature, top_p=top_p, codila=codila)

        models = st.engine.models
        if is_chat(models.dlm.tokenizer):
            prompt, msgs = "", messages
        else:  # a raw code model: the conversation's text, in order, is the prompt it continues
            prompt, msgs = "\n\n".join(m["content"] for m in messages if m["content"]), None
        settings, clamped = fitted(models, prompt, settings_for(max_tokens or None), settings_for, system=None,
                                   messages=msgs)
        return cls("gen", st.engine, settings, n=n, prompt=prompt, messages=msgs, stops=stop_list(stop),
                   seed=seed, model=model or served(models.dlm.name), clamped=clamped, nothing=max_tokens == 0)

    @classmethod
    def infill(cls, request: Request, *, prefix: str, suffix: str, max_middle: int | None, temperature: float | None,
               top_p: float | None, seed: int | None, codila: dict | None, model: str | None, n: int = 1,
               stop: Any = None) -> Job:
        from codila_cli.serve.requests import infill_settings

        st = request.app.state
        try:
            cfg = infill_settings(max_middle=max_middle or None, temperature=temperature, top_p=top_p, codila=codila)
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc), param="codila") from None
        models = st.engine.infill_models
        if models is None:
            raise APIError(400, "this server has no infill model", param="suffix")
        if cfg.needs_helper and models.ar is None:
            raise APIError(400, "codila.tau (CoDiLA infill) needs an AR helper, and this server has none",
                           param="codila")
        clamped = None
        if cfg.room_problem(models.dlm.context_length):  # more than the context leaves: the most it does leave
            clamped = models.dlm.context_length - 2 - 16
            if clamped < 1:
                raise APIError(400, cfg.room_problem(models.dlm.context_length), param="max_tokens")
            cfg = infill_settings(max_middle=clamped, temperature=temperature, top_p=top_p, codila=codila)
        if not (prefix or suffix).strip() and max_middle != 0:  # llama.vim's warm-up (n_predict 0) may be empty
            raise APIError(400, "the prefix and the suffix are both empty", param="prompt")
        return cls("infill", st.engine, cfg, n=n, prompt=prefix, suffix=suffix, stops=stop_list(stop), seed=seed,
                   model=model or served(models.dlm.name), nothing=max_middle == 0, clamped=clamped)

    def located(self, language: str | None, filename: str | None) -> Job:
        """This job, told the request's ``language`` / ``filename`` (one codila does not know: not checked)."""
        from codila_cli.languages import by_name, for_path

        self.named = language or filename
        self.language = (by_name(language) if language else None) or (for_path(filename) if filename else None)
        return self

    def syntax(self, text: str, span: tuple[int, int] | None, result: Any = None) -> dict:
        """The report of ``text`` in the request's language; a chat answer's fence (```go) names one too."""
        from codila_cli.syntax import check_code, fence_language, not_checked

        lang = self.language or (fence_language(result.completion) if result is not None and result.mode == "chat"
                                 else None)
        if lang is None:
            return not_checked(self.named).to_dict()
        if result is not None and lang.name == result.syntax.language:
            return result.syntax.to_dict()
        return check_code(text, language=lang, span=span).to_dict()

    def _clamp_info(self) -> dict:
        """``max_tokens_clamped_to``: the limit the request's own was lowered to (its context was shorter)."""
        return {"max_tokens_clamped_to": self.clamped} if self.clamped is not None else {}

    def seed_of(self, i: int) -> int | None:
        return None if self.seed is None else (self.seed + i) % 2**64  # llama.cpp's seeds are unsigned

    def decode(self, i: int, on_step: Any, on_row: Any) -> RowOut | None:
        """Row ``i`` (seed + i), in the calling worker thread; None when it was cancelled."""
        from codila_cli.decoding.batch import Cancelled
        from codila_cli.serve.requests import cut_at_stop

        try:
            if self.kind == "gen":
                s = self.settings
                r = self.engine.generate(self.prompt, decoder=s.decoder, config=s.config, seed=self.seed_of(i),
                                         system=self.system, messages=self.messages, on_step=on_step, batched=True,
                                         on_row=on_row, language=self.language)
                text, hit = cut_at_stop(r.completion, self.stops)
                m = r.metrics
                info = {"decoder": s.decoder, "seed": r.seed, "dlm_forwards": m["dlm_forwards"],
                        "dlm_rows": m["dlm_rows"], "exact_decode": m["freedave"] is not None,
                        "ar_forwards": m["ar_forwards"], "tokens_per_forward": round(m.get("tokens_per_step", 0.0), 3),
                        "wall_seconds": round(m["wall_seconds"], 4), **self._clamp_info(),
                        "syntax": self.syntax(r.text, (len(self.prompt), len(r.text)) if r.mode != "chat" else None, r)}
                return RowOut(text, "stop" if hit or m["ended"] else "length", r.prompt_tokens, m["tokens"], info)
            return self._fill(i, on_step, on_row)
        except Cancelled:
            return None

    def _fill(self, i: int, on_step: Any, on_row: Any) -> RowOut:
        """Row ``i`` of a fill-in-the-middle: DreamOn (or CoDiLA on its marginals), the client's stop strings,
        ``n_indent`` and time limit (serve/editor.py)."""
        from codila_cli.serve.editor import Deadline, OutOfTime, cut_indent
        from codila_cli.serve.requests import cut_at_stop

        tok = self.engine.infill_models.dlm.tokenizer
        timed = Deadline(on_step, self.tracker(), self.deadline_ms) if self.deadline_ms else None
        try:
            res, cut, seed = self.engine.infill_tokens(self.prompt, self.suffix, config=self.settings,
                                                       seed=self.seed_of(i), on_step=timed or on_step, batched=True,
                                                       on_row=on_row)
        except OutOfTime:  # what is committed, left to right, by the client's time limit
            from codila_cli.engine.tasks import context_cut

            text = cut_indent(cut_at_stop(timed.text, self.stops)[0], self.n_indent)[0]
            cut = context_cut(self.engine.infill_models.dlm, self.prompt, self.suffix, config=self.settings)[2]
            return RowOut(text, "length", cut["prefix_kept"] + cut["suffix_kept"],
                          len(tok.encode(text, add_special_tokens=False)),
                          {"decoder": "codila" if self.settings.needs_helper else "dreamon", "seed": self.seed_of(i),
                           "stopped_at_ms": self.deadline_ms, "wall_seconds": round(timed.seconds, 4),
                           **self._clamp_info()})
        text, hit = cut_at_stop(tok.decode(res.middle, skip_special_tokens=True), self.stops)
        text, short = cut_indent(text, self.n_indent)
        hit = hit or short
        info = {"decoder": "codila" if self.settings.needs_helper else "dreamon", "seed": seed,
                "dlm_forwards": res.dlm_forwards, "ar_forwards": res.ar_forwards,
                "dlm_rows": res.dlm_rows,
                "exact_decode": res.freedave is not None,
                "tokens_per_forward": round(len(res.middle) / res.dlm_forwards, 3) if res.dlm_forwards else 0.0,
                "expansions": res.expansions, "deletions": res.deletions, "context": cut,
                "wall_seconds": round(res.seconds, 4), **self._clamp_info(),
                "syntax": self.syntax(self.prompt[self.context:] + text + self.suffix,
                                      (len(self.prompt) - self.context, len(self.prompt) - self.context + len(text)))}
        return RowOut(text, "length" if res.truncated and not hit else "stop",
                      cut["prefix_kept"] + cut["suffix_kept"], len(res.middle), info)

    def tracker(self) -> Any:
        from codila_cli.decoding.stops import ends_line
        from codila_cli.serve.requests import FinalText

        models = self.engine.models if self.kind == "gen" else self.engine.infill_models
        tok, sp = models.dlm.tokenizer, models.dlm.specials
        lines = tuple(self.settings.config.stop or ()) if self.kind == "gen" else ()
        start = ends_line(tok, tok.encode(self.prompt, add_special_tokens=False)) if lines else True
        return FinalText(tokenizer=tok, mask_id=sp.mask, stop_ids=frozenset(sp.stop_ids), stops=self.stops,
                         lines=lines, at_line_start=start, n_indent=self.n_indent,
                         whole_lines=bool(self.deadline_ms))


async def run_job(request: Request, job: Job, *, style: str, stream: bool) -> Response:
    from codila_cli.serve.runner import DeadlineExceeded, QueueFull

    arrived = time.monotonic()  # the deadline counts from here: waiting for a slot uses it up too
    st = request.app.state
    if job.nothing:
        return _nothing(job, style, stream)
    runner = st.runner
    if job.n > runner.max_batch:  # it could never be admitted
        raise APIError(400, f"n = {job.n} is more than this server decodes at once (--max-batch {runner.max_batch})",
                       param="n")
    try:
        await runner.admit(job.n, since=arrived)
    except QueueFull as exc:
        if runner.stopping:
            raise stopped() from None
        raise APIError(429, f"the server is busy: {exc}; try again shortly", kind="rate_limit_error",
                       code="rate_limit_exceeded", headers={"Retry-After": "1"}) from None
    except DeadlineExceeded as exc:
        raise APIError(504, str(exc), kind="timeout_error", code="deadline_exceeded") from None
    ticket = runner.ticket()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    t0 = time.perf_counter()

    def row(i: int) -> Any:
        ft = job.tracker()

        def on_step(event: Any) -> None:
            if stream:
                text = ft.new_text(event)
                if text:
                    loop.call_soon_threadsafe(queue.put_nowait, ("text", i, text))

        try:
            out = job.decode(i, on_step, ticket.on_row)
        except BaseException as exc:
            loop.call_soon_threadsafe(queue.put_nowait, ("error", i, exc))
            raise
        loop.call_soon_threadsafe(queue.put_nowait, ("done", i, (out, ft)))
        return out

    watch = None if stream else request.is_disconnected
    tasks = [asyncio.ensure_future(runner.call(lambda i=i: row(i), ticket, watch=watch, since=arrived))
             for i in range(job.n)]

    finished = False

    async def finish() -> None:  # once, whichever way the request ends (its stream may never start)
        nonlocal finished
        if finished:
            return
        finished = True
        for t in tasks:
            if not t.done():
                t.cancel()
            elif not t.cancelled():
                t.exception()  # retrieved (a stream already answered it): no "never retrieved" warning
        ticket.cancel("finished")
        runner.done(ticket)
        runner.release(job.n)
        st.metrics.latency.labels(request.url.path).observe(time.perf_counter() - t0)

    if not stream:
        try:
            outs = await asyncio.gather(*tasks)
        except Exception as exc:  # noqa: BLE001 - one error object for this client
            raise as_api_error(exc) from None
        finally:
            await finish()
        if any(o is None for o in outs):  # cancelled: by a stopping server, else the client went away
            if ticket.reason == "shutdown":
                raise stopped()
            return Response(status_code=499)
        count(st, outs)
        from codila_cli.serve import formats

        return JSONResponse(formats.select(formats.document(job, style, outs), job.fields))
    return Stream(events(job, style, queue, finish, st, t0, ticket), finish,
                   media_type="application/x-ndjson" if style.startswith("ollama") else "text/event-stream",
                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _nothing(job: Job, style: str, stream: bool) -> Response:
    """The answer to a request for 0 tokens, at once: empty text, finish reason "length"."""
    from codila_cli.serve import formats

    outs = [RowOut("", "length", 0, 0, {"decoder": None, "dlm_forwards": 0, "ar_forwards": 0})] * job.n
    if not stream:
        return JSONResponse(formats.select(formats.document(job, style, outs), job.fields))
    chunks = [*formats.opening(job, style), *(formats.last(job, style, i, o) for i, o in enumerate(outs)),
              *formats.closing(job, style, outs)]
    return StreamingResponse(iter(chunks), media_type="application/x-ndjson" if style.startswith("ollama") else "text/event-stream")
