"""Fixtures that run a real job service process on a temporary home."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.fixtures.workdir import any_service  # noqa: F401 (a fixture of this folder)


@dataclass
class ServiceProcess:
    """A running ``python -m ma_jupyter.service`` and token-carrying sessions to it.

    ``token`` is the owner's (an admin); :meth:`user_token` adds other users through the API.
    """

    home: Path
    proc: subprocess.Popen
    url: str
    token: str
    proxy_token: str = ""
    # user name -> token, shared by the services of one home (user tokens survive restarts)
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def session(self, token: str | None = None) -> requests.Session:
        """A session acting as the owner, or as the user of ``token``."""
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {token or self.token}"
        return s

    def user_token(self, name: str, admin: bool = False) -> str:
        """The token of user ``name``, added by the owner on first use."""
        if name not in self.tokens:
            reply = self.session().post(f"{self.api}/users", json={"name": name, "admin": admin}, timeout=10)
            assert reply.status_code == 201, reply.text
            self.tokens[name] = reply.json()["token"]
        return self.tokens[name]

    def user_session(self, name: str) -> requests.Session:
        """A session acting as user ``name`` (a non-admin, added on first use)."""
        return self.session(self.user_token(name))


def start_service(
    home: Path,
    timeout: float = 20.0,
    tokens: dict[str, str] | None = None,
    wrap: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> ServiceProcess:
    """Start the service for ``home`` and wait until its runtime file names it.

    ``wrap``: a command that execs the service after setting something up (it must exec, so the
    service keeps the pid the runtime file names); ``env``: variables added to the service's.
    """
    runtime = home / "service.json"
    env = {**os.environ, "MA_JUPYTER_HOME": str(home), **(env or {})}
    log = open(home / "service.log", "ab")
    proc = subprocess.Popen(
        [*(wrap or []), sys.executable, "-m", "ma_jupyter.service"],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"service exited with {proc.returncode}: {(home / 'service.log').read_text()[-3000:]}"
            )
        try:
            data = json.loads(runtime.read_text())
            if data["pid"] == proc.pid:
                return ServiceProcess(
                    home,
                    proc,
                    data["url"],
                    data["token"],
                    data["proxy_token"],
                    tokens if tokens is not None else {},
                )
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("service did not start: " + (home / "service.log").read_text()[-3000:])


def _live_jobs(session: requests.Session, api: str) -> list[dict]:
    reply = session.get(f"{api}/jobs", params={"status": ["running", "queued"], "limit": 500}, timeout=5)
    return reply.json()["items"]


@pytest.fixture
def ma_service(ma_home):
    """A fresh service process on the test's own home; stopped (jobs first) afterwards.

    ``@pytest.mark.small_cluster`` (handled by ``ma_home``) gives it the two-node cluster
    ``big``/``tiny``, where one ``cpu.medium`` job fills ``tiny``, to test queueing.
    """
    home = ma_home
    services: list[ServiceProcess] = [start_service(home)]

    def restart() -> ServiceProcess:
        services.append(start_service(home, tokens=services[0].tokens))
        return services[-1]

    services[0].restart = restart  # type: ignore[attr-defined]
    yield services[0]
    stop_services(services)


@pytest.fixture(scope="module")
def ma_module_service(tmp_path_factory):
    """One service process shared by the tests of a module, on a home of its own (``.home``).

    For tests that need no home of their own: each reads and counts only what it made itself
    (its own jobs, by id), never restarts the service nor changes its ``cluster.toml``, and
    leaves no job running (a stop in the test, or the job ends).  A service's start costs
    seconds (its imports), most of a short API test.  Every test's ``tmp_path`` lies under the
    session's temporary folder, which is the home's allowed mount root.  Like ``ma_service``,
    it runs as if the machine had no cards (``ma_no_real_cards`` is per test, too late here).
    """
    base = tmp_path_factory.getbasetemp()
    home = tmp_path_factory.mktemp("module_home")
    (home / "cluster.toml").write_text(f'[mounts]\nallowed_roots = ["{base}"]\n')
    services = [start_service(home, env={"MA_JUPYTER_CARDS": "none"})]
    services[0].allowed_root = base  # type: ignore[attr-defined]
    yield services[0]
    stop_services(services)


@pytest.fixture(scope="module")
def ma_module_client(ma_module_service):
    """A :class:`ma_jupyter.client.Client` of the owner on ``ma_module_service`` (same rules)."""
    from ma_jupyter.client import Client

    client = Client(ma_module_service.url, ma_module_service.token)
    yield client
    client.close()


def stop_services(services: list[ServiceProcess]) -> None:
    """Stop the jobs of the last of ``services`` (waiting until they ended), then every one."""
    last = services[-1]
    if last.proc.poll() is None:
        # Jobs outlive the service by design: stop them, and wait until the service has carried
        # the stops out, so that no test leaves processes behind.
        s = last.session()
        try:
            live = _live_jobs(s, last.api)
            for job in live:
                s.post(f"{last.api}/jobs/{job['id']}/stop", timeout=5)
            deadline = time.monotonic() + 60
            while live and time.monotonic() < deadline:
                time.sleep(0.1)
                live = _live_jobs(s, last.api)
        except requests.RequestException:
            pass
    for svc in services:
        if svc.proc.poll() is None:
            svc.proc.send_signal(signal.SIGTERM)
            try:
                svc.proc.wait(10)
            except subprocess.TimeoutExpired:
                svc.proc.kill()


#: the checkout the tests run from, put first on a subprocess's PYTHONPATH
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def ma_cli(ma_client, ma_home, tmp_path):
    """Run ``ma-jupyter ARGS`` in a subprocess on the test's home; returns the CompletedProcess."""
    env = {
        **os.environ,
        "MA_JUPYTER_HOME": str(ma_home),
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "ma_jupyter.frontends.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def ma_module_cli(ma_module_service, tmp_path):
    """``ma-jupyter ARGS`` in a subprocess (working in the test's ``tmp_path``) on
    ``ma_module_service``'s home, whose runtime file gives it the owner's service: for CLI tests
    that keep ``ma_module_service``'s rules (their own jobs only, by id or a name of their own)."""
    env = {
        key: value for key, value in os.environ.items() if key not in ("MA_JUPYTER_TOKEN", "MA_JUPYTER_URL")
    }
    env["MA_JUPYTER_HOME"] = str(ma_module_service.home)
    env["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "ma_jupyter.frontends.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
