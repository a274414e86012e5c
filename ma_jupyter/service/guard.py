"""The service's outermost request guard: body size cap and a typed answer for every failure.

Starlette's own catch-all answers a 500 and then re-raises, and uvicorn closes the connection
of a request whose application raised: the client's *next* call on that kept-alive connection
then fails.  This pure ASGI middleware catches everything below it instead, logs it to the
service log, and answers the typed error body (``{"error", "message", "field"}``), so one
failing request never breaks the next one.  A full disk (``ENOSPC``, SQLite's "database or disk
is full") becomes a 507 that names the folder.

It also caps request bodies: a declared ``Content-Length`` above the cap is refused before any
byte is read, and a body sent without one is counted while it is read.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from typing import Any

from ..errors import DiskFull, InvalidSpec, MaJupyterError, PayloadTooLarge

log = logging.getLogger("ma_jupyter.service")

#: largest request body accepted (a job spec is a few KiB; its command at most 128 KiB)
MAX_BODY = 1 << 20


def disk_full_message(path: str | os.PathLike | None, what: str = "") -> str:
    """The sentence every disk-full report starts with: ``disk full under <path>``."""
    return f"disk full under {path or 'the service home'}" + (f": {what}" if what else "")


def as_typed(exc: BaseException, home: str | os.PathLike | None = None) -> MaJupyterError:
    """The typed error a failure is reported as: itself when typed, 507 for a full disk, 400 for an
    undecodable body, else a 500 naming the exception (the traceback goes to the service log)."""
    if isinstance(exc, MaJupyterError):
        return exc
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = os.path.dirname(exc.filename) if isinstance(exc.filename, str) else home
        return DiskFull(disk_full_message(where, "free some space and try again"))
    if "database or disk is full" in str(exc):
        return DiskFull(
            disk_full_message(home, "the job service cannot record anything until space is freed")
        )
    if isinstance(exc, UnicodeDecodeError):
        return InvalidSpec("the request body is not UTF-8 JSON")
    return MaJupyterError(
        f"the job service failed on this request ({type(exc).__name__}: {exc}); see its log service.log"
    )


class GuardMiddleware:
    """ASGI middleware: see the module docstring.

    Args:
        app: the application it wraps.
        max_body: the request body cap in bytes.
        home: the folder named when SQLite reports a full disk.
    """

    def __init__(self, app: Any, max_body: int = MAX_BODY, home: str | os.PathLike | None = None):
        self.app = app
        self.max_body = max_body
        self.home = home

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.max_body):
            await _answer(send, self._too_large(), close=True)
            return
        started = False
        received = 0
        too_large = False

        async def counted_receive() -> dict:
            nonlocal received, too_large
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    too_large = True
                    raise self._too_large()
            return message

        async def tracked_send(message: dict) -> None:
            nonlocal started
            if too_large:
                # FastAPI turns any error while reading a body into its own 400: answer the 413
                if message.get("type") == "http.response.start" and not started:
                    started = True
                    await _answer(send, self._too_large(), close=True)
                return
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception as exc:
            error = as_typed(exc, self.home)
            if error.status >= 500:
                log.error(
                    "%s %s failed: %s", scope.get("method"), scope.get("path"), error.message, exc_info=exc
                )
            if not started:
                await _answer(send, error, close=isinstance(error, PayloadTooLarge))

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the request body is larger than {self.max_body} bytes, the most this service accepts"
        )


async def _answer(send: Any, error: MaJupyterError, *, close: bool = False) -> None:
    body = json.dumps(error.to_body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the unread rest of the body makes the connection unusable: say so
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
