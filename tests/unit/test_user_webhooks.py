"""The users' own webhooks (service/webhooks.py) against real loopback HTTP servers: hostile ones
(silent, trickling, failing, flooded) keep the queue bounded, the retries counted and the
other users' deliveries on time; loopback, link-local and private destinations are refused unless
the administrator allows them; the log never shows a webhook's secrets."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ma_jupyter.errors import InvalidSpec
from ma_jupyter.service.webhooks import UserWebhooks, check_url

ALLOW_LOOPBACK = ("127.0.0.1",)  # the admin's [notify] webhook_allow: these tests' servers


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.got.append((self.path, body))
        self.send_response(500 if self.path.startswith("/fail") else 200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.got = []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd.got
    httpd.shutdown()
    httpd.server_close()


def _event(user: str, job: str) -> dict:
    return {"kind": "ended", "job": job, "name": "j", "user": user, "status": "succeeded"}


def _until(predicate, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if found := predicate():
            return found
        time.sleep(0.02)
    raise AssertionError("never happened")


def test_a_flood_to_a_silent_webhook_stays_bounded_and_other_users_still_get_theirs(server):
    base, got = server
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1024)
    hooks = {
        "bob": f"http://127.0.0.1:{silent.getsockname()[1]}/",
        "alice": f"{base}/alice",
        "carol": f"{base}/fail",
    }
    sender = UserWebhooks(
        hooks.get,
        allow=lambda: ALLOW_LOOPBACK,
        timeout=0.5,
        tries=3,
        retry_after=0.05,
        per_user=10,
        max_users=4,
    )
    try:
        for i in range(5000):  # push returns at once, whatever bob's server does
            sender.push(_event("bob", f"bob-{i}"))
        sender.push(_event("carol", "carol-1"))
        sender.push(_event("alice", "alice-1"))
        sender.push({**_event("alice", ""), "kind": "alert", "node": "n1"})  # a node's: no job
        for name in ("dave", "erin", "frank"):  # past max_users: dropped, not kept
            sender.push(_event(name, f"{name}-1"))
        with sender._cond:
            assert len(sender._pending.get("bob", ())) <= 10
            assert len(sender._pending) <= 4
        _until(lambda: any(p == "/alice" for p, _ in got))
        # carol's server answers 500: exactly `tries` POSTs, then dropped
        _until(lambda: sum(p == "/fail" for p, _ in got) >= 3)
        _until(lambda: "carol" not in sender._pending)
        assert sum(p == "/fail" for p, _ in got) == 3
    finally:
        sender.close(timeout=5)
        silent.close()
    alice = [b for p, b in got if p == "/alice"]
    assert [b["job"] for b in alice] == ["alice-1"]  # hers only, and no node's alert


def test_a_webhook_must_be_an_http_url():
    assert check_url(" https://93.184.215.14/x?y=1 ") == "https://93.184.215.14/x?y=1"  # public
    for bad in ("file:///etc/passwd", "javascript:alert(1)", "http:///x", "http://h:70000/", "x" * 3000):
        with pytest.raises(InvalidSpec, match="webhook|characters"):
            check_url(bad)


@pytest.fixture
def trickler():
    """A loopback server that reads a request, then sends one byte of a status line every second
    and never ends it (each read of the client is answered within any per-read timeout): the
    hostile webhook.  Yields (url, connections: list of [accepted, closed by the client])."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()
    conns: list[list[bool]] = []

    def serve(conn: socket.socket, seen: list[bool]):
        with conn:
            conn.recv(65536)
            while not stop.wait(1.0):
                try:
                    conn.sendall(b"H")
                except OSError:  # the client shut its socket: its deadline passed
                    seen[1] = True
                    return

    def accept():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            seen = [True, False]
            conns.append(seen)
            threading.Thread(target=serve, args=(conn, seen), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/slow", conns
    stop.set()
    sock.close()


def test_a_trickling_webhook_delays_another_users_delivery_at_most_by_the_deadline(server, trickler):
    base, got = server
    slow, conns = trickler
    hooks = {"bob": slow, "alice": f"{base}/alice"}
    # one worker: alice's event waits behind bob's try, which the deadline (not the per-read
    # timeout the trickle always beats) ends
    sender = UserWebhooks(hooks.get, allow=lambda: ALLOW_LOOPBACK, timeout=1.5, tries=1, workers=1)
    try:
        sender.push(_event("bob", "bob-1"))
        _until(lambda: conns)  # bob's try is under way, its server trickling
        sender.push(_event("alice", "alice-1"))
        _until(lambda: any(p == "/alice" for p, _ in got), timeout=60)
        _until(lambda: conns[0][1], timeout=30)  # bob's socket was shut, not left waiting
    finally:
        sender.close(timeout=5)
    # several workers: one user's slow server never holds up another's delivery at all
    got.clear()
    sender = UserWebhooks(hooks.get, allow=lambda: ALLOW_LOOPBACK, timeout=600, tries=1, workers=2)
    try:
        sender.push(_event("bob", "bob-2"))
        _until(lambda: len(conns) == 2)
        sender.push(_event("alice", "alice-2"))
        _until(lambda: any(b["job"] == "alice-2" for _, b in got), timeout=60)
        assert not conns[1][1]  # bob's server is still trickling to the open try
    finally:
        sender.close(timeout=0)  # bob's try ends when the trickler's teardown closes it


def test_loopback_link_local_and_private_destinations_are_refused_unless_the_admin_allows(server, caplog):
    for bad in (
        "http://127.0.0.1:8888/x",
        "http://localhost/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://[::1]:8888/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
    ):
        with pytest.raises(InvalidSpec, match=r"\[notify\] webhook_allow") as caught:
            check_url(bad)
        assert "webhook" in str(caught.value)
    assert check_url("http://127.0.0.1:8123/x", ["127.0.0.1:8123"]) == "http://127.0.0.1:8123/x"
    assert check_url("http://localhost:9/", ["localhost"]) == "http://localhost:9/"
    with pytest.raises(InvalidSpec, match="webhook_allow"):
        check_url("http://127.0.0.1:8124/x", ["127.0.0.1:8123"])
    # at delivery too: a webhook stored before the admin withdrew loopback gets nothing, and the
    # log names no secret of the URL
    base, got = server
    port = base.rsplit(":", 1)[1]
    hooks = {
        "mallory": f"{base}/ok",
        "alice": f"http://alice:pa55word@127.0.0.1:{port}/fail?token=t0ken",
    }
    allow: list[tuple] = [()]
    sender = UserWebhooks(hooks.get, allow=lambda: allow[0], timeout=5, tries=1)
    caplog.set_level(logging.INFO, logger="ma_jupyter.service.webhooks")
    try:
        sender.push(_event("mallory", "m-1"))
        _until(lambda: "refused" in caplog.text)
        allow[0] = ALLOW_LOOPBACK
        sender.push(_event("alice", "a-1"))
        _until(lambda: "answered 500" in caplog.text)
    finally:
        sender.close(timeout=5)
    assert [p for p, _ in got] == ["/fail?token=t0ken"]  # mallory's never reached the server
    assert f"http://127.0.0.1:{port}" in caplog.text
    for secret in ("pa55word", "t0ken", "/fail", "alice:"):
        assert secret not in caplog.text, caplog.text
