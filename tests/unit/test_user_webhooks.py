"""The users' own webhooks (service/webhooks.py) against real loopback HTTP servers: hostile ones
(silent, failing, flooded) keep the queue bounded and the retries counted."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ma_jupyter.errors import InvalidSpec
from ma_jupyter.service.webhooks import UserWebhooks, check_url


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
    sender = UserWebhooks(hooks.get, timeout=0.5, tries=3, retry_after=0.05, per_user=10, max_users=4)
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
    assert check_url(" https://hooks.example/x?y=1 ") == "https://hooks.example/x?y=1"
    for bad in ("file:///etc/passwd", "javascript:alert(1)", "http:///x", "http://h:70000/", "x" * 3000):
        with pytest.raises(InvalidSpec, match="webhook|characters"):
            check_url(bad)
