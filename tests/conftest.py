"""Fixtures shared by every test folder: a private ``MA_JUPYTER_HOME`` and a client on it."""

from __future__ import annotations

import importlib.util
import os
import signal

import pytest

from tests.fixtures.durations import Plan, Recorder, load_table, ray_group_count
from tests.fixtures.module_home import (  # noqa: F401 (fixtures of every folder)
    ma_module_home,
    ma_module_home_client,
    ma_module_home_env,
    ma_module_shell,
)
from tests.fixtures.ray_netns import (  # noqa: F401 (the Ray namespace's hooks and cluster, for every folder)
    is_ray_test,
    pytest_pyfunc_call,
    pytest_runtest_logreport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    ray_cluster,
)
from tests.fixtures.supervisor import fake_sup  # noqa: F401 (a fixture of every folder)

SMALL_CLUSTER_TOML = """
[[spec]]
name = "cpu.small"
cpus = 1
memory_gb = 1

[[spec]]
name = "cpu.medium"
cpus = 2
memory_gb = 2

[[node]]
name = "big"
cpus = 8
memory_gb = 16

[[node]]
name = "tiny"
cpus = 2
memory_gb = 2
"""


def _stop_jobs_and_service(client) -> int | None:
    """Stop what still runs on the client's home, then its service; the stopped service's pid."""
    from ma_jupyter.errors import MaJupyterError

    status = client.service_status()
    if not status["running"]:
        return None
    try:
        for handle in client.jobs(status=["running", "queued"], limit=500):
            handle.stop()
        for handle in client.jobs(status=["running", "queued"], limit=500):
            handle.wait(timeout=30, check=False)
    except (MaJupyterError, TimeoutError):
        pass
    client.shutdown_service()
    return status["pid"]


def pytest_configure(config):
    """Record each scope's seconds of a whole run for ``./dev durations`` (``fixtures/durations.py``);
    take Ctrl-C as Python does where the run was started ignoring it."""
    # A command started in the background by a shell without job control (`./dev test &` in a
    # script, nohup) ignores SIGINT, and so would every process the tests start: the tests of
    # what Ctrl-C does (the CLI's, the magics') would see nothing.  Here, in the main process
    # and in each worker, before any test starts a process.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if Recorder.wanted(config):
        config.pluginmanager.register(Recorder(config), "ma_durations")


if importlib.util.find_spec("xdist") is not None:

    def pytest_xdist_make_scheduler(config, log):
        """Under pytest-xdist (``./dev test`` runs two workers), scopes of whole modules, handed
        out longest first by ``tests/durations.json`` (``fixtures/durations.py``):

        1. every test of one module in one worker, so a module's shared service
           (``ma_module_service``) starts once;
        2. the Ray tests (``tests/ray/`` and the contract suite's tests on the Ray backend,
           ``is_ray_test``) in Ray groups of whole modules (``MA_TEST_RAY_GROUPS``, default
           one), one scope each: the first test of a group starts the inner run, and its Ray
           cluster, for the group (``fixtures/ray_netns.py``), so two groups run in two workers
           at once;
        3. the scopes longest first (xdist's own order is most tests first), so that the run
           ends on short modules in both workers.

        (xdist's own ``--dist loadgroup`` marks do not group under pytest 9: it renames an
        attribute pytest no longer reads.)"""
        from xdist.scheduler import LoadScopeScheduling

        class ModuleOrRayLongestFirst(LoadScopeScheduling):
            plan: Plan | None = None

            def _split_scope(self, nodeid: str) -> str:
                if self.plan is None:  # before the collection is known (never used then)
                    return nodeid.split("::", 1)[0]
                return self.plan.scheduler_scope(nodeid)

            def schedule(self) -> None:
                """xdist's ``LoadScopeScheduling.schedule`` with the queue longest first."""
                if self.collection is not None or not self.collection_is_completed:
                    return super().schedule()
                if not self._check_nodes_have_same_collection():
                    self.log("**Different tests collected, aborting run**")
                    return
                self.collection = list(next(iter(self.registered_collections.values())))
                if not self.collection:
                    return
                # every worker has sent its collection by now: their number is the workers' count
                # (PYTEST_XDIST_WORKER_COUNT) from which each worker makes the same Ray groups
                self.plan = Plan(self.collection, load_table(), ray_group_count(len(self.nodes)))
                scopes: dict[str, dict[str, bool]] = {}
                for nodeid in self.collection:
                    scopes.setdefault(self._split_scope(nodeid), {})[nodeid] = False
                for scope in sorted(scopes, key=lambda s: -self.plan.scope_seconds(s)):
                    self.workqueue[scope] = scopes[scope]
                for _ in range(len(self.nodes) - len(self.workqueue)):
                    unused, _assigned = self.assigned_work.popitem()
                    unused.shutdown()
                for node in self.nodes:
                    self._assign_work_unit(node)

        return ModuleOrRayLongestFirst(config, log)


@pytest.fixture
def tmp_path(tmp_path):
    """pytest's ``tmp_path``, opened to others' reading (0755) as a user's project folder
    commonly is: pytest makes it 0700, and a job's others' access may not exceed what the
    folders it mounts allow, the folder its code was shipped from included (access rule 3), so
    a job submitted from it with the default access ``ro`` would be refused.  A test of that
    rule makes its private folders itself."""
    tmp_path.chmod(0o755)
    return tmp_path


@pytest.fixture(autouse=True)
def ma_no_real_cards(request, monkeypatch):
    """Every test runs as if the machine had no accelerator cards (the default cluster's emulated
    cards, nothing bound into sandboxes), so the suite means the same on a GPU machine; tests
    marked ``real_cards`` (tests/gpu) see the machine's own."""
    if not request.node.get_closest_marker("real_cards"):
        monkeypatch.setenv("MA_JUPYTER_CARDS", "none")


@pytest.fixture
def ma_home(request, tmp_path, monkeypatch):
    """A fresh ``MA_JUPYTER_HOME`` (set in the environment) for one test, whose jobs may mount
    folders of the test's ``tmp_path``.

    ``@pytest.mark.small_cluster`` writes a two-node ``cluster.toml`` (``big`` and ``tiny``).
    Whatever service a test started on this home is stopped afterwards, jobs first.
    """
    home = tmp_path / "ma_home"
    home.mkdir()
    # Tests keep their data in their own tmp_path, outside the default mount roots (the user's
    # home and the project folder): allow it too.
    cluster = f'[mounts]\nallowed_roots = ["{tmp_path}"]\n'
    if request.node.get_closest_marker("small_cluster"):
        cluster += SMALL_CLUSTER_TOML
    (home / "cluster.toml").write_text(cluster)
    monkeypatch.setenv("MA_JUPYTER_HOME", str(home))
    # clients act as the owner of this home's service unless a test gives them a token
    monkeypatch.delenv("MA_JUPYTER_TOKEN", raising=False)
    monkeypatch.delenv("MA_JUPYTER_URL", raising=False)
    yield home
    if (home / "service.json").exists():
        from ma_jupyter.client import Client

        monkeypatch.setenv("MA_JUPYTER_HOME", str(home))
        _stop_jobs_and_service(Client(autostart=False))


@pytest.fixture
def ma_root_jobs(ma_home):
    """Let root's jobs run as root on ``ma_home`` (an admin's ``[users] allow_root``): for tests
    of what holds even for root, and of the symlink mode, which cannot switch accounts."""
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + '[users]\nallow_root = ["root"]\n')
    return ma_home


@pytest.fixture
def ma_client(ma_home):
    """A :class:`ma_jupyter.client.Client` on ``ma_home`` whose service is started on first use.

    Teardown stops running jobs, shuts the service down and checks its process is gone.
    """
    from ma_jupyter.client import Client
    from ma_jupyter.client.service import pid_alive

    client = Client()
    yield client
    pid = _stop_jobs_and_service(client)
    if pid is not None:
        assert not pid_alive(pid), f"service pid {pid} still runs after shutdown_service()"
        assert not os.path.exists(ma_home / "service.json")
    client.close()


def _leftover_node_runners(since: float, under: str) -> list:
    """Node runners of this test session (their job folders lie under ``under``, the session's
    temporary folder) that are still alive: never another session's, running beside this one.
    A runner started as a process of its own names its spec file; one forked by the fork server
    carries the runner's name and works in its node folder."""
    import psutil

    from ma_jupyter.nodehost.forkserver import RUNNER_NAME

    found = []
    for proc in psutil.process_iter(["cmdline", "create_time", "name"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.info["create_time"] < since:
                continue
            if "ma_jupyter.nodehost.noderun" in cmdline and cmdline[-1].startswith(under + os.sep):
                found.append(proc)
            elif proc.info["name"] == RUNNER_NAME and proc.cwd().startswith(under + os.sep):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="session", autouse=True)
def ma_no_leftover_jobs(tmp_path_factory):
    """After the whole session, no job process of it may be left running: kill stragglers and say so."""
    import time

    started = time.time()
    under = str(tmp_path_factory.getbasetemp().resolve())
    yield
    leftovers = _leftover_node_runners(started, under)
    for proc in leftovers:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
    if leftovers:
        print(f"\nleft-over job processes killed after the session: {[p.pid for p in leftovers]}")


@pytest.fixture
def ma_shell(ma_home):
    """An IPython shell with the extension loaded; the service it autostarts is shut down after."""
    from IPython.core.interactiveshell import InteractiveShell

    import ma_jupyter
    from ma_jupyter.errors import MaJupyterError
    from ma_jupyter.frontends.notebook import session

    shell = InteractiveShell.instance()
    session._clients.clear()
    ma_jupyter.load_ipython_extension(shell)
    shell.user_ns.pop("job", None)
    yield shell
    client = session._clients.pop(str(ma_home), None)
    if client is not None:
        try:
            left = client.jobs(status=["running", "queued"])
            for handle in left:
                handle.stop()
            # the service's end leaves running jobs running (they outlive it by design): wait
            # for the stops, so no test leaves its nodes' processes behind
            for handle in left:
                try:
                    handle.wait(timeout=90, check=False)
                except (TimeoutError, MaJupyterError):
                    pass
        finally:
            client.shutdown_service()
    session._clients.clear()
