"""The client's HTTP transport (``ma_jupyter/client/transport.py``) against a loopback server of
the test's own that behaves as a restarting or idle-closing service does."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from ma_jupyter.client.transport import Connection, ReadTimedOut, Unreachable


class OneShotServer:
    """A loopback HTTP server that answers each connection's first request, then closes it
    without saying so (a keep-alive answer), as a service ending idle connections does; every
    request line it read is kept in ``requests``."""

    def __init__(self, *, answer: bool = True, reply: bytes | None = None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.reply = reply
        self.requests: list[str] = []
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data.split(b"\r\n", 1)[0].decode())
                if not self.answer:
                    conn.recv(1)  # never answers; the client's timeout ends the wait
                    continue
                body = b'{"ok": true}'
                if self.reply is not None:
                    conn.sendall(self.reply)
                    continue
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server():
    made = OneShotServer()
    yield made
    made.close()


def test_a_kept_alive_connection_closed_while_idle_is_replaced_and_the_query_is_encoded(server):
    conn = Connection()
    url = f"http://127.0.0.1:{server.port}/api/v1/jobs"
    params = {"status": ["queued", "running"], "name": "a b", "creator": None, "limit": 5}
    first = conn.request("GET", url, params=params, timeout=30)
    # the server closed the first connection after its answer: the second request goes out on
    # a fresh one instead of failing (rule 2)
    second = conn.request("POST", url, json_body={"x": 1}, timeout=30)
    conn.close()
    assert first.ok and first.json() == {"ok": True} and second.json() == {"ok": True}
    assert server.accepted == 2
    assert server.requests == [
        "GET /api/v1/jobs?status=queued&status=running&name=a+b&limit=5 HTTP/1.1",
        "POST /api/v1/jobs HTTP/1.1",
    ]


def test_refused_and_late_answers_raise_their_own_errors():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
    port = closed.getsockname()[1]
    try:
        with pytest.raises(Unreachable, match=rf"127\.0\.0\.1:{port}: .*Connection refused"):
            Connection().request("GET", f"http://127.0.0.1:{port}/", timeout=30)
    finally:
        closed.close()
    silent = OneShotServer(answer=False)
    try:
        with pytest.raises(ReadTimedOut, match=rf"127\.0\.0\.1:{silent.port}: no answer within 0.5 s"):
            Connection().request("GET", f"http://127.0.0.1:{silent.port}/", timeout=0.5)
    finally:
        silent.close()


def test_chunked_answers_are_read_and_unbounded_headers_refused():
    chunked = OneShotServer(
        reply=b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'7\r\n{"a": 1\r\n1;ext=1\r\n}\r\n0\r\n\r\n'
    )
    flood = OneShotServer(reply=b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n")
    # a length far beyond memory, then five bytes and the connection's end: refused as cut
    # short, without the claimed length ever allocated
    boast = OneShotServer(reply=b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nhello" % (1 << 50))
    negative = OneShotServer(reply=b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhello")
    try:
        answer = Connection().request("GET", f"http://127.0.0.1:{chunked.port}/x", timeout=30)
        assert (answer.status_code, answer.ok, answer.json()) == (404, False, {"a": 1})
        with pytest.raises(Unreachable, match="more than 100 headers"):
            Connection().request("GET", f"http://127.0.0.1:{flood.port}/x", timeout=30)
        with pytest.raises(
            Unreachable, match=f"127.0.0.1:{boast.port}: the answer ended after 5 of {1 << 50} bytes"
        ):
            Connection().request("GET", f"http://127.0.0.1:{boast.port}/x", timeout=30)
        with pytest.raises(Unreachable, match=r"a negative length in the answer \(-1\)"):
            Connection().request("GET", f"http://127.0.0.1:{negative.port}/x", timeout=30)
    finally:
        chunked.close()
        flood.close()
        boast.close()
        negative.close()


def test_an_interrupted_answer_is_never_read_as_the_next_one():
    """Ctrl-C while an answer is read (a cell following a log): the next request, on the same
    connection object, gets its own answer, not the rest of the interrupted one (rule 6)."""
    import signal

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held = []

    def serve() -> None:
        first, _ = server.accept()  # answers half, then holds the connection open
        first.recv(65536)
        first.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"first": ')
        held.append(first)
        second, _ = server.accept()
        with second:
            second.recv(65536)
            second.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{"second": 2}')

    threading.Thread(target=serve, daemon=True).start()

    def interrupt(*_):
        raise KeyboardInterrupt

    conn = Connection()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            conn.request("GET", f"http://127.0.0.1:{port}/follow", timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    try:
        assert conn.request("GET", f"http://127.0.0.1:{port}/job", timeout=10).json() == {"second": 2}
    finally:
        conn.close()
        for sock in held:
            sock.close()
        server.close()


def test_a_plain_clients_first_call_asks_no_health_and_a_stale_runtime_file_is_found_out(
    server, tmp_path, monkeypatch
):
    """A command line's client (``plain``) sends its call to the runtime file's address at once
    (no ``/health`` round trip first); where nothing answers there (a service gone since, its
    runtime file left), it looks for the service as ``connect`` does and says so at once,
    instead of retrying the dead address."""
    import json

    from ma_jupyter.client import Client
    from ma_jupyter.errors import BackendUnavailable

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
    for name in ("MA_JUPYTER_URL", "MA_JUPYTER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    from ma_jupyter.procstat import STARTTIME, stat_fields

    runtime = tmp_path / "service.json"
    url = f"http://127.0.0.1:{server.port}"
    started = int(stat_fields(os.getpid())[STARTTIME])  # the file names this process, as it runs
    runtime.write_text(json.dumps({"url": url, "token": "t", "pid": os.getpid(), "started": started}))
    Client(plain=True, autostart=False).job_page()  # a plain view: the answer is not validated

    def asked() -> list[str]:  # method and path
        return [" ".join(line.split()[:2]).split("?")[0] for line in server.requests]

    assert asked() == ["GET /api/v1/jobs"]
    # a file naming a process that no longer runs (its pid now another's, or no start): the call,
    # which may carry secrets, goes out only once /health answered with the token
    for stale in ({"pid": os.getpid(), "started": started - 1}, {"pid": os.getpid()}):
        server.requests.clear()
        runtime.write_text(json.dumps({"url": url, "token": "t", **stale}))
        Client(plain=True, autostart=False).job_page()
        assert asked() == ["GET /api/v1/health", "GET /api/v1/jobs"], stale

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
    try:
        runtime.write_text(json.dumps({"url": f"http://127.0.0.1:{closed.getsockname()[1]}", "token": "t"}))
        with pytest.raises(BackendUnavailable, match="no job service answers for"):
            Client(plain=True, autostart=False, retry_for=3).job_page()
    finally:
        closed.close()
