"""Each user's own notification webhook, on a real service with real node processes.

Loopback webhooks are refused until the administrator names them in ``[notify] webhook_allow``.

Alice's webhook is a tiny HTTP server of the test on loopback; bob's is hostile: it accepts the
connection and never answers.  Bob's job ends first, so the service's delivery thread meets
bob's silent server before alice's events; alice's webhook still gets her job's performance
alert while it runs and its terminal state once it ends, the service answers meanwhile, and
nothing of bob's reaches alice.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ma_jupyter.client import Client
from tests.fixtures.service_api import wait_status
from tests.helpers import wait_for

PY = sys.executable
SLOW = "this iteration hardware time is 9.0 and e2e time is 10.0 ms."
# prints one slow line, then waits (bounded) for the test's word in its read-only dataset
SLOW_THEN_WAIT = (
    f'{PY} -c "import os, time\n'
    f"print('{SLOW}', flush=True)\n"
    "for _ in range(1200):\n"
    "    if os.path.exists('/workspace/dataset/private/ctl/go'): break\n"
    '    time.sleep(0.1)"'
)


class _Recorder(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.got.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def recorder():
    """A loopback HTTP server recording each POSTed JSON body: (url, list of (type, body))."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.got = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/alice?x=1", server.got
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent():
    """A loopback port that takes connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/never", sock
    sock.close()
    while _held:
        _held.pop().close()


@pytest.mark.timeout(300)
def test_a_users_webhook_gets_their_alert_and_end_and_a_silent_one_stalls_nothing(
    ma_home, ma_service, recorder, silent, tmp_path
):
    svc = ma_service
    alice, bob = svc.user_session("alice"), svc.user_session("bob")
    url, got = recorder
    # loopback (the service's own port here) is refused until the admin allows it
    for bad in (url, f"{svc.url}/api/v1/jobs"):
        reply = alice.put(f"{svc.api}/users/me/notify", json={"webhook": bad}, timeout=30)
        assert reply.status_code == 400 and "[notify] webhook_allow" in reply.text, reply.text
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + '[notify]\nwebhook_allow = ["127.0.0.1"]\n')
    # what a webhook may be: a clear refusal, nothing stored
    for bad in (
        "file:///etc/passwd",
        "ftp://host/x",
        "http://",
        "http://h:99999/",
        "http://169.254.169.254/",
    ):
        reply = alice.put(f"{svc.api}/users/me/notify", json={"webhook": bad}, timeout=10)
        assert reply.status_code in (400, 422), (bad, reply.text)
        assert "webhook" in reply.text, reply.text
    assert alice.get(f"{svc.api}/users/me/notify", timeout=10).json() == {"webhook": None, "address": None}
    assert alice.put(f"{svc.api}/users/me/notify", json={"webhook": url}, timeout=10).json() == {
        "webhook": url,
        "address": None,
    }
    # bob names his through the client
    bob_client = Client(url=svc.url, token=svc.user_token("bob"))
    try:
        assert bob_client.set_notify(silent[0]).webhook == silent[0]
        assert bob_client.notify_settings().webhook == silent[0]
    finally:
        bob_client.close()
    assert alice.get(f"{svc.api}/users/me/notify", timeout=10).json() == {"webhook": url, "address": None}

    reply = bob.post(f"{svc.api}/jobs", json={"name": "bobs", "command": f"{PY} -c 'print(1)'"}, timeout=30)
    assert reply.status_code == 201, reply.text
    bobs = reply.json()["id"]
    wait_status(svc, bobs, {"succeeded", "failed", "error"}, timeout=120)
    # bob's end is on its way to his silent server: the delivery thread waits on it now
    wait_for(lambda: _pending_connections(silent[1]), timeout=60)

    ctl = tmp_path / "ctl"
    ctl.mkdir()
    reply = alice.post(
        f"{svc.api}/jobs",
        json={
            "name": "alices",
            "command": SLOW_THEN_WAIT,
            "datasets": [{"name": "ctl", "path": str(ctl)}],
            "checkpoint_resume": {"perf_threshold": 0.5, "perf_policy": "alert", "grace_period": 1},
        },
        timeout=30,
    )
    assert reply.status_code == 201, reply.text
    alices = reply.json()["id"]
    # the alert reaches alice's webhook while her job runs, bob's silent server notwithstanding
    alert = wait_for(lambda: [b for _, b in got if b["kind"] == "alert"], timeout=120)[0]
    assert alert["job"] == alices and alert["user"] == "alice" and alert["node"] == "worker-0"
    assert alert["reason"].startswith("performance alert on worker-0")
    # the service answers meanwhile (its supervisor never waits on a webhook)
    assert alice.get(f"{svc.api}/jobs/{alices}", timeout=10).json()["status"] == "running"
    (ctl / "go").touch()
    wait_status(svc, alices, {"succeeded", "failed", "error"}, timeout=120)
    ended = wait_for(lambda: [b for _, b in got if b["kind"] == "ended"], timeout=120)[0]
    assert ended["job"] == alices and ended["status"] == "succeeded" and ended["name"] == "alices"
    # JSON, and only alice's own events
    assert {kind for kind, _ in got} == {"application/json"}
    assert {b["user"] for _, b in got} == {"alice"} and bobs not in {b["job"] for _, b in got}


def _pending_connections(sock: socket.socket) -> bool:
    """Whether a connection waits in ``sock``'s backlog (accepted here to see it, then held
    open unanswered, as the silent server would)."""
    sock.settimeout(0.5)
    try:
        conn, _ = sock.accept()
    except TimeoutError:
        return False
    _held.append(conn)
    return True


_held: list[socket.socket] = []
