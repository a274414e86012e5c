"""Fixtures that run a real job service process on a temporary home."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests


@dataclass
class ServiceProcess:
    """A running ``python -m ma_jupyter.service`` and a token-carrying session to it."""

    home: Path
    proc: subprocess.Popen
    url: str
    token: str

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def session(self, user: str = "tester") -> requests.Session:
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {self.token}"
        s.headers["X-MA-User"] = user
        return s


def start_service(home: Path, timeout: float = 20.0) -> ServiceProcess:
    """Start the service for ``home`` and wait until its runtime file names it."""
    runtime = home / "service.json"
    env = {**os.environ, "MA_JUPYTER_HOME": str(home)}
    log = open(home / "service.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ma_jupyter.service"], env=env, stdout=log, stderr=log, start_new_session=True
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
                return ServiceProcess(home, proc, data["url"], data["token"])
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
        services.append(start_service(home))
        return services[-1]

    services[0].restart = restart  # type: ignore[attr-defined]
    yield services[0]
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
