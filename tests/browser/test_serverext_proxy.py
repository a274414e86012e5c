"""The server extension as one authenticated reverse proxy, over HTTP against a real JupyterLab.

``<base_url>/ma-jupyter/api/v1/<path>`` is the job service's ``/api/v1/<path>`` behind Jupyter's
login: any route passes through unchanged, nothing passes without Jupyter's token or cookie,
and a cookie alone (what a cross-site page can make the browser send) does not start anything
without Jupyter's XSRF token.  No browser is needed here: the requests are made directly.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import psutil
import pytest
import requests

from tests.browser.lab import running_lab
from tests.helpers import wait_for

pytestmark = [pytest.mark.timeout(300)]

OWNER = pwd.getpwuid(os.geteuid()).pw_name  # the account that starts the service owns it


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab with the server extension, on its own job-service home (see tests/browser/lab.py)."""
    with running_lab(tmp_path_factory.mktemp("proxy-lab")) as running:
        yield running


def _api(lab, path: str) -> str:
    return f"{lab['url']}/ma-jupyter/api/v1/{path}"


def _auth(lab) -> dict[str, str]:
    return {"Authorization": f"token {lab['token']}"}


def _runtime(lab) -> dict:
    """The service's own address and token (started by the extension on first use)."""
    return json.loads((lab["home"] / "service.json").read_text())


def _direct(lab, path: str, **kwargs) -> requests.Response:
    runtime = _runtime(lab)
    headers = {"Authorization": f"Bearer {runtime['token']}"}
    return requests.get(f"{runtime['url']}/api/v1/{path}", headers=headers, timeout=30, **kwargs)


def _board_processes(job_id: str) -> list[psutil.Process]:
    """The job's TensorBoard processes: their path (``/tb/<job>/<secret>``) is in their
    environment, which this (root) test may read; never on a command line."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            prefix = proc.environ().get("MA_TENSORBOARD_PREFIX", "") if "tensorboard" in cmdline else ""
        except psutil.Error:
            continue
        if prefix.startswith(f"/tb/{job_id}/"):
            found.append(proc)
    return found


def test_any_service_route_passes_through_unchanged(lab):
    headers = _auth(lab)
    # a route the extension knows nothing about: the service's health, with the service's pid
    health = requests.get(_api(lab, "health"), headers=headers, timeout=60)
    assert health.status_code == 200, health.text
    assert health.json()["ok"] is True and health.json()["pid"] == _runtime(lab)["pid"]
    schema = requests.get(_api(lab, "openapi.json"), headers=headers, timeout=30).json()
    assert "/api/v1/jobs/{job_id}/status" in schema["paths"]
    # bodies and content types are the service's own
    for path in ("specs", "nodes", "nodes?spec=cpu.small"):
        proxied = requests.get(_api(lab, path), headers=headers, timeout=30)
        direct = _direct(lab, path)
        assert proxied.status_code == direct.status_code == 200
        assert proxied.content == direct.content
        assert proxied.headers["Content-Type"] == direct.headers["Content-Type"]

    # without JupyterHub the Jupyter user is the service owner, whatever the browser claims
    spec = {"name": "proxied-job", "command": "python -c 'import time; time.sleep(1)'"}
    claims = {"X-MA-User": "mallory", "X-MA-Forwarded-User": "mallory"}
    created = requests.post(_api(lab, "jobs"), json=spec, headers={**headers, **claims}, timeout=30)
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["spec"]["creator"] == OWNER
    # the status long-poll passes through and answers when the job ends
    final = requests.get(
        _api(lab, f"jobs/{job['id']}/status"), params={"wait": 30}, headers=headers, timeout=60
    )
    assert final.status_code == 200 and final.json()["status"] == "succeeded", final.text
    events = requests.get(_api(lab, f"jobs/{job['id']}/events"), headers=headers, timeout=30).json()
    assert [e["status"] for e in events][-1] == "succeeded"
    later = requests.get(
        _api(lab, f"jobs/{job['id']}/events"),
        params={"after": events[-1]["seq"]},
        headers=headers,
        timeout=30,
    )
    assert later.status_code == 200 and later.json() == []
    # repeated query parameters arrive as sent
    page = requests.get(
        _api(lab, "jobs"),
        params={"status": ["running", "succeeded"], "name": "proxied"},
        headers=headers,
        timeout=30,
    ).json()
    assert [j["id"] for j in page["items"]] == [job["id"]]
    # typed errors pass through with their status and body
    patch = requests.patch(
        _api(lab, f"jobs/{job['id']}"), json={"colour": "red"}, headers=headers, timeout=30
    )
    assert patch.status_code == 400 and patch.json()["error"] == "invalid_spec"
    assert "only priority and duration" in patch.json()["message"]
    unknown = requests.get(_api(lab, "no-such-route"), headers=headers, timeout=30)
    assert unknown.status_code == 404
    # nothing outside the service's /api/v1 is reachable through the proxy
    escape = requests.get(_api(lab, "%2e%2e/%2e%2e/api/v1/health"), headers=headers, timeout=30)
    assert escape.status_code == 404 and escape.json()["error"] == "not_found"
    # 204 without a body
    deleted = requests.delete(_api(lab, f"jobs/{job['id']}"), headers=headers, timeout=30)
    assert deleted.status_code == 204 and deleted.content == b""
    gone = requests.get(_api(lab, f"jobs/{job['id']}"), headers=headers, timeout=30)
    assert gone.status_code == 404 and gone.json()["error"] == "not_found"

    status = requests.get(f"{lab['url']}/ma-jupyter/service", headers=headers, timeout=30)
    assert status.status_code == 200 and status.json()["running"] is True
    assert status.json()["pid"] == _runtime(lab)["pid"]


def test_nothing_passes_without_jupyter_auth(lab):
    requests.get(_api(lab, "specs"), headers=_auth(lab), timeout=60).raise_for_status()  # service up
    service_token = {"Authorization": f"Bearer {_runtime(lab)['token']}"}
    for method, path in [
        ("GET", "specs"),
        ("GET", "health"),
        ("POST", "jobs"),
        ("POST", "plan"),
        ("PATCH", "jobs/x"),
        ("DELETE", "jobs/x"),
        ("GET", "jobs/x/status?wait=20"),
        ("POST", "jobs/x/tensorboard"),
    ]:
        for headers in ({}, {"Authorization": "token wrong"}, service_token):
            started = time.monotonic()
            body = {"name": "never-created", "command": "python -V"}
            r = requests.request(method, _api(lab, path), json=body, headers=headers, timeout=30)
            assert r.status_code == 403, (method, path, headers, r.status_code, r.text)
            assert time.monotonic() - started < 10  # refused at once, not after a long-poll
    assert requests.get(f"{lab['url']}/ma-jupyter/service", timeout=30).status_code == 403
    # nothing was created
    page = requests.get(_api(lab, "jobs"), params={"name": "never-created"}, headers=_auth(lab), timeout=30)
    assert page.json()["total"] == 0


def _cookie_session(lab) -> tuple[requests.Session, str]:
    """A browser-like session: logged in with Jupyter's cookie (no token on the requests)."""
    session = requests.Session()
    session.get(f"{lab['url']}/login", timeout=30)
    xsrf = session.cookies.get("_xsrf")
    assert xsrf
    login = session.post(
        f"{lab['url']}/login",
        data={"password": lab["token"], "_xsrf": xsrf},
        allow_redirects=False,
        timeout=30,
    )
    assert login.status_code == 302, login.text
    return session, xsrf


def test_cross_site_posts_without_xsrf_start_no_tensorboard(lab):
    outputs = lab["work"] / "xsrf-outputs"
    outputs.mkdir()
    outputs.chmod(0o777)  # whatever account the job runs as may write there
    spec = {"name": "xsrf-board", "command": "python -V", "outputs": str(outputs)}
    created = requests.post(_api(lab, "jobs"), json=spec, headers=_auth(lab), timeout=60)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    ended = requests.get(
        _api(lab, f"jobs/{job_id}/status"), params={"wait": 30}, headers=_auth(lab), timeout=60
    )
    assert ended.json()["status"] == "succeeded", ended.text
    session, xsrf = _cookie_session(lab)
    # the cookie is enough to read
    assert session.get(_api(lab, f"jobs/{job_id}"), timeout=30).status_code == 200

    evil = {"Origin": "http://evil.example", "Referer": "http://evil.example/page"}
    board = f"{lab['url']}/ma-jupyter/tensorboard/{job_id}/"
    query = board + "data/plugin/scalars/scalars_multirun"
    refused = [
        # a cross-site form post: the cookie but no XSRF token
        session.post(_api(lab, f"jobs/{job_id}/tensorboard"), headers=evil, timeout=30),
        session.post(_api(lab, f"jobs/{job_id}/tensorboard"), timeout=30),
        session.post(query, data={"tag": "loss", "runs": "."}, headers=evil, timeout=30),
        session.post(query, data={"tag": "loss", "runs": "."}, timeout=30),
        # TensorBoard's own header does not help a request from another site
        session.post(
            query, data={"tag": "loss", "runs": "."}, headers={**evil, "X-XSRF-Protected": "1"}, timeout=30
        ),
        # nor does the XSRF token with a foreign Origin
        session.post(
            _api(lab, f"jobs/{job_id}/tensorboard"), headers={**evil, "X-XSRFToken": xsrf}, timeout=30
        ),
    ]
    # Jupyter answers a foreign Origin with 404 and a missing XSRF token with 403
    assert [r.status_code for r in refused] == [404, 403, 404, 403, 404, 404], [
        (r.status_code, r.text[:200]) for r in refused
    ]
    time.sleep(1)
    assert _board_processes(job_id) == []

    # the sidebar's way: the cookie plus Jupyter's XSRF token (ServerConnection sends it)
    started = session.post(
        _api(lab, f"jobs/{job_id}/tensorboard"), headers={"X-XSRFToken": xsrf}, timeout=120
    )
    assert started.status_code == 200, started.text
    assert wait_for(lambda: _board_processes(job_id), timeout=30)
    # TensorBoard's pages need no XSRF token (GET), and its data queries carry its own header
    page = session.get(board, timeout=60)
    assert page.status_code == 200 and "<title>TensorBoard</title>" in page.text
    data = session.post(
        query, data={"tag": "loss", "runs": "."}, headers={"X-XSRF-Protected": "1"}, timeout=60
    )
    assert data.status_code == 200, data.text
    stopped = session.delete(
        _api(lab, f"jobs/{job_id}/tensorboard"), headers={"X-XSRFToken": xsrf}, timeout=60
    )
    assert stopped.status_code == 204


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (the Jupyter server that started the service reaps it only later)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_restarted_service_is_found_again(lab):
    headers = _auth(lab)
    requests.get(_api(lab, "specs"), headers=headers, timeout=60).raise_for_status()
    old = _runtime(lab)
    os.kill(old["pid"], signal.SIGTERM)
    wait_for(lambda: not _alive(old["pid"]), timeout=30)
    # the old address refuses the connection: the proxy finds (here: starts) the service anew
    specs = requests.get(_api(lab, "specs"), headers=headers, timeout=60)
    assert specs.status_code == 200, specs.text
    new = _runtime(lab)
    assert new["pid"] != old["pid"] and new["url"] != old["url"]
    health = requests.get(_api(lab, "health"), headers=headers, timeout=30).json()
    assert health["pid"] == new["pid"]


# A stand-in job service that shows what the proxy sends and how it relays: it answers /health
# (so the extension's client takes it for the service), echoes requests, streams, and breaks off.
FAKE_SERVICE = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def reply(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else None
        if self.path.startswith("/api/v1/health"):
            self.send_json({"ok": True, "pid": 0, "version": "fake"})
        elif self.path.startswith("/api/v1/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"first\n"); self.wfile.flush()
            time.sleep(3)
            self.wfile.write(b"second\n"); self.wfile.flush()
            self.close_connection = True
        elif self.path.startswith("/api/v1/cut"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"partial": '); self.wfile.flush()
            self.close_connection = True
        elif self.path.startswith("/api/v1/empty"):
            self.send_response(204)
            self.end_headers()
        else:
            self.send_json(
                {"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": body},
                status=418,
            )

    def send_json(self, data, status=200):
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.fake+json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("X-Fake", "yes")
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = reply

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextmanager
def _fake_lab(tmp, env: dict[str, str] | None = None):
    """JupyterLab whose job service is the stand-in above (its runtime file names it)."""
    fake = subprocess.Popen([sys.executable, "-c", FAKE_SERVICE], stdout=subprocess.PIPE, text=True)
    try:
        port = int(fake.stdout.readline())
        with running_lab(tmp, env=env) as running:
            runtime = {
                "url": f"http://127.0.0.1:{port}",
                "token": "fake-token",
                "proxy_token": "fake-proxy-token",
                "pid": fake.pid,
            }
            (running["home"] / "service.json").write_text(json.dumps(runtime))
            yield running
            (running["home"] / "service.json").unlink()  # nothing for the Lab's teardown to stop
    finally:
        fake.kill()
        fake.wait()


@pytest.fixture(scope="module")
def fake_lab(tmp_path_factory):
    with _fake_lab(tmp_path_factory.mktemp("fake-lab")) as running:
        yield running


def test_under_jupyterhub_another_hub_user_is_forwarded_with_the_proxy_token(tmp_path):
    """A server of JupyterHub user ``hub-owner`` used by another authenticated user (Jupyter's
    token login names a user of its own): that user's name goes out with the proxy token."""
    with _fake_lab(tmp_path, env={"JUPYTERHUB_USER": "hub-owner"}) as hub_lab:
        r = requests.get(
            _api(hub_lab, "jobs"), headers={**_auth(hub_lab), "X-MA-Forwarded-User": "mallory"}, timeout=30
        )
        assert r.status_code == 418, r.text
        sent = {k.lower(): v for k, v in r.json()["headers"].items()}
        assert sent["authorization"] == "Bearer fake-proxy-token"
        assert sent["x-ma-forwarded-user"] not in ("", "mallory", "hub-owner")


def test_the_proxy_relays_requests_and_answers_as_they_are(fake_lab):
    headers = {
        **_auth(fake_lab),
        "X-MA-User": "mallory",
        "X-MA-Forwarded-User": "mallory",
        "Cookie": "other=1",
        "Content-Type": "text/x-any",
    }
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        body = None if method in ("GET", "DELETE") else f"raw {method} body"
        r = requests.request(
            method, _api(fake_lab, "jobs/a%2Fb/x?y=1&y=2&z"), data=body, headers=headers, timeout=30
        )
        # status, content type, other headers and body: the service's own
        assert r.status_code == 418, r.text
        assert r.headers["Content-Type"] == "application/vnd.fake+json"
        assert r.headers["X-Fake"] == "yes"
        seen = r.json()
        assert seen["method"] == method
        assert seen["path"] == "/api/v1/jobs/a%2Fb/x?y=1&y=2&z"
        assert seen["body"] == body
        sent = {k.lower(): v for k, v in seen["headers"].items()}
        # the owner's token goes out (no JupyterHub: the Jupyter user is the owner), no user
        # the browser names, and nothing of Jupyter's credentials
        assert sent["authorization"] == "Bearer fake-token"
        assert "x-ma-user" not in sent and "x-ma-forwarded-user" not in sent
        assert "cookie" not in sent
        assert sent["content-type"] == "text/x-any"

    # a 204 stays empty
    empty = requests.get(_api(fake_lab, "empty"), headers=_auth(fake_lab), timeout=30)
    assert empty.status_code == 204 and empty.content == b""

    # the answer is relayed while it arrives: the first line comes before the service is done
    started = time.monotonic()
    with requests.get(_api(fake_lab, "stream"), headers=_auth(fake_lab), stream=True, timeout=30) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == "text/plain"
        lines = r.iter_lines()
        assert next(lines) == b"first"
        first_at = time.monotonic() - started
        assert next(lines) == b"second"
        second_at = time.monotonic() - started
    assert first_at < 2.5 <= second_at

    # an answer the service breaks off is not passed on as if it were whole
    with pytest.raises((requests.exceptions.ChunkedEncodingError, requests.ConnectionError)):
        requests.get(_api(fake_lab, "cut"), headers=_auth(fake_lab), timeout=30)
