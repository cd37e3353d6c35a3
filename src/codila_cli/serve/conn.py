"""Connections no client can hold open for free (issue 53): uvicorn's HTTP/1.1 protocol (h11) closes a
connection after a response once it has been idle ``--timeout-keep-alive`` seconds, but never one that
connects and sends nothing, or sends its request head or body a byte at a time. Here a connection must
send a whole request head within ``idle_s`` seconds of connecting (or of its last response), and the
whole body within ``idle_s`` seconds of its head; otherwise it is closed (a late body is answered 408
first). A request being decoded or streamed is never cut by this. And the process's soft descriptor
limit is raised to its hard limit, so that idle sockets meet the timeout before they meet the limit;
when they meet it all the same, asyncio's accept loop logged a traceback per retry (5.7 MB in 8 s with
400 sockets at a 256 limit): :func:`quiet_accept_errors` says it in one line, at most every 10 s.
"""

from __future__ import annotations

import asyncio
from typing import Any

BODY_LATE = "codila.body_late"  # the scope key set on a request whose body did not arrive in time

_LATE = b'{"error": {"message": "the request body came too slowly", "type": "invalid_request_error", "code": 408}}'
_LATE_BODY = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: " + str(len(_LATE)).encode() + b"\r\n\r\n" + _LATE)


def protocol_class(idle_s: float) -> type:
    """uvicorn's h11 protocol with a deadline for each request head and each request body."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadDeadline(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _timed: Any = None  # the request cycle whose body the body timer watches

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._timed and cycle.more_body and not cycle.response_complete:
                self._timed = cycle  # its head is in, its body is not: the body has idle_s seconds from now
                if self._body_timer is not None:
                    self._body_timer.cancel()
                self._body_timer = self.loop.call_later(idle_s, self._body_late)

        def _body_late(self) -> None:
            self._body_timer = None
            cycle = self.cycle
            if cycle is self._timed and cycle is not None and cycle.more_body and not cycle.response_complete:
                cycle.scope[BODY_LATE] = True
                if not cycle.response_started:
                    self.transport.write(_LATE_BODY)
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(idle_s, self._head_late)

        def _head_late(self) -> None:
            self._head_timer = None
            if self.cycle is None or self.cycle.response_complete:  # no request in flight: idle or slow
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request head has its own deadline

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._head_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._body_timer = None
            super().connection_lost(exc)

    return HeadDeadline


def raise_descriptor_limit() -> tuple[int, int] | None:
    """Raise the soft RLIMIT_NOFILE to the hard one; the (soft, hard) pair now, or None where unknown."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return None


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, *, every_s: float = 10.0) -> None:
    """The event loop's handler for "out of descriptors" on accept: one line on stderr at most every
    ``every_s`` seconds, no traceback; every other error goes to the loop's default handler."""
    import sys
    import time

    last = [float("-inf")]

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if "socket.accept() out of system resource" not in str(context.get("message", "")):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            exc = context.get("exception")
            sys.stderr.write(f"codila serve: cannot accept connections ({exc}); they wait until idle ones close "
                             "(--idle-timeout) or the descriptor limit is raised (ulimit -n)\n")
            sys.stderr.flush()

    loop.set_exception_handler(handler)
