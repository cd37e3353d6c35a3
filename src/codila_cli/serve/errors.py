"""API errors, in the shape the clients of each endpoint parse."""

from __future__ import annotations


class APIError(Exception):
    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers or {}


def error_body(path: str, status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """The error object clients of that endpoint parse: Ollama's {"error": "…"}; OpenAI's (and
    llama.cpp's, which has the same shape) {"error": {"message", "type", "param", "code"}}. A message that
    names a command-line flag names the request's field instead (serve/requests.py::request_terms)."""
    from codila_cli.serve.requests import request_terms

    message = request_terms(message, path)
    if path.startswith("/api/"):
        return {"error": message}
    return {"error": {"message": message, "type": kind, "param": param, "code": code if code is not None else status}}
