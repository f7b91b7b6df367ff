"""The one aiohttp error middleware of kraftlog's HTTP servers (the broker and the controller).

Handlers answer errors by raising; `ErrorMiddleware` turns what they raise into the error
answer `{"error_code": NAME, "message": ..., **extra}`:
- a `KraftlogError`: its body, with the status of `HTTP_STATUS`;
- an aiohttp `HTTPException` of status >= 400 (no route, body too large, ...): the server's
  `http_error` rule names the code and message, the status stays the exception's (below 400,
  a redirect, it propagates as aiohttp's answer);
- anything else is a bug: a 500 UNKNOWN_SERVER_ERROR naming the exception, and one log line
  with its traceback.
Expected errors are answered without a log line, so a client repeating a bad request cannot
flood the log with tracebacks, and a cancelled handler (its client went away) is no error:
the cancellation propagates, unlogged.

Each server keeps the answers it gave before they shared this code (API.md): the broker's
(`http_api.broker.app`) names a 413 RECORD_LIST_TOO_LARGE and a missing route with a pointer
to /openapi.json, checks the internal token first and echoes the correlation id; the
controller's (`metadata_quorum.controller_server`) answers with `charset=utf-8` and maps a
5xx to UNKNOWN_SERVER_ERROR.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiohttp import web

from http_api.wire.codecs import JSON, error_body
from http_api.wire.errors import http_status
from partitions.errors import ErrorCode, KraftlogError

CLIENT_ID_HEADER = "X-Client-Id"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def reason_as_error(request: web.Request, exc: web.HTTPException) -> KraftlogError:
    """An aiohttp HTTPException as INVALID_REQUEST (4xx) or UNKNOWN_SERVER_ERROR (5xx) with
    its reason as the message."""
    code = ErrorCode.INVALID_REQUEST if exc.status < 500 else ErrorCode.UNKNOWN_SERVER_ERROR
    return KraftlogError(code, exc.reason)


def exception_message(exc: Exception) -> str:
    """The message of the 500 for an unexpected exception: `TypeName: text`."""
    return f"{type(exc).__name__}: {exc}"


class ErrorMiddleware:
    """Answers what handlers raise as kraftlog error answers (see the module docstring).

    log: where a bug is logged, with its traceback, as `unexpected_log` (a str.format
      template with `method`, `path` and `client_id`).
    http_error: the code and message of an HTTPException's answer.
    internal_error: the message of the 500 answering an unexpected exception.
    charset: added to the error answers' `Content-Type` when set.
    admit: runs before the handler; raises a KraftlogError to refuse the request.
    echo_headers: request headers copied onto the answer (success or error) when present.
    """

    __middleware_version__ = 1   # aiohttp: a new-style middleware

    def __init__(self, log: logging.Logger, *, unexpected_log: str,
                 http_error: Callable[[web.Request, web.HTTPException], KraftlogError] = reason_as_error,
                 internal_error: Callable[[Exception], str] = exception_message,
                 charset: str | None = None,
                 admit: Callable[[web.Request], None] | None = None,
                 echo_headers: tuple[str, ...] = ()) -> None:
        self.log = log
        self.unexpected_log = unexpected_log
        self.http_error = http_error
        self.internal_error = internal_error
        self.charset = charset
        self.admit = admit
        self.echo_headers = echo_headers

    def answer(self, err: KraftlogError, status: int) -> web.Response:
        return web.Response(body=error_body(err), status=status, content_type=JSON, charset=self.charset)

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if self.admit is not None:
                self.admit(request)
            resp = await handler(request)
        except KraftlogError as e:
            resp = self.answer(e, http_status(e))
        except web.HTTPException as e:
            if e.status < 400:
                raise
            resp = self.answer(self.http_error(request, e), e.status)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug must not kill the server
            self.log.exception(self.unexpected_log.format(
                method=request.method, path=request.path, client_id=request.headers.get(CLIENT_ID_HEADER)))
            resp = self.answer(KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, self.internal_error(e)), 500)
        for name in self.echo_headers:
            value = request.headers.get(name)
            if value is not None:
                resp.headers[name] = value
        return resp
