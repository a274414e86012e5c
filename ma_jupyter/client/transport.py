"""The client's HTTP transport: HTTP/1.1 on a plain socket, the standard library's only.

The job service is reached on loopback (or the URL a user names), one JSON request at a time,
so the client needs no HTTP stack: importing ``requests`` (with urllib3, charset_normalizer,
idna, certifi) cost a command-line call about a third of its time, and :mod:`http.client`
imports :mod:`ssl` and the :mod:`email` package to parse headers, a fifth of what was left.

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
   :class:`ReadTimedOut`.  Their text names the address first, then what went wrong in the
   operating system's words (``127.0.0.1:9: [Errno 111] Connection refused``).
4. No proxy from the environment is used: the service's token never leaves for a proxy.
5. An answer is read as HTTP/1.1 says: its ``Content-Length``, else chunked, else up to the
   connection's end; a status line or header longer than 64 KiB, or more than 100 headers,
   is a broken answer (:class:`Unreachable`), as :mod:`http.client` bounds them; a body is
   read in pieces of at most 1 MiB (a claimed length is not allocated before its bytes came).
   ``https://`` URLs are wrapped in TLS (:mod:`ssl` imported only then).
6. A request ended by anything else (an interrupt while an answer is read) closes the
   connection: what is left of that answer is never read as the next request's.
"""

from __future__ import annotations

import json
import socket
from urllib.parse import urlencode, urlsplit

from ..errors import ConnectionDropped, ReadTimedOut, TransportError, Unreachable  # noqa: F401 (TransportError: re-exported)

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any

MAX_LINE = 65536
MAX_HEADERS = 100
READ_PIECE = 1 << 20  # bytes of a body read at a time (as http.client reads them)


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


class Connection:
    """One kept-alive HTTP connection, reopened as needed (not thread-safe: one per thread)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._origin: tuple[str, str] | None = None

    def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._reader is not None:
            self._reader.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = self._origin = None

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
        body = b"" if json_body is None else json.dumps(json_body).encode()
        head = [
            f"{method} {target} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Accept: application/json",
            "Accept-Encoding: identity",  # as http.client asks: no compressed answer
        ]
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if json_body is not None:
            head.append("Content-Type: application/json")
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        for _ in range(2):
            reused = self._sock is not None and self._origin == (parts.scheme, parts.netloc)
            self._open(parts, timeout)
            try:
                self._sock.sendall(data)
                status, close, content = self._answer(method)
            except TimeoutError as exc:  # socket.timeout: the answer is late
                self.close()
                raise ReadTimedOut(
                    f"{parts.netloc}: no answer within {timeout:g} s ({exc or 'timed out'})"
                ) from exc
            except (ConnectionDropped, BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as exc:
                self.close()
                if reused:
                    continue  # rule 2: the kept-alive connection was closed while idle
                raise Unreachable(f"{parts.netloc}: {_said(exc)}") from exc
            except (OSError, ValueError) as exc:
                self.close()
                raise Unreachable(f"{parts.netloc}: {_said(exc)}") from exc
            except BaseException:
                # an interrupt (Ctrl-C while following a log) mid-request: the rest of this
                # answer would be read as the next request's, so the connection goes (rule 6)
                self.close()
                raise
            if close:
                self.close()
            return Response(status, content)
        raise AssertionError("unreachable")  # the second try never continues

    def _open(self, parts: Any, timeout: float) -> None:
        """Be connected to the URL ``parts``' host and port, with ``timeout`` on the socket."""
        scheme, netloc = parts.scheme, parts.netloc
        if self._sock is not None and self._origin == (scheme, netloc):
            self._sock.settimeout(timeout)
            return
        self.close()
        if scheme not in ("http", "https"):
            raise Unreachable(f"{scheme}://{netloc} is no http:// or https:// URL")
        try:
            host, port = parts.hostname or "", parts.port or (443 if scheme == "https" else 80)
            try:  # an ASCII name or address: as bytes, so resolving it loads no IDNA codec
                address: str | bytes = host.encode("ascii")
            except UnicodeEncodeError:
                address = host
            sock = socket.create_connection((address, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                import ssl  # only for an https:// URL

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except (OSError, ValueError) as exc:  # refused, unknown host, bad port, timeout, TLS
            raise Unreachable(f"{netloc}: {_said(exc)}") from exc
        self._sock, self._reader, self._origin = sock, sock.makefile("rb"), (scheme, netloc)

    def _answer(self, method: str) -> tuple[int, bool, bytes]:
        """(status, whether the connection ends with it, body) of the next answer (rule 5)."""
        while True:
            line = self._line()
            if not line:
                raise ConnectionDropped("Remote end closed connection without response")
            version, _, rest = line.decode("latin-1").partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/") or not code.isdigit():
                raise ValueError(f"not an HTTP answer: {line[:80]!r}")
            status = int(code)
            fields: dict[str, str] = {}
            for _ in range(MAX_HEADERS + 1):
                header = self._line()
                if header in (b"\r\n", b"\n", b""):
                    break
                name, _, value = header.decode("latin-1").partition(":")
                fields[name.strip().lower()] = value.strip()
            else:
                raise ValueError(f"more than {MAX_HEADERS} headers")
            if status >= 200:
                break  # an interim answer (100 Continue) is followed by the real one
        close = fields.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        if method == "HEAD" or status in (204, 304):
            return status, close, b""
        if "chunked" in fields.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size = int(self._line().split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    while self._line() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return status, close, b"".join(chunks)
                chunks.append(self._exactly(size))
                self._exactly(2)
        if "content-length" in fields:
            return status, close, self._exactly(int(fields["content-length"]))
        return status, True, self._reader.read()  # up to the connection's end

    def _line(self) -> bytes:
        line = self._reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ValueError(f"an answer line longer than {MAX_LINE} bytes")
        return line

    def _exactly(self, count: int) -> bytes:
        """``count`` bytes of the answer, read in pieces: a length the peer claims is never
        allocated before its bytes came."""
        if count < 0:
            raise ValueError(f"a negative length in the answer ({count})")
        pieces = []
        left = count
        while left:
            piece = self._reader.read(min(left, READ_PIECE))
            if not piece:
                raise ValueError(f"the answer ended after {count - left} of {count} bytes")
            pieces.append(piece)
            left -= len(piece)
        return b"".join(pieces)


def _said(exc: BaseException) -> str:
    """What went wrong, in the operating system's words."""
    return str(exc) or type(exc).__name__
