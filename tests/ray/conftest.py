"""Ray tests run inside a private network namespace that has only loopback.

Ray binds to the machine's interface address unless that address does not exist, so its nodes
must live where only ``lo`` does.  This plugin makes that true for every test of this folder:

1. **outside** (the ordinary pytest run): the tests of this folder are not run in this
   process.  The first one to run starts *one* inner pytest for all of them, as
   ``unshare --net sh -c 'ip link set lo up; exec python -m pytest <the same test ids>'``,
   whose whole process tree (the Ray cluster, the job service, the job nodes) lives in the
   namespace and dies with it.  Each outer test then waits for its own inner result and
   reports it (passed, failed with the inner report, or skipped with the inner reason), so
   counts and failures read as if the tests ran here.  Without ``unshare`` rights or without
   Ray every test is skipped, saying why.
2. **inside** (``MA_RAY_NETNS=1``): the tests run for real.  The session starts one Ray cluster
   of two nodes with 2 CPUs and 2 ``NPU`` each (``ray.cluster_utils.Cluster``, ``RAY_TMPDIR``
   in a folder of the session, worker ports pinned: :data:`WORKER_PORTS`), and each test gets
   a fresh job service on its own home whose ``cluster.toml`` points the service at that
   cluster (``[backend] kind = "ray"``).  The cluster is shut down
   at the end (only this session's own Ray processes: never ``ray stop``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.ray.two_hosts import (  # noqa: F401 (fixtures of this folder)
    service_on,
    service_on_private,
    two_hosts,
    two_private_hosts,
)

INSIDE = os.environ.get("MA_RAY_NETNS") == "1"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: seconds an outer test waits for its inner result after the inner run ended
SETTLE = 5.0
#: each Ray node's worker port range (two raylets on one machine: one range each, so that their
#: workers never race for a port)
WORKER_PORTS = {
    "head": {"min_worker_port": 20000, "max_worker_port": 20499},
    "worker": {"min_worker_port": 20500, "max_worker_port": 20999},
}


def _ours(item: pytest.Item) -> bool:
    return Path(str(item.fspath)).resolve().is_relative_to(HERE)


# ---------------------------------------------------------------------------- outside


def _why_not() -> str | None:
    """Why the Ray tests cannot run here (None: they can)."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed: pip install ma_jupyter[ray]"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is missing: Ray tests need a private network namespace"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace (unshare --net: {probe.stderr.strip()[:200]})"
    return None


class _InnerRun:
    """The one inner pytest of this session and the results it reports."""

    def __init__(self, session: pytest.Session):
        items = [i for i in session.items if _ours(i)]
        self.folder = Path(tempfile.mkdtemp(prefix="ma-ray-outer-"))
        self.report = self.folder / "report.jsonl"
        self.output = self.folder / "pytest.log"
        env = {
            **os.environ,
            "MA_RAY_NETNS": "1",
            "MA_RAY_REPORT": str(self.report),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        argv = [
            "unshare",
            "--net",
            "--",
            "sh",
            "-c",
            'ip link set lo up && exec "$0" "$@"',
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            *[i.nodeid for i in items],
        ]
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=str(ROOT), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def results(self) -> dict[str, list[dict]]:
        found: dict[str, list[dict]] = {}
        try:
            lines = self.report.read_text().splitlines()
        except OSError:
            return found
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line being written
            found.setdefault(entry["nodeid"], []).append(entry)
        return found

    def wait_for(self, nodeid: str) -> list[dict]:
        """The phases the inner run reported for ``nodeid``, once its teardown is reported."""
        ended_at = None
        while True:
            phases = self.results().get(nodeid, [])
            if any(p["when"] == "teardown" for p in phases):
                return phases
            if self.proc.poll() is not None:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > SETTLE:
                    return phases
            time.sleep(0.2)

    def tail(self) -> str:
        try:
            return self.output.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


_inner: _InnerRun | None = None
_reason: list[str | None] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if INSIDE or not _ours(item):
        return
    if not _reason:
        _reason.append(_why_not())
    if _reason[0] is not None:
        pytest.skip(_reason[0])


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Outside: report the inner run's result for this test instead of running it here."""
    global _inner
    if INSIDE or not _ours(pyfuncitem):
        return None
    if _inner is None:
        _inner = _InnerRun(pyfuncitem.session)
    phases = _inner.wait_for(pyfuncitem.nodeid)
    if not phases:
        pytest.fail(f"the inner Ray test run reported nothing for this test; its output:\n{_inner.tail()}")
    for phase in phases:
        if phase["outcome"] == "failed":
            pytest.fail(
                f"inside the network namespace ({phase['when']}):\n{phase['longrepr']}", pytrace=False
            )
    for phase in phases:
        if phase["outcome"] == "skipped":
            pytest.skip(phase["longrepr"])
    return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _inner is not None:
        _inner.close()
        shutil.rmtree(_inner.folder, ignore_errors=True)


# ----------------------------------------------------------------------------- inside


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Inside: write each phase's outcome for the outer run."""
    target = os.environ.get("MA_RAY_REPORT")
    if not INSIDE or not target:
        return
    longrepr = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        longrepr = str(report.longrepr[2])
    elif report.longrepr is not None:
        longrepr = str(report.longrepr)
    entry = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "longrepr": longrepr}
    with open(target, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


@pytest.fixture(scope="session")
def ray_cluster():
    """Inside: a real Ray cluster of two nodes (2 CPUs and 2 emulated NPUs each) on loopback; None outside."""
    if not INSIDE:
        yield None
        return
    from ray.cluster_utils import Cluster

    folder = tempfile.mkdtemp(prefix="ma-ray-")  # short: Ray's socket paths must stay < 108 bytes
    (Path(folder) / "ray").mkdir()
    os.environ["RAY_TMPDIR"] = folder
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    cluster = None
    try:
        for attempt in range(3):
            # A raylet must register within Ray's fixed 30 s: on a loaded machine it may not, then
            # the whole cluster is started again.
            cluster = Cluster()
            try:
                # two emulated Ascend cards per node (a Ray resource, no device): the scheduler
                # and the mindspore-ascend mode place on them
                # pinned worker ports (``Cluster`` picks them at random by default): the fence
                # denies a raylet's range, so a worker started after a job node is out of reach too
                cluster.add_node(
                    num_cpus=2, resources={"NPU": 2}, include_dashboard=False, **WORKER_PORTS["head"]
                )
                cluster.add_node(num_cpus=2, resources={"NPU": 2}, **WORKER_PORTS["worker"])
                cluster.wait_for_nodes()
                break
            except Exception:
                cluster.shutdown()
                cluster = None
                if attempt == 2:
                    raise
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_driver(ray_cluster):
    """Inside: this test process connected to the session's cluster (to look at placement groups)."""
    if ray_cluster is None:
        yield None
        return
    import ray

    ray.init(address=ray_cluster.address, namespace="tests", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def ray_cluster_toml(cluster, extra: str = "") -> str:
    """The ``[backend]`` table pointing a service at ``cluster``."""
    return f'[backend]\nkind = "ray"\naddress = "{cluster.address}"\n{extra}'


@pytest.fixture
def ray_home(ma_home, ray_cluster):
    """Inside: ``ma_home`` whose ``cluster.toml`` points the service at the session's cluster."""
    if ray_cluster is not None:
        toml = ma_home / "cluster.toml"
        toml.write_text(toml.read_text() + ray_cluster_toml(ray_cluster))
    return ma_home


@pytest.fixture
def ray_service(ray_home):
    """Inside: a job service on ``ray_home`` (so on the Ray backend); its jobs are stopped and it
    is shut down after the test.  ``restart()`` starts another one on the same home."""
    yield from serve(ray_home)


def serve(ray_home):
    """The body of :func:`ray_service`, for fixtures that change ``ray_home`` first."""
    if not INSIDE:
        yield None
        return
    from tests.service.conftest import start_service

    services = [start_service(ray_home, timeout=120)]

    def restart():
        services.append(start_service(ray_home, timeout=120, tokens=services[0].tokens))
        return services[-1]

    services[0].restart = restart  # type: ignore[attr-defined]
    yield services[0]
    last = services[-1]
    if last.proc.poll() is None:
        session = last.session()
        try:
            live = session.get(
                f"{last.api}/jobs", params={"status": ["running", "queued"], "limit": 500}, timeout=10
            ).json()["items"]
            for job in live:
                session.post(f"{last.api}/jobs/{job['id']}/stop", timeout=10)
            deadline = time.monotonic() + 90
            while live and time.monotonic() < deadline:
                time.sleep(0.2)
                live = session.get(
                    f"{last.api}/jobs", params={"status": ["running", "queued"], "limit": 500}, timeout=10
                ).json()["items"]
        except Exception:
            pass
    for svc in services:
        if svc.proc.poll() is None:
            svc.proc.send_signal(signal.SIGTERM)
            try:
                svc.proc.wait(20)
            except subprocess.TimeoutExpired:
                svc.proc.kill()
