"""The node inspection, the pre-check before every placement, performance rescheduling away from
the slow node and the notification hook, on a real service with real node processes.

The job folders' disk is a real small file system (a tmpfs mounted over the home's ``jobs/``
folder before the service starts); the notification hook is a real command the service runs,
a Python script appending what it reads on its standard input to a file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from ma_jupyter import config
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.models import JobSpec, JobStatus
from ma_jupyter.nodehost import network
from ma_jupyter.service.scheduler import Scheduler
from ma_jupyter.service.store import Store
from ma_jupyter.service.supervisor import Supervisor
from tests.fixtures.service_api import (
    events,
    job_of,
    node_view,
    nodes_toml,
    service_with,
    submit,
    wait_status,
)
from tests.helpers import small_tmpfs, stop_every_job, wait_for

PY = sys.executable
MIB = 1 << 20


def hook(tmp_path) -> tuple[str, os.PathLike]:
    """The ``[notify]`` table of a hook writing each event it gets to a file; (table, file)."""
    told = tmp_path / "told.jsonl"
    script = tmp_path / "hook.py"
    script.write_text(
        f"import sys\ndata = sys.stdin.read()\nwith open({str(told)!r}, 'a') as fh:\n    fh.write(data)\n"
    )
    return f'\n[notify]\ncommand = "{PY} {script}"\n', told


def told(path) -> list[dict]:
    """The events the hook received so far."""
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


@pytest.fixture
def small_jobs_disk(ma_home):
    """A 16 MiB tmpfs mounted at ``<home>/jobs`` (the job folders) before the service starts;
    unmounted afterwards (once the service, stopped first, let go of it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = ma_home / "jobs"
    with small_tmpfs(folder, "16m"):
        yield folder


@pytest.mark.timeout(300)
def test_a_node_whose_job_folders_disk_is_nearly_full_is_faulty_while_idle_and_back_with_space(
    request, ma_home, small_jobs_disk, tmp_path
):
    table, told_file = hook(tmp_path)
    svc = service_with(request, ma_home, nodes_toml(2, "node_disk_free_mb = 8") + table)
    assert node_view(svc, "n1")["status"] == "idle"  # 16 MiB free: the nodes pass their checks

    # leave about 5 MiB free on the job folders' disk (submits still pass): under the 8 MB asked
    free = os.statvfs(small_jobs_disk).f_bavail * os.statvfs(small_jobs_disk).f_frsize
    filler = small_jobs_disk / "filler"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * (free - 5 * MIB))
    for name in ("n1", "n2"):  # no job runs there: the inspection looks at idle nodes too
        view = wait_for(lambda name=name: (v := node_view(svc, name))["status"] == "faulty" and v, 60)
        assert f"job folders' disk ({small_jobs_disk})" in view["health"]
        assert "under [limits] node_disk_free_mb = 8" in view["health"]
    alerts = wait_for(lambda: [e for e in told(told_file) if e["kind"] == "alert"], 60)
    assert {e["node"] for e in alerts} <= {"n1", "n2"} and alerts[0]["status"] == "faulty"
    assert "node_disk_free_mb" in alerts[0]["reason"]
    # the nodes list says so to the admin
    listing = subprocess.run(
        [PY, "-c", "from ma_jupyter.frontends.cli import main; main()", "nodes"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert listing.returncode == 0, listing.stderr
    assert "faulty" in listing.stdout and "node_disk_free_mb" in listing.stdout, listing.stdout

    # a resumable job waits: no node may take it
    job = submit(
        svc,
        name="resumable",
        command=f'{PY} -c "print(1)"',
        specs=["cpu.node"],
        checkpoint_resume={"grace_period": 1},
    )["id"]
    time.sleep(2)  # what is checked next is that nothing happened: given the loop a few ticks
    assert job_of(svc, job)["status"] == "queued"

    # an admin drains n2 meanwhile: the drain replaces the check's mark, and stays
    assert svc.session().post(f"{svc.api}/nodes/n2/drain", timeout=10).status_code == 200
    assert "drained by" in node_view(svc, "n2")["health"]
    os.unlink(filler)  # space returns: the inspection puts n1 back by itself
    view = wait_for(lambda: (v := node_view(svc, "n1"))["status"] != "faulty" and v, 60)
    assert view["health"] == ""

    # the job's first placement passes the pre-check, said as its event, with the node checks
    final = wait_status(svc, job, {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    precheck = next(r for r in events(svc, job) if r.startswith("pre-check before the first placement"))
    assert precheck.startswith("pre-check before the first placement passed: checkpoint folder ")
    assert "n1: job folders' disk" in precheck and "(at least 8)" in precheck
    assert "placed on n1" in precheck and "n2 (drained)" in precheck
    time.sleep(6)  # more than one node check (every 5 s): the drain must still be there
    assert node_view(svc, "n2")["status"] == "drained"
    # the job's terminal state reached the hook, as JSON
    ended = wait_for(lambda: [e for e in told(told_file) if e["kind"] == "ended" and e["job"] == job], 30)
    assert ended[0]["status"] == "succeeded" and ended[0]["name"] == "resumable"


SEED_SLOW = "this iteration hardware time is 9.0 and e2e time is 10.0 ms."


@pytest.mark.timeout(300)
def test_a_slow_node_is_rescheduled_onto_the_other_node_and_the_hook_is_told(request, ma_home, tmp_path):
    table, told_file = hook(tmp_path)
    svc = service_with(request, ma_home, nodes_toml(2) + table)
    algo = tmp_path / "algo"
    algo.mkdir()
    (algo / "train.py").write_text(
        "import os, sys, time\n"
        'if os.environ["MA_ATTEMPT"] == "0":\n'
        f"    print({SEED_SLOW!r}, flush=True)\n"
        "    time.sleep(120)\n"
        'print("resumed on a faster node", flush=True)\n'
    )
    job = submit(
        svc,
        name="slow",
        command=f"{PY} train.py",
        algorithm=str(algo),
        specs=["cpu.node"],
        checkpoint_resume={
            "max_resumes": 2,
            "grace_period": 1,
            "perf_threshold": 0.5,
            "perf_policy": "reschedule",
        },
    )["id"]
    first = wait_status(svc, job, {"running"}, timeout=120)["nodes"][0]["host"]
    other = ({"n1", "n2"} - {first}).pop()
    final = wait_status(svc, job, {"succeeded", "error"}, timeout=180)
    assert final["status"] == "succeeded", final["reason"]
    assert final["nodes"][0]["host"] == other and final["attempt"] == 1
    assert final["excluded_nodes"] == [first]
    said = events(svc, job)
    assert (
        f"checkpoint resume 1 of 2: rescheduled away from {first}: performance alert on worker-0: "
        "hardware/e2e time 0.900 exceeds the threshold 0.5"
    ) in said
    resumed = next(r for r in said if r.startswith("pre-check before resume passed"))
    assert f"placed on {other}" in resumed and f"{first} (slow for this job)" in resumed

    # the hook got the alert and the terminal state, in that order, as JSON on its stdin
    got = wait_for(lambda: (t := [e for e in told(told_file) if e["job"] == job]) and len(t) >= 2 and t, 30)
    assert [e["kind"] for e in got] == ["alert", "ended"]
    assert f"rescheduled away from {first}" in got[0]["reason"] and got[0]["node"] == "worker-0"
    assert got[1]["status"] == "succeeded" and got[1]["user"] and got[1]["time"]


def test_a_node_failing_the_pre_check_is_marked_and_the_job_waits_then_starts(ma_home):
    """The pre-check's node checks run at the placement itself (before the periodic ones saw the
    node): the threshold is set above the disk's free space, so the placed node fails."""
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), LocalBackend())
    try:
        cluster = sup.scheduler.cluster
        free_mb = os.statvfs(config.jobs_root()).f_bavail * os.statvfs(config.jobs_root()).f_frsize / MIB
        cluster.limits = dataclasses.replace(cluster.limits, node_disk_free_mb=free_mb * 4)
        spec = JobSpec(name="resumable", command=f"{PY} -c 'print(1)'", checkpoint_resume={"grace_period": 1})
        job = sup.submit(spec, creator="me")
        assert sup.admit() == 0  # the pass itself, before any periodic node check
        said = [e.reason for e in sup.store.events(job.id)]
        failed = next(r for r in said if r.startswith("pre-check before the first placement failed on "))
        node = failed.split("failed on ")[1].split(":")[0]
        assert "under [limits] node_disk_free_mb" in failed and failed.endswith("placing the job elsewhere")
        assert sup.health.statuses[node] == "faulty" and sup.health.snapshot()[node].source == "disk"
        assert sup.store.get(job.id).status is JobStatus.queued

        cluster.limits = dataclasses.replace(cluster.limits, node_disk_free_mb=1)  # space is enough now

        def done():
            sup.tick()
            sup.wait_idle()
            return sup.store.status(job.id).is_terminal()

        wait_for(done, timeout=60)
        assert sup.store.get(job.id).status is JobStatus.succeeded
        assert node not in sup.health.statuses  # the next node check put it back
        assert any(
            r.startswith("pre-check before the first placement passed")
            for r in (e.reason for e in sup.store.events(job.id))
        )
    finally:
        stop_every_job(sup)


SHARED_NODE = (
    '\n[[spec]]\nname = "half"\ncpus = 1\nmemory_gb = 1\n\n[[node]]\nname = "n1"\ncpus = 2\nmemory_gb = 2\n'
)
FLOOD = f"{PY} -c \"import sys; w = sys.stdout.buffer.write; [w(b'x' * (1 << 20)) for _ in range(200)]\""
WAIT_GO = f"{PY} -c \"import os, time\nwhile not os.path.exists('/workspace/dataset/private/ctl/go'): time.sleep(0.1)\""


@pytest.fixture
def jobs_disk_64m(ma_home):
    """A 64 MiB tmpfs at ``<home>/jobs`` before the service starts (the issue's small disk)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with small_tmpfs(ma_home / "jobs", "64m") as folder:
        yield folder


@pytest.mark.timeout(300)
def test_one_users_log_flood_ends_that_job_and_not_the_other_users_job_on_the_node(
    request, ma_home, jobs_disk_64m, tmp_path
):
    """The issue's reproduction: the job folders on a 64 MiB disk, ``max_log_mb = 8``; alice's
    job writes 200 MB to its standard output on the node bob's job shares.  Alice's job ends
    naming its logs; the disk her files fill takes the node out of placement, but bob's running
    job keeps running there and succeeds."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    # alice's logs pass 8 MB before she is stopped: the disk then has less than 56 MB free
    svc = service_with(request, ma_home, SHARED_NODE + "\n[limits]\nmax_log_mb = 8\nnode_disk_free_mb = 56\n")
    alice, bob = svc.user_session("alice"), svc.user_session("bob")
    datasets = [{"name": "ctl", "path": str(ctl)}]  # read-only: the test says go
    reply = bob.post(
        f"{svc.api}/jobs",
        json={"name": "bob", "command": WAIT_GO, "specs": ["half"], "datasets": datasets},
        timeout=30,
    )
    assert reply.status_code == 201, reply.text
    bobs = reply.json()["id"]
    wait_status(svc, bobs, {"running"})
    reply = alice.post(
        f"{svc.api}/jobs", json={"name": "alice", "command": FLOOD, "specs": ["half"]}, timeout=30
    )
    assert reply.status_code == 201, reply.text
    alices = reply.json()["id"]
    ended = wait_status(svc, alices, {"succeeded", "error", "stopped"}, timeout=120)
    assert ended["status"] == "error"
    # her logs' cap, or the disk she filled under her own job folder (whichever is seen first)
    own_disk = f"disk full under {jobs_disk_64m / alices}"
    assert "exceeded [limits] max_log_mb of 8 MB" in ended["reason"] or own_disk in ended["reason"], ended
    assert bobs not in ended["reason"]
    # the node's disk check fails now (alice's files stay): no new placement there
    view = wait_for(lambda: (v := node_view(svc, "n1"))["status"] == "faulty" and v, 60)
    assert "node_disk_free_mb = 56" in view["health"] and str(jobs_disk_64m) in view["health"]
    # bob's job was looked at with the mark there, and keeps running
    said = wait_for(lambda: [r for r in events(svc, bobs) if "keeps running" in r], 60)
    assert "node n1 is faulty" in said[0], said
    assert job_of(svc, bobs)["status"] == "running"
    (ctl / "go").write_text("")
    final = wait_status(svc, bobs, {"succeeded", "error", "stopped"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]


def test_a_machine_that_cannot_make_a_job_network_has_its_nodes_marked_faulty_until_it_can(ma_home):
    """Seed 002's inspection of the network: each node check makes a two-node job network as an
    attempt would, connects across it and removes it.  A namespace folder another account could
    write (what a job's network must never be made in) fails it: every idle node is faulty with
    the reason, and back once the folder is private again."""
    if not network.namespaces_supported():
        pytest.skip("job networks need root")
    backend = LocalBackend()
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), backend)
    try:
        names = [n.name for n in sup.scheduler.nodes()]
        assert backend.node_host.probe_network() is None  # made, crossed both ways, removed
        probes = ma_home / "netns-probe"
        assert probes.is_dir() and list(probes.iterdir()) == []  # nothing of the probe is left
        probes.chmod(0o777)
        backend.node_host.network_check.every = 0.0  # each check starts a probe (not once per 10 s)

        def marked() -> dict:
            sup.inspection.check_nodes()  # the answer of the probe it started before
            return len(sup.health.snapshot()) == len(names) and sup.health.snapshot()

        marks = wait_for(marked, timeout=60)
        assert set(marks) == set(names), marks
        for mark in marks.values():
            assert mark.status == "faulty" and mark.source == "check"
            assert mark.reason.startswith("network check: the job network cannot be made: ")
            assert f"{probes} must be a folder of this account that no one else may write" in mark.reason
        probes.chmod(0o700)

        def back() -> bool:
            sup.inspection.check_nodes()
            return not sup.health.statuses

        wait_for(back, timeout=60)
    finally:
        stop_every_job(sup)


def test_one_failed_network_probe_marks_nothing_two_in_a_row_do(ma_home, monkeypatch):
    """A probe that fails once may have met a loaded moment: the machine's nodes are faulty only
    when the next probe (started at the next look, not 10 s later) fails too."""
    if not network.namespaces_supported():
        pytest.skip("job networks need root")
    backend = LocalBackend()
    answers = iter(["cannot: once", None, "cannot: first", "cannot: second", None])
    monkeypatch.setattr(backend.node_host, "probe_network", lambda: next(answers))

    def look() -> str | None:  # one look, once the probe it starts has answered
        why = backend.network_fault("any")
        wait_for(lambda: not backend.node_host.network_check.running, timeout=30)
        return why

    assert look() is None  # the first probe starts; nothing known yet
    assert look() is None  # it failed once: not said, and this look probes again at once: passed
    backend.node_host.network_check.every = 0.0  # each look starts a probe
    assert look() is None  # the passed answer; this look's probe fails once
    assert look() is None  # still not said; this look's probe fails again
    assert look() == "cannot: second"  # two in a row: said


def test_a_closing_host_removes_what_a_network_probe_left(ma_home):
    """A service stopped while its network probe ran left the probe's namespaces mounted in its
    home: the folder holding it (a test's or a benchmark's temporary one) could not be removed
    until another service's sweep.  Closing the host removes them."""
    from ma_jupyter.backends.local.backend import LocalBackend
    from ma_jupyter.nodehost import network

    if not network.namespaces_supported():
        pytest.skip("this machine makes no network namespaces")
    backend = LocalBackend()
    probes = backend.node_host._probes_folder()
    network.make_namespace(probes / "probe-1.0")  # what a probe under way had made
    backend.close()
    assert list(probes.iterdir()) == []


#: a probe that stops between making its namespaces and crossing them, until it is killed
PROBE_HELD = """
import sys, time
from pathlib import Path
from ma_jupyter.nodehost import network

def held(*args, **kwargs):
    print("made", flush=True)
    time.sleep(600)

network.cross_probe = held
network.probe_job_network(Path(sys.argv[1]), "probe-held")
"""


def test_a_service_killed_mid_probe_leaves_nothing_mounted(tmp_path):
    """SIGKILL, which no closing host outlives, while the probe's namespaces exist: nothing of
    them was ever mounted where this process (or anyone) sees it, and the folder is removed."""
    import select
    import shutil

    from tests.fixtures.service_process import REPO

    if not network.namespaces_supported():
        pytest.skip("this machine makes no network namespaces")
    folder = tmp_path / "netns-probe"
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE_HELD, str(folder)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline().strip() == "made", proc.poll()
        assert sorted(p.name for p in folder.iterdir()) == [
            "probe-held.0",
            "probe-held.1",
            "probe-held.switch",
        ]
        with open("/proc/self/mountinfo") as mounts:
            assert str(folder) not in mounts.read()
    finally:
        proc.kill()
        proc.wait(30)
    shutil.rmtree(folder)  # no "Device or resource busy"
