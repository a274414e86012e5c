"""The backend contract (``Backend``'s docstring in ``ma_jupyter/backends/base.py``, 29 numbered
rules) checked against each backend with real node processes: every test runs once on the local
backend and once on the Ray backend (``backend`` fixture, ``conftest.py``), and names the rules
it checks in its name ("rule N").  ``tests/unit/test_ownership.py`` checks that every rule is
cited here or listed there with the reason it is tested elsewhere.

One attempt checks several rules where they meet (a node that runs, survives a restart of its
observer, writes its log and exits); each attempt is one node, so a test costs one node's start.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest

from ma_jupyter.backends.base import JOB_SECRET_ENV, LAUNCH_ENV, NodeUsage, ProcessLook
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import NodeRun
from ma_jupyter.modes import TaskSlot
from tests.fixtures.local_backend import marked, tree_script
from tests.helpers import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")


def _marker(what: str) -> str:
    return f"ma-contract-{what}-{os.getpid()}-{time.time_ns()}"


def test_rule_14_inventory_and_rules_22_25_node_checks_answer_at_once(backend):
    """Rule 14: the inventory is cheap and the same list while nothing changed (None: the
    local backend's nodes are cluster.toml's); rules 22, 25: the node checks answer for an
    inventory node without a job on it (no cards: no card fault)."""
    nodes = backend.backend.inventory()
    if backend.name == "local":
        assert nodes is None
    else:
        assert len(nodes) == 2 and all(n.name.startswith("ray-") and n.cpus == 2 for n in nodes), nodes
        assert backend.backend.inventory() is nodes
    host = backend.hosts[0]
    # the Ray backend asks the node's agent, which answers once it is up (None meanwhile)
    where, free = wait_for(lambda: backend.backend.job_folders_free(host), timeout=60)
    assert os.path.isabs(where) and free > 0, (where, free)
    assert backend.backend.card_fault(TaskSlot("worker", 0, host=host)) is None


def test_rules_1_15_bind_chooses_names_addresses_and_ports_and_a_dry_run_reserves_nothing(backend):
    """Rule 1: bind is the only place names, addresses and ports are chosen; ``reserve=False``
    gives port 0.  Rule 15: what bind reserved is named by ``reservation`` (Ray: its placement
    group; local: ports only) and released by ``release``."""
    placement = backend.placement("bind-1", tasks=2)
    assert not placement.bound
    dry = backend.backend.bind(placement, reserve=False)
    assert dry is not None and dry.bound
    assert [t.hostname for t in dry.tasks] == ["worker-0", "worker-1"]
    assert all(t.address and t.ports == (0, 0) for t in dry.tasks), dry.tasks
    held = backend.backend.bind(placement, reserve=True)
    assert held is not None
    try:
        assert [t.address for t in held.tasks] == [t.address for t in dry.tasks]
        ports = [p for t in held.tasks for p in t.ports]
        assert len(ports) == 4 and all(ports), held.tasks
        # two tasks on one machine never share a port
        for host in {t.host for t in held.tasks}:
            on_host = [p for t in held.tasks if t.host == host for p in t.ports]
            assert len(set(on_host)) == len(on_host)
        assert bool(held.reservation) == (backend.name == "ray"), held.reservation
    finally:
        backend.backend.release(held)


def test_rules_2_9_12_a_dry_run_has_no_effects_and_refuses_by_field(backend, tmp_path):
    """Rule 2: ``dryrun`` creates nothing and gives one launch per plan, in order, without the
    launch-only variables; rule 9: what the user can fix is an ``InvalidSpec`` naming it; rule
    12: the algorithm folder's Python files, for advice, as the nodes would run them."""
    algo = backend.folder("algo-dry")
    (algo / "train.py").write_text("print('trained')\n")
    (algo / "notes.txt").write_text("not python")
    attempt = backend.attempt(
        "dry-1", "print(1)", tasks=2, reserve=False, env={"LR": "0.5"}, algorithm=str(algo)
    )
    assert backend.backend.code_sources(attempt.spec) == {"train.py": "print('trained')\n"}
    launches = backend.backend.dryrun(attempt)
    assert [launch.name for launch in launches] == [p.name for p in attempt.plans] == ["worker-0", "worker-1"]
    assert all(launch.env["LR"] == "0.5" and not set(LAUNCH_ENV) & set(launch.env) for launch in launches)
    assert launches[0].argv[0] == "python"
    assert not attempt.job_dir.exists()
    missing = backend.attempt(
        "dry-2", "print(1)", reserve=False, datasets=[{"name": "d", "path": str(tmp_path / "gone")}]
    )
    with pytest.raises(InvalidSpec, match="does not exist"):
        backend.backend.dryrun(missing)
    assert not missing.job_dir.exists()


def test_rules_3_4_5_6_7_26_a_node_runs_its_dry_run_survives_its_observer_and_its_log_reads_by_offset(
    backend,
):
    """Rule 3: the node runs the dry run's command with its environment plus only the
    launch-only variables, as the account ``job_account`` names (rule 26).  Rule 4: a backend built anew polls it from the stored record (a
    record whose start time is another process's is not it).  Rules 5, 6: the node writes its
    own log, read from any offset, exactly, and only growing.  Rule 7: its exit code."""
    control = backend.folder("ctl-1")
    script = """
        import json, os, sys, time
        print('ENV ' + json.dumps(dict(os.environ)), flush=True)
        print(f'IDS {os.getuid()} {os.getgid()}', flush=True)
        for i in range(3):
            print(f'line {i}', flush=True)
        while not os.path.exists('/workspace/volume/ctl/go'):
            time.sleep(0.05)
        print('last line', flush=True)
        sys.exit(3)
    """
    attempt = backend.attempt(
        "run-1", script, env={"LR": "0.5"}, volumes=[{"name": "ctl", "path": str(control)}]
    )
    [launch] = backend.backend.dryrun(attempt)
    [run] = backend.start(attempt)
    wait_for(lambda: "line 2" in backend.read_log(attempt.job_id), timeout=120)
    stored = NodeRun.model_validate_json(run.model_dump_json())  # as the store keeps it
    fresh = backend.fresh()
    assert fresh.poll(attempt, stored).state == "running"
    other = stored.model_copy(update={"start_time": stored.start_time - 100})
    assert fresh.poll(attempt, other).state == "lost"

    source = backend.backend.open_log(attempt.job_id, "worker-0", None)
    assert source is not None
    try:
        head, size = source.read(0, 5)
        assert len(head) == 5 and size >= 5
        rest, size_after = source.read(5, 1 << 20)
        assert size_after >= size and source.size() >= size_after
        whole = head + rest
        assert source.read(len(whole), 1 << 20)[0] == b""
        (control / "go").write_text("")
        [ended] = backend.wait_ended(attempt, [stored], backend=fresh)
        assert (ended.state, ended.exit_code) == ("exited", 3)
        later, final = source.read(0, 1 << 20)
        assert later.startswith(whole) and final >= len(whole)
        assert later.decode().endswith("last line\n"), later[-200:]
    finally:
        source.close()

    [env_line] = [line for line in later.decode().splitlines() if line.startswith("ENV ")]
    seen = json.loads(env_line[4:])
    assert {k: v for k, v in seen.items() if k not in launch.env}.keys() >= set(LAUNCH_ENV)
    extra = set(seen) - set(launch.env) - set(LAUNCH_ENV)
    assert not extra, f"variables the dry run did not show: {sorted(extra)}"
    assert {k: seen[k] for k in launch.env} == launch.env
    assert seen[JOB_SECRET_ENV] and seen[JOB_SECRET_ENV] not in json.dumps(launch.model_dump())
    account = backend.backend.job_account(attempt.spec.creator)
    ids = (account.uid, account.gid) if account is not None else (os.getuid(), os.getgid())
    assert f"IDS {ids[0]} {ids[1]}\n" in later.decode()
    with pytest.raises(InvalidSpec):
        backend.backend.open_log(attempt.job_id, "../worker-0", None)


def test_rules_8_17_18_27_stop_offers_the_grace_then_leaves_nothing_and_a_running_node_is_sampled(backend):
    """Rules 17, 18, 27 while the node runs: its heartbeat, usage and processes (local) or None
    (Ray keeps no samples); rule 8: ``stop`` TERMs, waits the grace, KILLs, and returns only
    when no process of the node is left, also one that ignores TERM or left the session."""
    marker = _marker("tree")
    attempt = backend.attempt("stop-1", tree_script(marker))
    runs = backend.start(attempt)
    wait_for(lambda: "tree started" in backend.read_log(attempt.job_id), timeout=120)
    wait_for(lambda: len(marked(marker)) >= 3, timeout=30)

    beat = backend.backend.heartbeat(attempt, runs[0])
    assert beat is None or beat <= time.time() + 1
    usage = backend.backend.usage(attempt.job_id, runs)
    looks = backend.backend.processes(attempt.job_id, runs)
    if backend.name == "local":
        [sample] = usage
        assert isinstance(sample, NodeUsage) and sample.node == "worker-0"
        assert sample.cpu_seconds > 0 and sample.memory_bytes > 0, sample
        assert looks["worker-0"] and all(isinstance(look, ProcessLook) for look in looks["worker-0"])
    else:
        assert usage is None and looks is None

    grace = 1.5
    started = time.monotonic()
    backend.backend.stop(attempt, runs, grace)
    assert time.monotonic() - started >= grace  # the main process ignores TERM: it had its grace
    assert marked(marker) == []
    assert "main got SIGTERM" in backend.read_log(attempt.job_id)  # the grace period was offered first
    assert backend.backend.poll(attempt, runs[0]).state in ("lost", "exited")
    # a node that is gone is left out of the samples, never an error
    assert not backend.backend.usage(attempt.job_id, runs)


def test_rule_8_a_frozen_runners_stop_reaches_the_training_process_itself(backend):
    """Rule 8: a runner that cannot relay the stop (frozen: SIGSTOP) does not claim it, so the
    backend claims it and TERMs the node's processes itself: the job's TERM handler runs (its
    checkpoint is written, once), the log says the platform sent it, and nothing is left."""
    marker = _marker("frozen")
    out = backend.folder("frozen-out")
    script = f"""
        import signal, sys, time
        def save(signum, frame):
            with open('/workspace/outputs/ckpt', 'a') as fh:
                fh.write(f'{{signum}}\\n')
            print('checkpoint saved', flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, save)
        print('training', flush=True)
        time.sleep(600)  # {marker}
    """
    attempt = backend.attempt("frozen-1", script, outputs=str(out))
    [run] = backend.start(attempt)
    wait_for(lambda: "training" in backend.read_log(attempt.job_id), timeout=120)
    os.kill(run.pid, signal.SIGSTOP)  # the runner relays nothing now: the backend must
    try:
        backend.backend.stop(attempt, [run], 20)
    finally:
        try:
            os.kill(run.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert (out / "ckpt").read_text() == f"{int(signal.SIGTERM)}\n"
    log = backend.read_log(attempt.job_id)
    assert "checkpoint saved" in log and "the platform sent SIGTERM to the node's" in log, log
    assert marked(marker) == []
    assert backend.backend.poll(attempt, run).state != "running"


def test_rules_7_11_16_a_killed_runner_is_lost_its_end_is_pushed_and_the_job_is_forgotten(backend):
    """Rule 11: a node's end is pushed to ``on_node_end``'s wake, not only found by a poll;
    rule 7: a node gone without an exit code is ``lost``, never a success; rule 16: ``forget``
    returns at once (the Ray backend's agents then remove the job's folder on their nodes:
    here ``node_root`` is this home's job folders; the local backend keeps nothing else)."""
    marker = _marker("lost")
    attempt = backend.attempt("lost-1", f"import time; print('up', flush=True); time.sleep(600)  # {marker}")
    [run] = backend.start(attempt)
    wait_for(lambda: "up" in backend.read_log(attempt.job_id), timeout=120)
    backend.woken.clear()
    assert backend.backend.poll(attempt, run).state == "running"
    os.kill(run.pid, signal.SIGKILL)  # the runner ends: nothing but the backend's watch notices
    assert backend.woken.wait(60), "the backend never reported the node's end"
    assert wait_for(lambda: backend.backend.poll(attempt, run).state == "lost", timeout=60)
    if backend.name == "local":  # its sandbox dies with its runner (bubblewrap's --die-with-parent)
        wait_for(lambda: marked(marker) == [], timeout=30)
    # the supervisor stops what a lost node may have left (rule 8: nothing is left after it)
    backend.backend.stop(attempt, [run], 1.0)
    assert marked(marker) == []

    returned = threading.Event()
    threading.Thread(
        target=lambda: (backend.backend.forget(attempt.job_id), returned.set()), daemon=True
    ).start()
    assert returned.wait(30), "forget waited on remote work"
    if backend.name == "ray":
        wait_for(lambda: not attempt.job_dir.exists(), timeout=60)
    else:
        assert attempt.job_dir.is_dir()  # the service's folder: the service removes it
    assert not psutil.pid_exists(run.pid) or psutil.Process(run.pid).status() == psutil.STATUS_ZOMBIE


def test_rule_29_object_storage_is_fetched_on_the_nodes_only_by_the_ray_backend(backend):
    """Rule 29: the Ray backend's agents fetch a job's object storage on their machines (True,
    here with nothing to fetch); the local backend leaves it to the service's data preparation."""
    said: list[str] = []
    fetched = backend.backend.fetch_objects(
        "objects-1", backend.hosts[:1], [], {}, None, threading.Event(), said.append
    )
    assert fetched is (backend.name == "ray")
