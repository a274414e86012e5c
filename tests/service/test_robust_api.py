"""The API and the client under faults (issue 15, items 6, 7, 8 and 10), on a real service.

A failing request answers the typed body and keeps the connection usable; followers and
submits survive a service killed with ``kill -9`` or a connection dropped before the answer;
a retried submit never makes a second job; the token only travels in a header; bodies are
capped; a huge command is parsed in linear time.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sqlite3
import sys
import textwrap
import threading
import time
import uuid

import pytest

from tests.fixtures.service_api import pycmd, submit, wait_status
from tests.helpers import wait_for

PY = sys.executable


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 that can drop the next answer: it forwards a request to the
    service, lets the service answer, then closes both sides without passing the answer on."""

    def __init__(self, upstream_url: str):
        self.upstream = ("127.0.0.1", int(upstream_url.rsplit(":", 1)[1]))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.drop_next = 0
        self.dropped = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers:
                    with self._lock:
                        drop = self.drop_next > 0
                        if drop:
                            self.drop_next -= 1
                            self.dropped += 1
                    if drop:
                        break
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_a_500_answers_the_typed_body_and_the_next_call_still_works(ma_service, ma_home):
    from ma_jupyter.client import Client
    from ma_jupyter.errors import BackendUnavailable, MaJupyterError

    good = submit(ma_service, name="good", command=f"{PY} -c pass")
    broken = submit(ma_service, name="broken", command=f"{PY} -c pass")
    wait_status(ma_service, broken["id"], {"succeeded"})
    wait_status(ma_service, good["id"], {"succeeded"})
    # a fault in the service's own data (here: a row that no longer parses) makes a real 500
    from ma_jupyter import config

    with sqlite3.connect(config.db_path()) as db:  # MA_JUPYTER_HOME is the service's home here
        db.execute("UPDATE jobs SET job = ? WHERE id = ?", ('{"not": "a job"}', broken["id"]))
    # on one HTTP connection: the 500 does not close it, the next request is answered on it
    host, port = ma_service.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Authorization": f"Bearer {ma_service.token}"}
    conn.request("GET", f"/api/v1/jobs/{broken['id']}", headers=headers)
    first = conn.getresponse()
    body = json.loads(first.read())
    assert first.status == 500 and body["error"] == "error" and "ValidationError" in body["message"]
    assert first.getheader("connection", "").lower() != "close"
    conn.request("GET", f"/api/v1/jobs/{good['id']}", headers=headers)
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["id"] == good["id"]
    conn.close()
    # the client sees the typed error, not "service unavailable", and its next call works
    client = Client(autostart=False)
    with pytest.raises(MaJupyterError) as err:
        client.get(broken["id"])
    assert not isinstance(err.value, BackendUnavailable)
    assert client.get(good["id"]).id == good["id"]
    assert "ValidationError" in (ma_home / "service.log").read_text()
    client.close()


def test_bad_bodies_routes_and_url_tokens_get_typed_answers(ma_module_service):
    s = ma_module_service.session()
    jobs_before = s.get(f"{ma_module_service.api}/jobs", timeout=10).json()["total"]
    r = s.post(
        f"{ma_module_service.api}/jobs",
        data=b"\xff\xfe{",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"] == "invalid_spec", r.text
    r = s.get(f"{ma_module_service.url}/api/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = s.put(f"{ma_module_service.api}/jobs", timeout=10)
    assert r.status_code == 405 and set(r.json()) == {"error", "message", "field"}
    # bodies are capped, declared or not
    big = {"name": "t", "command": "python x.py", "env": {"X": "a" * (2 << 20)}}
    r = s.post(f"{ma_module_service.api}/jobs", json=big, timeout=30)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    chunks = (b"x" * 65536 for _ in range(40))  # 2.5 MiB, chunked: no Content-Length
    r = s.post(
        f"{ma_module_service.api}/jobs", data=chunks, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    # the token only travels in the Authorization header
    import requests

    r = requests.get(f"{ma_module_service.api}/health", params={"token": ma_module_service.token}, timeout=10)
    assert r.status_code == 401
    assert s.get(f"{ma_module_service.api}/health", timeout=10).json()["ok"] is True
    assert (
        s.get(f"{ma_module_service.api}/jobs", timeout=10).json()["total"] == jobs_before
    )  # none of them made a job


def test_a_huge_command_is_answered_at_once(ma_module_service):
    s = ma_module_service.session()
    # the longest command a spec takes (128 KiB), with the error at its end
    command = "echo " + "a" * 130_000 + " ; echo done"
    started = time.monotonic()
    r = s.post(f"{ma_module_service.api}/plan", json={"name": "t", "command": command}, timeout=120)
    print(f"a 130 kB command was refused in {time.monotonic() - started:.2f} s")
    assert r.status_code == 400 and "';'" in r.json()["message"]
    assert s.get(f"{ma_module_service.api}/health", timeout=10).status_code == 200


@pytest.mark.timeout(300)
def test_a_follower_resumes_at_its_offset_across_two_kill_9_restarts(ma_service):
    from ma_jupyter.client import Client

    count = 1500
    script = textwrap.dedent(f"""
        import time
        for i in range({count}):
            print(f'line {{i}}', flush=True)
            time.sleep(0.006)
    """)
    job = submit(ma_service, command=pycmd(script), grace_period=1)
    client = Client(autostart=False, local_logs=False)
    lines: list[str] = []
    failures: list[BaseException] = []

    def follow() -> None:
        try:
            for line in client.job(job["id"]).logs(follow=True):
                lines.append(line)
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    services = [ma_service]
    for seen in (300, 800):
        try:
            wait_for(lambda seen=seen: len(lines) >= seen or failures, timeout=60)
        except AssertionError:
            svc = services[-1]
            events = svc.session().get(f"{svc.api}/jobs/{job['id']}/events", timeout=5).json()
            raise AssertionError(f"{len(lines)} lines so far; job events: {events}") from None
        assert not failures, failures
        os.kill(services[-1].proc.pid, signal.SIGKILL)
        services[-1].proc.wait(10)
        time.sleep(0.5)  # the job goes on printing while no service runs
        services.append(ma_service.restart())
    follower.join(timeout=120)
    assert not follower.is_alive() and not failures, failures
    assert lines == [f"line {i}" for i in range(count)]
    assert wait_status(services[-1], job["id"], {"succeeded", "error"})["status"] == "succeeded"
    client.close()


def test_a_submit_whose_answer_was_lost_is_retried_without_a_duplicate(ma_module_service):
    from ma_jupyter.client import Client

    s = ma_module_service.session()
    key = uuid.uuid4().hex
    keyed, dropped = f"keyed-{key[:8]}", f"dropped-answer-{key[:8]}"  # this test's own jobs
    body = {"name": keyed, "command": f"{PY} -c pass"}
    first = s.post(f"{ma_module_service.api}/jobs", json=body, headers={"Idempotency-Key": key}, timeout=10)
    again = s.post(f"{ma_module_service.api}/jobs", json=body, headers={"Idempotency-Key": key}, timeout=10)
    assert first.status_code == 201 and again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    other_user = ma_module_service.user_session("someone-else")
    theirs = other_user.post(
        f"{ma_module_service.api}/jobs", json=body, headers={"Idempotency-Key": key}, timeout=10
    )
    assert theirs.json()["id"] != first.json()["id"]  # keys are per user
    assert s.get(f"{ma_module_service.api}/jobs", params={"name": keyed}, timeout=10).json()["total"] == 2

    proxy = DroppingProxy(ma_module_service.url)
    try:
        client = Client(proxy.url, token=ma_module_service.token, retry_for=20)
        client.connect()
        proxy.drop_next = 1  # the service creates the job, its answer never arrives
        handle = client.submit(name=dropped, command=f"{PY} -c \"print('once')\"")
        assert proxy.dropped == 1
        page = s.get(f"{ma_module_service.api}/jobs", params={"name": dropped}, timeout=10).json()
        assert page["total"] == 1 and page["items"][0]["id"] == handle.id
        assert wait_status(ma_module_service, handle.id, {"succeeded", "error"})["status"] == "succeeded"
        client.close()
    finally:
        proxy.close()
