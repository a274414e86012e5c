"""A Ray node lost mid-job, on two simulated hosts: nothing of the job keeps running there, and
every log reader ends saying what was lost.

Two hosts inside the private network namespace of the Ray tests (``conftest.py``), joined by a
veth pair: host A is that namespace itself (10.77.0.1: the Ray head and the job service), host
B a network namespace of its own (10.77.0.2: a Ray worker node), started by a holder process
this module owns.  The filesystem is shared, as the platform requires, except one folder that
B sees as its own disk (a tmpfs in B's mount namespace): a ``node_root`` there is a job folder
the service cannot read.  The Ray nodes are ``ray start --block`` processes of this module;
B's raylet is killed with SIGKILL, as a crash or the OOM killer would, and started again.
Everything this module started is ended by pid at its end (never ``ray stop``).
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import events_text
from tests.helpers import wait_for, writable_dir
from tests.ray.two_hosts import (
    ENDS_WITHIN,
    JOBS,
    Cli,
    alive,
    marked,
)

pytestmark = [pytest.mark.ray]

TICK = """
import os, signal, socket, subprocess, sys, time
host = socket.gethostname()
# a child in its own session that ignores TERM: only a KILL ends it
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(900)",
                  f"{sys.argv[1]}-{host}"], start_new_session=True)
for i in range(3000):
    print(f"{host} tick {i}", flush=True)
    time.sleep(0.3)
"""


def _shows(out: str, node: str) -> bool:
    """Whether ``logs --all`` output holds ``node``'s 4th tick under its prefix (the launcher
    prefixes each line with its rank)."""
    return any(line.startswith(f"[{node}] ") and line.endswith(f"{node} tick 3") for line in out.splitlines())


def _submit(client: Client, tmp_path: Path, mark: str, b_name: str):
    algo = writable_dir(tmp_path / "algo", parents=True)
    (algo / "tick.py").write_text(textwrap.dedent(TICK))
    handle = client.submit(
        name="lost-host",
        mode="pytorch",  # torch's launcher on each node, as the report that found this used
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algo),
        command=f"python tick.py {mark}",
        grace_period=2,
    )

    def ticking():
        return all(
            f"worker-{r} tick 3" in client.read_log(handle.id, node=f"worker-{r}").data for r in (0, 1)
        )

    wait_for(ticking, timeout=240, interval=0.5)
    job = client.get(handle.id)
    [on_b] = [n for n in job.nodes if n.host == b_name]
    JOBS.append((mark, on_b.pid))
    assert marked(f"{mark}-{on_b.name}") and alive(on_b.pid)
    return handle, on_b


def test_a_killed_raylet_ends_its_nodes_and_their_logs_are_read_from_shared_storage(
    two_hosts, service_on, tmp_path
):
    service_on()  # node_root: the service's jobs folder, which both hosts share
    client = Client(autostart=False)
    mark = f"tick-{time.time_ns()}"
    handle, on_b = _submit(client, tmp_path, mark, two_hosts.b_name())
    one = Cli(tmp_path, "logs", handle.id, "--node", on_b.name, "--follow")
    every = Cli(tmp_path, "logs", handle.id, "--all", "--follow")
    # both have read B's node before it goes
    wait_for(lambda: f"{on_b.name} tick 3" in one.out() and _shows(every.out(), on_b.name), timeout=60)
    # every node's files are on storage this machine sees: the service says where to read them
    streams = [s for s in client.log_streams(handle.id) if s.rank is None]
    assert len(streams) == 2 and all(s.file is not None for s in streams), streams

    assert len(two_hosts.on_b(mark, on_b.name)) >= 3  # bubblewrap, the launcher, the script, its child
    raylet = two_hosts.kill_raylet_b()
    killed = time.monotonic()
    # 1. the node's processes end within seconds: the runner, bubblewrap, the launcher, the
    #    script and its TERM-ignoring child in a session of its own
    wait_for(
        lambda: (
            not marked(f"{mark}-{on_b.name}") and not two_hosts.on_b(mark, on_b.name) and not alive(on_b.pid)
        ),
        timeout=ENDS_WITHIN + 30,
    )
    took = time.monotonic() - killed
    print(f"the node's processes on B ended {took:.1f} s after its raylet (pid {raylet}) was killed")
    assert took < ENDS_WITHIN, took
    job = handle.wait(timeout=120, check=False)
    assert job.status is JobStatus.error
    events = events_text(client, handle.id)
    assert f"the Ray node {on_b.host} of {on_b.name} left the cluster" in events, events
    assert "ended with it" in events and "python" in events, events  # what was ended

    # 2./3. the followers end with the job, having read B's log from the shared job folder
    code, out, err = one.result()
    assert code == 0, err
    assert f"{on_b.name} tick 3" in out and "ended with it" in out, out[-2000:]
    code, out, err = every.result()
    assert code == 0, err
    assert _shows(out, on_b.name) and f"[{on_b.name}] [ma_jupyter] the raylet" in out, out[-3000:]
    assert _shows(out, "worker-0") and _shows(out, "worker-1")
    code, out, err = Cli(tmp_path, "logs", handle.id, "--all").result()
    assert code == 0, err
    assert _shows(out, "worker-0") and _shows(out, "worker-1"), out[-2000:]


class _Cell:
    """What a notebook cell shows of ``follow_job`` (its display, updated in place)."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, bundle: dict, **_kw):
        self.text = bundle["text/plain"]
        return self

    def update(self, bundle: dict, **_kw) -> None:
        self.text = bundle["text/plain"]


def test_without_shared_storage_followers_end_naming_the_lost_node_across_a_service_restart(
    two_hosts, service_on, tmp_path
):
    from ma_jupyter.frontends.notebook.live import follow_job

    svc = service_on(two_hosts.private)  # job folders on B lie on B's own disk
    client = Client(autostart=False)
    mark = f"tick-{time.time_ns()}"
    handle, on_b = _submit(client, tmp_path, mark, two_hosts.b_name())
    one = Cli(tmp_path, "logs", handle.id, "--node", on_b.name, "--follow")
    every = Cli(tmp_path, "logs", handle.id, "--all", "--follow")
    cell, followed = _Cell(), []  # the notebook's follower (%%ma_train, %ma_logs --follow)
    notebook = threading.Thread(
        target=lambda: followed.append(
            follow_job(
                Client(autostart=False), handle.id, raise_on_error=False, display=cell, live_display=True
            )
        ),
        daemon=True,
    )
    notebook.start()
    # every follower has read B's node before it goes
    wait_for(
        lambda: (
            f"{on_b.name} tick 3" in one.out()
            and _shows(every.out(), on_b.name)
            and f"{on_b.name} tick 3" in cell.text
        ),
        timeout=60,
    )

    # B's files are on B's own disk: only its agent reads them; the other node's are on this machine's
    files = {s.node: s.file for s in client.log_streams(handle.id) if s.rank is None}
    assert files[on_b.name] is None, files
    assert files["worker-1" if on_b.name == "worker-0" else "worker-0"] is not None, files

    # the runner cannot act (stopped): only the next agent on B can end what it leaves
    os.kill(on_b.pid, signal.SIGSTOP)
    two_hosts.kill_raylet_b()
    killed = time.monotonic()
    svc.restart()  # during the loss
    job = handle.wait(timeout=180, check=False)
    assert job.status is JobStatus.error
    assert f"the Ray node {on_b.host} of {on_b.name} left the cluster" in events_text(client, handle.id)

    # 2. each follower ends once the job does: what it read, then one line naming the lost node
    unavailable = (
        f"the logs of {on_b.name} are unavailable: the Ray node {on_b.host} that ran it left the cluster"
    )
    code, out, err = one.result()
    print(f"the single follower ended {time.monotonic() - killed:.1f} s after the raylet was killed")
    assert code == 1, (out[-1000:], err)
    assert f"{on_b.name} tick 3" in out
    assert unavailable in err, err
    code, out, err = every.result()
    print(f"the --all follower ended {time.monotonic() - killed:.1f} s after the raylet was killed")
    assert code == 1, (out[-1000:], err)
    other = "worker-1" if on_b.name == "worker-0" else "worker-0"
    assert _shows(out, other)
    assert f"[{on_b.name}] {unavailable}" in err, err
    notebook.join(120)
    assert followed and followed[0].status is JobStatus.error, cell.text[-2000:]
    assert unavailable in cell.text, cell.text[-2000:]
    code, out, err = Cli(tmp_path, "logs", handle.id, "--all").result()
    assert code == 1
    assert _shows(out, other) and f"[{on_b.name}] {unavailable}" in err, (out[-1000:], err)

    # 1. what the stopped runner left runs on until B's Ray node is started again: its agent
    #    ends it before it takes work
    assert marked(f"{mark}-{on_b.name}"), "the node ended without its runner: the sweep is not what is tested"
    two_hosts.start_b()
    wait_for(lambda: len(client.nodes()) == 2, timeout=120, interval=0.5)
    wait_for(
        lambda: (
            not marked(f"{mark}-{on_b.name}") and not two_hosts.on_b(mark, on_b.name) and not alive(on_b.pid)
        ),
        timeout=120,
    )
    # and the job's events say so
    swept = f"{on_b.name}'s processes left running after its Ray node ended were ended by the agent"
    wait_for(lambda: swept in events_text(client, handle.id), timeout=60, interval=0.5)
