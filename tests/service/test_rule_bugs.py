"""Small rules of seed 002 on a real service: driver versions only with GPU/MLU specs, a rank's
log asked on the wrong node, who made a change, and the admin's caps from cluster.toml."""

from __future__ import annotations

import sys

import pytest

from tests.fixtures.service_api import job_of, submit, wait_status

PY = sys.executable
SLEEP = f'{PY} -c "import time; time.sleep(600)"'


def test_a_driver_version_is_refused_with_a_cpu_spec(ma_module_service):
    s = ma_module_service.session()
    body = {"name": "cpu-driver", "command": SLEEP, "specs": ["cpu.small"], "driver_version": "535.0"}
    reply = s.post(f"{ma_module_service.api}/jobs", json=body, timeout=10)
    assert reply.status_code == 400, reply.text
    assert reply.json()["field"] == "driver_version"
    assert "GPU and MLU specs only" in reply.json()["message"]
    gpu = {**body, "specs": ["gpu.emu-2"]}
    assert s.post(f"{ma_module_service.api}/plan", json=gpu, timeout=30).status_code == 200


def test_a_ranks_log_asked_on_another_node_says_where_it_runs(ma_module_cli):
    code = "import os; print('rank', os.environ['RANK'], flush=True)"
    done = ma_module_cli("submit", "--wait", "--mode", "pytorch", "--nodes", "2", "--", "python", "-c", code)
    assert done.returncode == 0, done.stderr + done.stdout
    job_id = done.stdout.split(":")[0]
    wrong = ma_module_cli("logs", job_id, "--node", "worker-0", "--rank", "1")
    assert wrong.returncode != 0
    assert "rank 1 of job" in wrong.stderr and "runs on worker-1" in wrong.stderr, wrong.stderr
    right = ma_module_cli("logs", job_id, "--node", "worker-1", "--rank", "1")
    assert right.returncode == 0 and "rank 1" in right.stdout, right.stderr


def test_events_name_the_user_who_changed_or_stopped_a_job(ma_module_service):
    alice = ma_module_service.user_session("alice")
    reply = alice.post(
        f"{ma_module_service.api}/jobs",
        json={"name": "hers", "command": SLEEP, "grace_period": 1},
        timeout=10,
    )
    assert reply.status_code == 201, reply.text
    job_id = reply.json()["id"]
    wait_status(ma_module_service, job_id, {"running"})
    assert (
        alice.patch(f"{ma_module_service.api}/jobs/{job_id}", json={"duration": 600}, timeout=10).status_code
        == 200
    )
    # the owner (an admin) stops it
    assert (
        ma_module_service.session()
        .post(f"{ma_module_service.api}/jobs/{job_id}/stop", timeout=10)
        .status_code
        == 200
    )
    wait_status(ma_module_service, job_id, {"stopped"})
    events = alice.get(f"{ma_module_service.api}/jobs/{job_id}/events", timeout=10).json()
    by = {e["reason"]: e["by"] for e in events if e["by"]}
    owner = ma_module_service.session().get(f"{ma_module_service.api}/users/me", timeout=10).json()["name"]
    assert by == {"duration set to 600 s by alice": "alice", f"stop requested by {owner}": owner}, events


LIMITS = "\n[limits]\nmax_restarts = 2\nmax_grace_period = 60\n"


@pytest.fixture
def capped(ma_home, request):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + LIMITS)
    return request.getfixturevalue("ma_service")


def test_the_admins_caps_come_from_cluster_toml(capped):
    s = capped.session()
    base = {"name": "capped", "command": SLEEP}
    limit_reached = s.post(
        f"{capped.api}/jobs", json={**base, "fault_restart": {"max_restarts": 3}}, timeout=10
    )
    assert limit_reached.status_code == 400 and limit_reached.json()["field"] == "fault_restart.max_restarts"
    assert "cap of 2 ([limits] max_restarts" in limit_reached.json()["message"]
    too_long = s.post(f"{capped.api}/jobs", json={**base, "grace_period": 120}, timeout=10)
    assert too_long.status_code == 400 and too_long.json()["field"] == "grace_period"
    ok = submit(capped, **base, fault_restart={"max_restarts": 2}, grace_period=60)
    assert job_of(capped, ok["id"])["spec"]["fault_restart"]["max_restarts"] == 2
