"""Faults with real processes (issue 13, item 2): a node's runner or the job's own process
killed with ``kill -9``; a second service on the same home, a stale lock and runtime file, a
corrupt or missing ``service.json``: one service wins, and the loser says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.fixtures.service_api import full_log, pycmd, submit, wait_status
from tests.fixtures.service_process import start_service
from tests.helpers import wait_for


def _events(svc, job_id) -> str:
    reply = svc.session().get(f"{svc.api}/jobs/{job_id}/events", timeout=10)
    return "\n".join(e["reason"] for e in reply.json())


def _started(svc, marker: str) -> dict:
    job = submit(
        svc, name="victim", command=pycmd(f"import time; print('{marker}', flush=True); time.sleep(300)")
    )
    wait_for(lambda: marker in full_log(svc, job["id"]), timeout=60)
    return svc.session().get(f"{svc.api}/jobs/{job['id']}", timeout=10).json()


def test_kill_9_of_a_nodes_runner_ends_the_job_in_error_naming_it(ma_service):
    job = _started(ma_service, "runner-victim")
    runner = psutil.Process(job["nodes"][0]["pid"])
    runner.send_signal(signal.SIGKILL)
    ended = wait_status(ma_service, job["id"], {"error", "stopped", "succeeded", "expired"})
    events = _events(ma_service, job["id"])
    print(ended["status"], ended["reason"], events, sep="\n")
    assert ended["status"] == "error"
    assert ended["reason"].startswith("node worker-0 was lost (its process is gone"), ended["reason"]
    assert "node worker-0 was lost" in events
    # nothing of the node is left running
    wait_for(lambda: not any("runner-victim" in " ".join(p.cmdline()) for p in _procs()), timeout=30)


def test_kill_9_of_the_jobs_own_process_ends_the_job_in_error_naming_the_signal(ma_service):
    job = _started(ma_service, "process-victim")
    runner = psutil.Process(job["nodes"][0]["pid"])
    own = [p for p in runner.children(recursive=True) if "process-victim" in " ".join(_cmdline(p))]
    assert own
    own[-1].send_signal(signal.SIGKILL)
    ended = wait_status(ma_service, job["id"], {"error", "stopped", "succeeded", "expired"})
    events = _events(ma_service, job["id"])
    print(ended["status"], ended["reason"], ended["exit_code"], events, sep="\n")
    assert ended["status"] == "error"
    # 137 = 128 + 9: the node's shell convention for a process ended by SIGKILL
    named = "node worker-0 exited with code 137: killed by signal 9 (SIGKILL)"
    assert ended["exit_code"] == 137 and named in ended["reason"], ended["reason"]
    assert named in events


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _procs():
    return [p for p in psutil.process_iter() if _cmdline(p)]


def _second_service(home):
    env = {**os.environ, "MA_JUPYTER_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "ma_jupyter.service"], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_second_service_on_the_same_home_loses_and_says_so(ma_service, ma_home):
    runtime = json.loads((ma_home / "service.json").read_text())
    second = _second_service(ma_home)
    assert second.returncode == 1
    assert f"a job service already runs for {ma_home}" in second.stderr
    # the first one still owns the home and answers
    assert json.loads((ma_home / "service.json").read_text()) == runtime
    assert ma_service.session().get(f"{ma_service.api}/health", timeout=10).json()["pid"] == runtime["pid"]
    # also when its runtime file is gone: the lock decides, not the file
    (ma_home / "service.json").unlink()
    second = _second_service(ma_home)
    assert second.returncode == 1 and "already runs" in second.stderr
    assert ma_service.session().get(f"{ma_service.api}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("runtime", ["stale", "corrupt", "missing"])
def test_a_killed_services_lock_and_a_bad_runtime_file_do_not_block_the_next(ma_home, runtime):
    first = start_service(ma_home)
    first.proc.send_signal(signal.SIGKILL)  # leaves service.lock and service.json behind
    first.proc.wait(10)
    assert (ma_home / "service.lock").exists()
    if runtime == "corrupt":
        (ma_home / "service.json").write_text('{"url": "http://127.0.0.1:1", "tok')
    elif runtime == "missing":
        (ma_home / "service.json").unlink()
    second = start_service(ma_home)
    try:
        data = json.loads((ma_home / "service.json").read_text())
        assert data["pid"] == second.proc.pid != first.proc.pid
        assert (ma_home / "service.json").stat().st_mode & 0o777 == 0o600
        assert second.session().get(f"{second.api}/health", timeout=10).json()["ok"] is True
    finally:
        second.proc.send_signal(signal.SIGTERM)
        second.proc.wait(30)


# ------------------------------------------------ kill -9 of the service in the middle of an end

NUMBERED = """
import signal, sys, time
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
i = 0
while not stopping or time.monotonic() - stopping[0] < 4:
    print(f"n {i}" + (" winding down" if stopping else ""), flush=True)
    i += 1
    time.sleep(0.02)
print("done", i, flush=True)
"""


def _numbered_lines_complete(text: str) -> bool:
    numbers = [int(line.split()[1]) for line in text.splitlines() if line.startswith("n ")]
    return bool(numbers) and numbers == list(range(len(numbers)))


@pytest.mark.small_cluster
@pytest.mark.timeout(300)
def test_kill_9_of_the_service_during_a_stops_grace_loses_nothing(ma_service):
    from tests.fixtures.real_jobs import job_processes

    job = submit(
        ma_service,
        name="slow-stop",
        command=pycmd(NUMBERED),
        specs=["cpu.medium"],
        node_name="tiny",
        grace_period=30,
    )
    wait_for(lambda: "n 20" in full_log(ma_service, job["id"]), timeout=60)
    behind = submit(
        ma_service, name="behind", command=pycmd("print('my turn')"), specs=["cpu.medium"], node_name="tiny"
    )
    assert behind["status"] == "queued"
    ma_service.session().post(f"{ma_service.api}/jobs/{job['id']}/stop", timeout=10)
    wait_for(lambda: "winding down" in full_log(ma_service, job["id"]), timeout=60)
    os.kill(ma_service.proc.pid, signal.SIGKILL)  # mid-grace: the job still prints
    ma_service.proc.wait(10)
    svc = ma_service.restart()
    ended = wait_status(svc, job["id"], {"stopped", "error", "succeeded"}, timeout=120)
    assert ended["status"] == "stopped", ended["reason"]
    log = full_log(svc, job["id"])
    assert "done" in log and _numbered_lines_complete(log), log[-2000:]
    wait_for(lambda: not job_processes(job["id"]), timeout=60)  # no orphan
    finished = wait_status(svc, behind["id"], {"succeeded", "error", "stopped"}, timeout=120)
    assert finished["status"] == "succeeded" and "my turn" in full_log(svc, behind["id"])
    events = svc.session().get(f"{svc.api}/jobs/{behind['id']}/events", timeout=10).json()
    launches = [e for e in events if e["reason"].startswith("running on spec")]
    assert len(launches) == 1  # kept in the queue, started once


WINDS_DOWN = (
    """
import json, os, signal, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if os.environ["MA_ATTEMPT"] != "0":
    print(f"attempt {os.environ['MA_ATTEMPT']} node {index} fine", flush=True)
    sys.exit(0)
if index == 1:
    time.sleep(1)
    sys.exit(3)  # the fault
"""
    + NUMBERED
)


@pytest.mark.timeout(300)
def test_kill_9_of_the_service_during_a_restarts_wind_down_starts_the_job_once(ma_service):
    from tests.fixtures.real_jobs import job_processes

    job = submit(
        ma_service,
        name="restarts",
        mode="tensorflow",
        nodes=2,
        command=pycmd(WINDS_DOWN),
        fault_restart={"max_restarts": 3},
        grace_period=30,
    )
    # worker-1 failed, and worker-0 is being wound down for the restart
    wait_for(lambda: "winding down" in full_log(ma_service, job["id"]), timeout=120)
    os.kill(ma_service.proc.pid, signal.SIGKILL)
    ma_service.proc.wait(10)
    svc = ma_service.restart()
    ended = wait_status(svc, job["id"], {"succeeded", "error", "stopped"}, timeout=180)
    events = svc.session().get(f"{svc.api}/jobs/{job['id']}/events", timeout=10).json()
    assert ended["status"] == "succeeded", (ended["reason"], [e["reason"] for e in events])
    assert ended["restarts"] == 1 and ended["attempt"] == 1, ended
    launches = [e for e in events if e["reason"].startswith("running on spec")]
    assert len(launches) == 2, [e["reason"] for e in events]  # the first attempt and one restart
    log = full_log(svc, job["id"])
    assert "attempt 1 node 0 fine" in log
    first = log.split("attempt 1")[0]
    assert "done" in first and _numbered_lines_complete(first), first[-2000:]  # the wind-down's lines
    wait_for(lambda: not job_processes(job["id"]), timeout=60)
