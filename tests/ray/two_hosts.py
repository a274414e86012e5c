"""Two simulated hosts for the Ray tests, A and B, with a Ray head on A and a Ray worker node on
B, and a job service on them (see ``test_ray_lost_host.py``'s docstring for the layout): the
``two_hosts`` (module-scoped) and ``service_on`` fixtures, which ``conftest.py`` exposes to
this folder, and the process probes their tests use."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from ma_jupyter.backends.ray.inventory import node_name
from ma_jupyter.client import Client
from ma_jupyter.nodehost import hostwatch
from ma_jupyter.nodehost.procfs import NODE_MARKER
from tests.helpers import wait_for

INSIDE = os.environ.get("MA_RAY_NETNS") == "1"
ROOT = Path(__file__).resolve().parents[2]
A, B = "10.77.0.1", "10.77.0.2"
RAY = str(Path(sys.executable).parent / "ray")
#: seconds within which a lost node's processes must be gone (its runner's grace, and load)
ENDS_WITHIN = hostwatch.HOST_GRACE + 12

#: times a Ray head in a mount namespace of its own is started before the fixture gives up: a
#: raylet waits 15 s for its node's own agents, then dies, which a loaded machine makes likely
HEAD_TRIES = 6
#: (mark, runner pid on B) of each job started: ended by the test's teardown if still there
JOBS: list[tuple[str, int | None]] = []


class TwoHosts:
    """Hosts A and B, a Ray head on A and a Ray worker node on B (see the module docstring).

    ``private_a``: A's Ray node (its head, raylet, agents and job nodes) also runs in a mount
    namespace of its own, where :attr:`private` is a tmpfs of A's own: the machines then share
    no disk at that path (each its own ``node_root`` there), and :meth:`hide` gives both hosts
    an empty folder over a path of the service's (its home)."""

    def __init__(self, private_a: bool = False) -> None:
        self.private_a = private_a
        self.token = f"ma-2h-{os.getpid()}-{time.time_ns()}"
        self.temp = tempfile.mkdtemp(prefix="ma-2h-")  # short: Ray's socket paths < 108 bytes
        self.private = tempfile.mkdtemp(prefix="ma-2h-b-")  # B's own disk there
        self.port = _free_port()
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MA_TWO_HOSTS": self.token}
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), self.env.get("PYTHONPATH", "")) if p)
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
             f'mount -t tmpfs tmpfs "{self.private}" && exec sleep 100000'],
            env=self.env, start_new_session=True,
        )  # fmt: skip
        self.head: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        try:
            self._up()
        except BaseException:
            self.close()
            raise

    def _up(self) -> None:
        wait_for(
            lambda: (
                _net_ns(self.holder.pid) != _net_ns(os.getpid()) and _mounted(self.holder.pid, self.private)
            )
        )
        _run(
            "ip", "link", "add", "ma-a", "type", "veth", "peer", "name", "ma-b", "netns", str(self.holder.pid)
        )
        _run("ip", "addr", "add", f"{A}/24", "dev", "ma-a")
        _run("ip", "link", "set", "ma-a", "up")
        for args in (
            ("link", "set", "lo", "up"),
            ("addr", "add", f"{B}/24", "dev", "ma-b"),
            ("link", "set", "ma-b", "up"),
        ):
            _run("nsenter", f"--target={self.holder.pid}", "--net", "ip", *args)
        common = [
            "--block",
            "--num-cpus",
            "2",
            "--object-store-memory",
            str(200 << 20),
            "--temp-dir",
            self.temp,
        ]
        common += ["--disable-usage-stats"]
        for attempt in range(HEAD_TRIES):
            head = [RAY, "start", "--head", "--port", str(self.port), "--node-ip-address", A,
                    "--include-dashboard", "false", *common]  # fmt: skip
            if self.private_a:  # A's own disk at the same path as B's, in a mount namespace of A's
                head = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f'mount -t tmpfs tmpfs "{self.private}" && exec "$@"', "sh", *head]  # fmt: skip
            self.head = self._start(head, "head")
            self.head_log = self.log
            if not self.private_a:
                wait_for(lambda: _listens(A, self.port), timeout=90, interval=0.2)
                break
            # B asks the GCS for the head's node, which only a started head has registered; on
            # a loaded machine Ray's raylet may give up waiting for its own agents: then again
            started = wait_for(
                lambda: (
                    "Ray runtime started" in Path(self.head_log).read_text(errors="replace")
                    or self.head.poll() is not None
                ),
                timeout=240,
                interval=0.5,
            )
            if started and self.head.poll() is None:
                break
            if attempt == 2:
                raise AssertionError(
                    f"no Ray head on A: {Path(self.head_log).read_text(errors='replace')[-3000:]}"
                )
            self._end_head()
            self.port = _free_port()
        self._b_args = [
            "nsenter", f"--target={self.holder.pid}", "--net", "--mount",
            RAY, "start", "--address", f"{A}:{self.port}", "--node-ip-address", B, *common,
        ]  # fmt: skip
        self.start_b()

    def _start(self, argv: list[str], name: str) -> subprocess.Popen:
        self.log = os.path.join(self.temp, f"{name}-{time.time_ns()}.log")
        with open(self.log, "wb") as log:
            return subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start_b(self, tries: int = 3) -> subprocess.Popen:
        """(Again) a Ray node on B; returns its ``ray start`` process once its raylet runs.  A
        ``ray start`` that gives up (it asks the GCS for the head node's record within Ray's
        fixed time, which an overloaded machine may miss) is run again, ``tries`` times in all."""
        for attempt in range(tries):
            self.worker = self._start(self._b_args, "b")
            deadline = time.monotonic() + 150
            while self.raylet_b() is None:
                if self.worker.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            else:
                return self.worker
            self.stop_b()
            if attempt == tries - 1:
                head = Path(self.head_log).read_text(errors="replace")[-2000:]
                raise AssertionError(
                    f"no raylet on B: {Path(self.log).read_text(errors='replace')[-3000:]}\nhead: {head}"
                )
        raise AssertionError("unreachable")

    def stop_b(self) -> None:
        """End B's Ray node (its ``ray start`` and every process below it), by pid."""
        if self.worker is None:
            return
        try:
            procs = [
                psutil.Process(self.worker.pid),
                *psutil.Process(self.worker.pid).children(recursive=True),
            ]
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        self.worker.wait()

    def _end_head(self) -> None:
        """End a head that failed to start, and every process below it, by pid."""
        assert self.head is not None
        try:
            procs = [psutil.Process(self.head.pid), *psutil.Process(self.head.pid).children(recursive=True)]
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        self.head.wait()

    def hide(self, path: str) -> None:
        """An empty tmpfs over ``path`` on both hosts (``private_a`` only): neither Ray node sees
        what the service keeps there."""
        assert self.private_a and self.head is not None
        for pid in (self.head.pid, self.holder.pid):
            _run("nsenter", f"--target={pid}", "--mount", "mount", "-t", "tmpfs", "tmpfs", path)

    def raylet_b(self) -> psutil.Process | None:
        if self.worker is None:
            return None
        try:
            found = [
                p for p in psutil.Process(self.worker.pid).children(recursive=True) if p.name() == "raylet"
            ]
        except psutil.Error:
            return None
        return found[0] if found else None

    def b_name(self) -> str:
        """B's name in the service's inventory, from its raylet's ``--node_id``."""
        raylet = self.raylet_b()
        assert raylet is not None, "B's raylet is not running"
        node_id = next(a.split("=", 1)[1] for a in raylet.cmdline() if a.startswith("--node_id="))
        return node_name(node_id)

    def on_b(self, mark: str, node: str) -> list[psutil.Process]:
        """The live processes whose command line holds ``mark`` of job node ``node``, the one
        placed on B (by their node marker: each attempt's nodes on a machine are in a network
        namespace of their own, not B's)."""
        return [p for p in marked(mark) if f"/{node}/" in _node_marker(p.pid)]

    def kill_raylet_b(self) -> int:
        raylet = self.raylet_b()
        assert raylet is not None, "B's raylet is not running"
        raylet.kill()
        return raylet.pid

    def toml(self, node_root: str | None = None) -> str:
        extra = f'node_root = "{node_root}"\n' if node_root else ""
        return f'[backend]\nkind = "ray"\naddress = "{A}:{self.port}"\n{extra}'

    def _ours(self, proc: psutil.Process, b_net: str | None) -> bool:
        """Whether this module started ``proc``: it carries the module's token in its environment
        (Ray's processes inherit it), runs in B's network namespace, or names this cluster."""
        if proc.pid == os.getpid():
            return False
        try:
            if b_net is not None and _net_ns(proc.pid) == b_net:
                return True
            if proc.environ().get("MA_TWO_HOSTS") == self.token:
                return True
            return any(self.temp in part or f"{A}:{self.port}" in part for part in proc.cmdline())
        except (psutil.Error, OSError):
            return False

    def close(self) -> None:
        """End every process this module started (see :meth:`_ours`), by pid."""
        try:
            b_net = _net_ns(self.holder.pid) if self.holder.poll() is None else None
        except OSError:
            b_net = None
        for _ in range(3):
            left = [proc for proc in psutil.process_iter() if self._ours(proc, b_net)]
            for proc in left:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(left, timeout=10)
            if not left:
                break
        for proc in (self.head, self.worker, self.holder):
            if proc is None:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        shutil.rmtree(self.temp, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)


def _raylet_below(pid: int) -> psutil.Process | None:
    try:
        found = [p for p in psutil.Process(pid).children(recursive=True) if p.name() == "raylet"]
    except psutil.Error:
        return None
    return found[0] if found else None


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _node_marker(pid: int) -> str:
    """The node marker in process ``pid``'s environment ("" without one, or once it ended)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return ""
    prefix = f"{NODE_MARKER}=".encode()
    return next((e[len(prefix) :].decode(errors="replace") for e in entries if e.startswith(prefix)), "")


def _net_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _mounted(pid: int, path: str) -> bool:
    try:
        return f" {path} " in Path(f"/proc/{pid}/mounts").read_text()
    except OSError:
        return False


def _listens(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def marked(text: str) -> list[psutil.Process]:
    """Live processes whose command line holds ``text``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                text in p for p in proc.info["cmdline"] or []
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Cli:
    """``ma-jupyter ARGS`` running, its output going to files (read while it runs)."""

    def __init__(self, folder: Path, *args: str):
        self.out_file, self.err_file = (
            folder / f"cli-{time.time_ns()}.out",
            folder / f"cli-{time.time_ns()}.err",
        )
        with open(self.out_file, "wb") as out, open(self.err_file, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ma_jupyter.frontends.cli", *args],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=err,
            )

    def out(self) -> str:
        return self.out_file.read_text(errors="replace")

    def result(self, timeout: float = 120) -> tuple[int, str, str]:
        """Its exit code and output, once it ended (within ``timeout`` s)."""
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return code, self.out(), self.err_file.read_text(errors="replace")


@pytest.fixture(scope="module")
def two_hosts():
    yield from _hosts(private_a=False)


@pytest.fixture(scope="module")
def two_private_hosts():
    """Two hosts that share no disk at :attr:`TwoHosts.private` (see ``private_a``)."""
    yield from _hosts(private_a=True)


def _hosts(private_a: bool):
    if not INSIDE:
        yield None
        return
    # Ray reads ~/.ray (an auth token another cluster on this machine may have left there): this
    # cluster, its service and its clients keep a home of their own
    home = os.environ.get("HOME")
    os.environ["HOME"] = tempfile.mkdtemp(prefix="ma-2h-home-")
    hosts = TwoHosts(private_a)

    def on_term(signum, _frame):  # the outer run ends this one: end the cluster first
        hosts.close()
        os._exit(128 + signum)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield hosts
    finally:
        signal.signal(signal.SIGTERM, before)
        hosts.close()
        shutil.rmtree(os.environ["HOME"], ignore_errors=True)
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home


@pytest.fixture
def service_on(ma_home, two_hosts):
    """``service_on(node_root)``: a job service on ``ma_home`` on the two hosts' cluster, once B's
    Ray node is up; ``.restart()`` on it starts the next one."""
    yield from _services(ma_home, two_hosts)


@pytest.fixture
def service_on_private(ma_home, two_private_hosts):
    """:func:`service_on` on the hosts that share no disk."""
    yield from _services(ma_home, two_private_hosts)


def _services(ma_home, two_hosts):
    from tests.fixtures.service_process import start_service

    started = []

    def start(node_root: str | None = None):
        if two_hosts.raylet_b() is None:
            two_hosts.start_b()
        toml = ma_home / "cluster.toml"
        toml.write_text(toml.read_text() + two_hosts.toml(node_root))
        svc = start_service(ma_home, timeout=120)
        started.append(svc)

        def restart():
            svc.proc.terminate()
            svc.proc.wait(30)
            # a follower's client may start the next service itself (it autostarts one, as it
            # would for its user): then that one serves
            try:
                started.append(start_service(ma_home, timeout=120, tokens=svc.tokens))
            except RuntimeError as exc:
                if "already runs" not in str(exc):
                    raise
            wait_for(lambda: Client(autostart=False).service_status()["running"], timeout=120, interval=0.5)

        svc.restart = restart  # type: ignore[attr-defined]
        client = Client(autostart=False)
        for attempt in range(3):
            # a raylet must register within Ray's fixed 30 s: on a loaded machine it may not,
            # then B's Ray node is started again
            try:
                wait_for(lambda: len(client.nodes()) == 2, timeout=90, interval=0.5)
                break
            except AssertionError:
                if attempt == 2:
                    raise
                two_hosts.stop_b()
                two_hosts.start_b()
        return svc

    yield start
    from tests.conftest import _stop_jobs_and_service

    for mark, runner in JOBS:
        _end_job_processes(mark, runner)
    JOBS.clear()

    if started and started[-1].proc.poll() is None:
        try:
            _stop_jobs_and_service(Client(autostart=False))
        except Exception:
            pass
    for svc in started:
        if svc.proc.poll() is None:
            svc.proc.terminate()
            try:
                svc.proc.wait(30)
            except subprocess.TimeoutExpired:
                svc.proc.kill()


def _end_job_processes(mark: str, runner: int | None) -> None:
    """Whatever of a test's job is left when the test failed (the job nodes carry no token)."""
    if runner is not None and alive(runner):
        for signum in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(runner, signum)
            except ProcessLookupError:
                pass
    for proc in marked(mark):
        try:
            proc.kill()
        except psutil.Error:
            pass
