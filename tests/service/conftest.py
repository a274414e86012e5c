"""Fixtures that run a real job service process on a temporary home."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fixtures.service_process import REPO, ServiceProcess, module_home, start_service, stop_services
from tests.fixtures.workdir import any_service  # noqa: F401 (a fixture of this folder)


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


@pytest.fixture(scope="module", params=["bubblewrap", "symlink"])
def ma_module_any_service(request, tmp_path_factory):
    """``any_service`` shared by the tests of a module (``ma_module_service``'s rules): one
    service with bubblewrap, and one in the symlink mode (no sandbox, the owner's jobs allowed to
    run as root) on a home of its own, each test run once on each (``.sandbox`` says which)."""
    env = {"MA_JUPYTER_CARDS": "none"}
    cluster = ""
    if request.param == "symlink":
        cluster = '[users]\nallow_root = ["root"]\n'  # as ``ma_root_jobs`` writes it
        env["MA_JUPYTER_SANDBOX"] = "none"
    services = [start_service(module_home(tmp_path_factory, cluster), env=env)]
    services[0].allowed_root = tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    services[0].sandbox = request.param  # type: ignore[attr-defined]
    yield services[0]
    stop_services(services)


@pytest.fixture(scope="module")
def ma_module_client(ma_module_service):
    """A :class:`ma_jupyter.client.Client` of the owner on ``ma_module_service`` (same rules)."""
    from ma_jupyter.client import Client

    client = Client(ma_module_service.url, ma_module_service.token)
    yield client
    client.close()


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
