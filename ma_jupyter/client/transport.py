"""The client's HTTP transport: HTTP/1.1 on the standard library's :mod:`http.client`.

The job service is reached on loopback (or the URL a user names), one JSON request at a time,
so the client needs no third-party HTTP stack: importing ``requests`` (with urllib3,
charset_normalizer, idna, certifi) cost a command-line call about a third of its time.

Rules of :meth:`Connection.request`:

1. One kept-alive connection per :class:`Connection` (the client keeps one per thread); a
   connection the service closed (its answer said so, or a restart dropped it) is replaced by a
   fresh one.
2. A request sent on a kept-alive connection that turns out closed before any byte of the
   answer came (the service ended idle connections) is sent once more on a fresh connection,
   as urllib3 does with a dropped pooled connection; every request of the client is safe to
   repeat (submits carry an idempotency key).
3. A failure to reach the service or to read its whole answer raises :class:`Unreachable`
   (worth retrying while a service restarts); a read that outlasts ``timeout`` raises
   :class:`ReadTimedOut`.  Their text is the operating system's, after the address it could
   not reach (``127.0.0.1:9: [Errno 111] Connection refused``).
4. No proxy from the environment is used: the service's token never leaves for a proxy.
5. A request ended by anything else (an interrupt while an answer is read) closes the
   connection: what is left of that answer is never read as the next request's.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import urlencode, urlsplit

from ..errors import ReadTimedOut, TransportError, Unreachable  # noqa: F401 (TransportError: re-exported)


class Response:
    """An HTTP answer read whole: ``status_code``, ``content`` (bytes), ``ok``, ``json()``, ``text``."""

    __slots__ = ("status_code", "content")

    def __init__(self, status_code: int, content: bytes):
        self.status_code = status_code
        self.content = content

    @property
    def ok(self) -> bool:
        """Whether the status is below 400."""
        return self.status_code < 400

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is none."""
        return json.loads(self.content)


# A kept-alive connection the peer closed shows as one of these on the next request (rule 2).
_DROPPED = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class Connection:
    """One kept-alive HTTP connection, reopened as needed (not thread-safe: one per thread)."""

    def __init__(self) -> None:
        self._conn: http.client.HTTPConnection | None = None
        self._origin: tuple[str, str] | None = None

    def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._origin = None

    def request(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float,
    ) -> Response:
        """Send one request and read its whole answer (the rules of the module).

        Args:
            url: an ``http://`` (or ``https://``) URL.
            params: query parameters; a list value repeats its key; None values are left out.
            json_body: sent as JSON when not None.
            timeout: seconds for connecting and for each read of the answer.
        """
        parts = urlsplit(url)
        target = parts.path or "/"
        query = urlencode(
            [
                (k, item)
                for k, v in (params or {}).items()
                if v is not None
                for item in (v if isinstance(v, (list, tuple)) else [v])
            ]
        )
        if parts.query or query:
            target += "?" + "&".join(q for q in (parts.query, query) if q)
        sent_headers = {"Accept": "application/json", **(headers or {})}
        body = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            sent_headers["Content-Type"] = "application/json"
        for _ in range(2):
            reused = self._conn is not None and self._origin == (parts.scheme, parts.netloc)
            conn = self._open(parts.scheme, parts.netloc, timeout)
            try:
                conn.request(method, target, body=body, headers=sent_headers)
                answer = conn.getresponse()
                content = answer.read()
            except TimeoutError as exc:  # socket.timeout: the answer is late
                self.close()
                raise ReadTimedOut(f"no answer within {timeout:g} s ({exc or 'timed out'})") from exc
            except _DROPPED as exc:
                self.close()
                if reused:
                    continue  # rule 2: the kept-alive connection was closed while idle
                raise Unreachable(_said(exc)) from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise Unreachable(_said(exc)) from exc
            except BaseException:
                # an interrupt (Ctrl-C while following a log) mid-request: the rest of this
                # answer would be read as the next request's, so the connection goes (rule 5)
                self.close()
                raise
            if answer.will_close:
                self.close()
            return Response(answer.status, content)
        raise AssertionError("unreachable")  # the second try never continues

    def _open(self, scheme: str, netloc: str, timeout: float) -> http.client.HTTPConnection:
        """The connection to ``netloc``, connected, with ``timeout`` on its socket."""
        if self._conn is not None and self._origin == (scheme, netloc):
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
                return self._conn
        self.close()
        if scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(netloc, timeout=timeout)
        elif scheme == "http":
            conn = http.client.HTTPConnection(netloc, timeout=timeout)
        else:
            raise Unreachable(f"{scheme}://{netloc} is no http:// or https:// URL")
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, http.client.HTTPException) as exc:  # refused, unknown host, connect timeout
            conn.close()
            raise Unreachable(f"{netloc}: {_said(exc)}") from exc
        self._conn, self._origin = conn, (scheme, netloc)
        return conn


def _said(exc: BaseException) -> str:
    """What went wrong, in the operating system's words."""
    return str(exc) or type(exc).__name__
