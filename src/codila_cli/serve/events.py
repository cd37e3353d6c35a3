"""How a decoding request's answer ends (serve/stream.py::run_job): the stream's chunks in the endpoint's
format (:func:`events`), a stream that finishes its request however the client leaves (:class:`Stream`),
and the API error a failure becomes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi.responses import StreamingResponse

from codila_cli.serve.errors import APIError


class Stream(StreamingResponse):
    """A stream whose request is finished (its slots released, its rows cancelled) however the response
    ends: a client that goes away before the first byte leaves the body generator unstarted, so its own
    ``finally`` never runs, and a cancelled send leaves it suspended until the garbage collector."""

    def __init__(self, content: Any, finish: Any, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._finish = finish

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import anyio

        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish()


def stopped() -> APIError:
    return APIError(503, "the server is stopping: this request was cancelled; send it again", kind="server_error",
                    code="server_shutdown")


async def events(job: Any, style: str, queue: asyncio.Queue, finish: Any, st: Any, t0: float, ticket: Any):
    """The stream's chunks; it always ends in the format's way: the last chunks and ``[DONE]``, or an error
    event (and ``[DONE]`` where the format has it) when the request failed, ran past the deadline or the
    server stopped. A client that went away gets nothing more."""
    from codila_cli.serve import formats

    outs: dict[int, Any] = {}  # RowOut by row
    first = True
    try:
        for chunk in formats.opening(job, style):
            yield chunk
        left = set(range(job.n))
        while left:
            kind, i, value = await queue.get()
            if kind == "text":
                if first:
                    st.metrics.first_chunk.observe(time.perf_counter() - t0)
                    first = False
                yield formats.piece(job, style, i, value)
            elif kind == "error":
                yield formats.failure(job, style, as_api_error(value))
                for chunk in done(style):
                    yield chunk
                return
            else:
                out, ft = value
                if out is None:
                    if ticket.reason in ("deadline", "shutdown"):
                        yield formats.failure(job, style, stopped() if ticket.reason == "shutdown" else APIError(
                            504, f"the request ran past the server's deadline of {st.runner.deadline_s:g} s",
                            kind="timeout_error", code="deadline_exceeded"))
                        for chunk in done(style):
                            yield chunk
                    return
                rest = ft.rest(out.text)
                if rest:
                    yield formats.piece(job, style, i, rest)
                outs[i] = out
                left.discard(i)
                yield formats.last(job, style, i, out)
        count(st, list(outs.values()))
        for chunk in formats.closing(job, style, [outs[i] for i in range(job.n)]):
            yield chunk
    finally:
        await finish()


def done(style: str) -> list[str]:
    """OpenAI's end of stream after an error event (the other formats have none)."""
    return ["data: [DONE]\n\n"] if style.startswith("openai") else []


def count(st: Any, outs: list) -> None:
    for o in outs:
        st.metrics.prompt_tokens.inc(o.prompt_tokens)
        st.metrics.tokens.inc(o.completion_tokens)
        if "dlm_rows" in o.codila:  # a generation or a fill that ran to its end (not one cut by its time limit)
            mode = "on" if o.codila["exact_decode"] else "off"
            st.metrics.sequential.labels(mode).inc(o.codila["dlm_forwards"])
            st.metrics.canvases.labels(mode).inc(o.codila["dlm_rows"])
            st.metrics.exact_tokens.labels(mode).inc(o.completion_tokens)


def as_api_error(exc: BaseException) -> APIError:
    from codila_cli.errors import CodilaError, UsageError
    from codila_cli.serve.runner import DeadlineExceeded

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, DeadlineExceeded):
        return APIError(504, str(exc), kind="timeout_error", code="deadline_exceeded")
    if isinstance(exc, (UsageError, ValueError)):
        return APIError(400, str(exc))
    if isinstance(exc, CodilaError):
        return APIError(500, str(exc), kind="server_error")
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}"[:500], kind="server_error")
