"""Node health on a real service with real node processes: drain, heartbeat loss, the
platform-driven checkpoint resume, the dedicated pool rule and elastic scale-up.

The training script saves a checkpoint (its step and the signal) in its outputs when it gets
SIGTERM or SIGINT, and starts from the checkpoint it finds, so a resumed attempt visibly
continues where the last one stopped.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import pytest

from ma_jupyter.client import Client
from ma_jupyter.client.logs import JobFollower
from tests.fixtures.service_api import (
    events,
    full_log,
    job_of,
    node_view,
    nodes_toml,
    service_with,
    submit,
    wait_status,
)
from tests.helpers import wait_for

PY = sys.executable
SLEEP = f'{PY} -c "import time; time.sleep(600)"'
TRAIN = """\
import json, os, signal, sys, time
ckpt = "/workspace/outputs/ckpt-" + os.environ.get("RANK", "0") + ".json"
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
print("resumed from", step, "attempt", os.environ.get("MA_ATTEMPT"), flush=True)

def save(signum, frame):
    with open(ckpt, "w") as fh:
        json.dump({"step": step, "signal": signum}, fh)
    print("checkpoint at", step, flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, save)
signal.signal(signal.SIGINT, save)
while True:
    step += 1
    time.sleep(0.05)
    if step % 20 == 0:
        print("step", step, flush=True)
"""


def trainer(tmp_path) -> dict:
    algo, out = tmp_path / "algo", tmp_path / "out"
    algo.mkdir()  # the outputs folder does not exist yet: it is made for the job's account
    (algo / "train.py").write_text(TRAIN)
    return {"algorithm": str(algo), "outputs": str(out), "specs": ["cpu.node"]}


def test_a_drained_node_moves_a_resumable_job_away_from_its_checkpoint(request, ma_home, tmp_path):
    svc = service_with(request, ma_home, nodes_toml(3))
    plain = submit(svc, name="plain", command=SLEEP, specs=["cpu.node"], grace_period=1)["id"]
    plain_host = wait_status(svc, plain, {"running"})["nodes"][0]["host"]
    job = submit(
        svc,
        name="resumable",
        command=f"{PY} train.py",
        checkpoint_resume={"grace_period": 20},
        **trainer(tmp_path),
    )["id"]
    host = wait_status(svc, job, {"running"}, timeout=120)["nodes"][0]["host"]
    wait_for(lambda: "step 20" in full_log(svc, job), timeout=120)

    # only admins drain: the service refuses anyone else
    refused = svc.user_session("bob").post(f"{svc.api}/nodes/{host}/drain", timeout=10)
    assert refused.status_code == 403 and "only admins" in refused.json()["message"]
    assert svc.session().post(f"{svc.api}/nodes/nowhere/drain", timeout=10).status_code == 404

    for name in (plain_host, host):
        reply = svc.session().post(
            f"{svc.api}/nodes/{name}/drain", json={"reason": "maintenance"}, timeout=10
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["status"] == "drained"
    view = node_view(svc, host)
    assert view["status"] == "drained" and "maintenance" in view["health"]
    # a job needing every node is still accepted (it waits): drained nodes are only out for now
    whole = {"name": "whole", "command": SLEEP, "mode": "pytorch", "nodes": 3, "specs": ["cpu.node"]}
    planned = svc.session().post(f"{svc.api}/plan", json=whole, timeout=30)
    assert planned.status_code == 200 and planned.json()["can_start_now"] is False, planned.text

    # SIGTERM, the checkpoint, the pre-check, then the next attempt on the node left
    resumed = wait_for(
        lambda: (j := job_of(svc, job))["attempt"] == 1 and j["status"] == "running" and j, 120
    )
    other = ({"n1", "n2", "n3"} - {host, plain_host}).pop()
    assert resumed["nodes"][0]["host"] == other
    checkpoint = json.loads((tmp_path / "out" / "ckpt-0.json").read_text())
    assert checkpoint["signal"] == signal.SIGTERM and checkpoint["step"] >= 20
    wait_for(lambda: f"resumed from {checkpoint['step']} attempt 1" in full_log(svc, job), timeout=120)
    said = events(svc, job)
    assert any("sends SIGTERM" in r and f"away from {host}" in r for r in said)
    assert any(r.startswith("checkpoint resume 1 of") and f"node {host} is drained" in r for r in said)
    precheck = next(r for r in said if r.startswith("pre-check before resume passed"))
    assert f"placed on {other}" in precheck and f"{host} (drained)" in precheck
    assert resumed["restarts"] == 1

    # a job without checkpoint resume keeps running on a drained node
    assert job_of(svc, plain)["status"] == "running"
    assert any("keeps running" in r for r in events(svc, plain))

    assert svc.session().post(f"{svc.api}/nodes/{host}/undrain", timeout=10).status_code == 200
    assert node_view(svc, host)["status"] == "idle" and node_view(svc, host)["health"] == ""


def test_a_runner_that_stops_beating_makes_its_node_faulty(request, ma_home):
    svc = service_with(request, ma_home, nodes_toml(2, "heartbeat_timeout = 3"))
    job = submit(svc, name="frozen", command=SLEEP, specs=["cpu.node"], grace_period=1)["id"]
    run = wait_status(svc, job, {"running"}, timeout=120)["nodes"][0]
    runner = run["pid"]
    wait_for((ma_home / "jobs" / job / "nodes" / "worker-0" / "heartbeat").exists, timeout=60)
    os.kill(runner, signal.SIGSTOP)  # the runner this test's job started: its heartbeat stops
    try:
        view = wait_for(lambda: (v := node_view(svc, run["host"]))["status"] == "faulty" and v, timeout=60)
        assert "no node runner there has beaten" in view["health"] and job not in view["health"]
        ended = wait_status(svc, job, {"error"}, timeout=120)
        assert f"node {run['host']} is faulty" in ended["reason"]
    finally:
        try:
            os.kill(runner, signal.SIGCONT)
        except ProcessLookupError:
            pass
    # nothing new goes to the faulty node until an admin puts it back
    again = submit(svc, name="after", command=SLEEP, specs=["cpu.node"], grace_period=1)["id"]
    assert wait_status(svc, again, {"running"}, timeout=120)["nodes"][0]["host"] != run["host"]


# counts the stop signals it gets, and lingers a moment after saving so a second one would be seen
TRAIN_COUNTING = TRAIN.replace(
    """def save(signum, frame):
    with open(ckpt, "w") as fh:
        json.dump({"step": step, "signal": signum}, fh)
    print("checkpoint at", step, flush=True)
    sys.exit(0)
""",
    """terms = 0
def save(signum, frame):
    global terms
    terms += 1
    with open(ckpt, "w") as fh:
        json.dump({"step": step, "signal": signum, "terms": terms}, fh)
    print("checkpoint at", step, flush=True)
    if terms == 1:
        time.sleep(1.5)
        sys.exit(0)
""",
)


def test_a_frozen_runners_job_still_saves_its_checkpoint_and_resumes_elsewhere(request, ma_home, tmp_path):
    svc = service_with(request, ma_home, nodes_toml(2, "heartbeat_timeout = 3"))
    spec = trainer(tmp_path)
    (tmp_path / "algo" / "train.py").write_text(TRAIN_COUNTING)
    job = submit(
        svc, name="frozen-resumable", command=f"{PY} train.py", checkpoint_resume={"grace_period": 20}, **spec
    )["id"]
    run = wait_status(svc, job, {"running"}, timeout=120)["nodes"][0]
    wait_for(lambda: "step 20" in full_log(svc, job), timeout=120)
    runner = run["pid"]
    os.kill(runner, signal.SIGSTOP)  # the runner relays nothing now: the backend must deliver the stop
    try:
        view = wait_for(lambda: (v := node_view(svc, run["host"]))["status"] == "faulty" and v, timeout=60)
        assert "no node runner there has beaten" in view["health"]
        resumed = wait_for(
            lambda: (j := job_of(svc, job))["attempt"] == 1 and j["status"] == "running" and j, 120
        )
    finally:
        try:
            os.kill(runner, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert resumed["nodes"][0]["host"] != run["host"]
    checkpoint = json.loads((tmp_path / "out" / "ckpt-0.json").read_text())
    # saved on the stop's SIGTERM, delivered once, by the training process itself
    assert checkpoint["signal"] == signal.SIGTERM and checkpoint["step"] >= 20, checkpoint
    assert checkpoint["terms"] == 1, checkpoint
    wait_for(lambda: f"resumed from {checkpoint['step']} attempt 1" in full_log(svc, job), timeout=120)
    assert "the platform sent SIGTERM to the node's" in full_log(svc, job)
    assert any(r.startswith("checkpoint resume 1 of") and "is faulty" in r for r in events(svc, job))


POOLS = '\n[[pool]]\nname = "shared"\n\n[[pool]]\nname = "mine"\ndedicated = true\n'


def test_checkpoint_resume_needs_a_dedicated_pool_where_pools_exist(request, ma_home):
    toml = (
        '\n[[spec]]\nname = "cpu.node"\ncpus = 1\nmemory_gb = 1\n'
        '\n[[node]]\nname = "a"\ncpus = 2\nmemory_gb = 2\npools = ["shared"]\n'
        '\n[[node]]\nname = "b"\ncpus = 2\nmemory_gb = 2\npools = ["mine"]\n' + POOLS
    )
    svc = service_with(request, ma_home, toml)
    body = {"name": "r", "command": SLEEP, "specs": ["cpu.node"], "checkpoint_resume": {}}
    for pool in (None, "shared"):
        reply = svc.session().post(f"{svc.api}/plan", json={**body, "pool": pool}, timeout=30)
        assert reply.status_code == 400, reply.text
        assert reply.json()["field"] == "pool" and "--pool (mine)" in reply.json()["message"]
    assert svc.session().post(f"{svc.api}/plan", json={**body, "pool": "mine"}, timeout=30).status_code == 200
    plain = {k: v for k, v in body.items() if k != "checkpoint_resume"}
    assert svc.session().post(f"{svc.api}/plan", json=plain, timeout=30).status_code == 200


@pytest.mark.parametrize("interval", [2])
def test_an_elastic_job_scales_up_when_nodes_free(request, ma_home, tmp_path, interval):
    svc = service_with(request, ma_home, nodes_toml(2, f"elastic_scale_up_interval = {interval}"))
    blocker = submit(svc, name="blocker", command=SLEEP, specs=["cpu.node"], grace_period=1)["id"]
    wait_status(svc, blocker, {"running"}, timeout=120)
    job = submit(
        svc,
        name="elastic",
        mode="pytorch",
        nodes=2,
        command=f"env {PY} train.py",  # not a python command: each node runs it untouched
        checkpoint_resume={"grace_period": 20, "elastic_min_nodes": 1, "allow_scale_up": True},
        **trainer(tmp_path),
    )["id"]
    # the followers' one follower, started while the job has one node, picks up the second
    client = Client(autostart=False)
    follower = JobFollower(client, client.job(job).info)
    followed: list[str] = []

    def follow() -> None:
        for key, line in follower.lines():
            followed.append(follower.prefix(key) + line)

    threading.Thread(target=follow, daemon=True).start()
    started = wait_status(svc, job, {"running"}, timeout=120)
    assert len(started["nodes"]) == 1
    wait_for(lambda: any("started with 1 of 2 nodes (elastic" in r for r in events(svc, job)), timeout=30)
    wait_for(lambda: "step 20" in full_log(svc, job), timeout=120)

    svc.session().post(f"{svc.api}/jobs/{blocker}/stop", timeout=10)
    grown = wait_for(
        lambda: (j := job_of(svc, job))["status"] == "running" and len(j["nodes"]) == 2 and j, timeout=180
    )
    assert grown["attempt"] == 1 and grown["restarts"] == 0  # a scale-up uses no resume
    checkpoint = json.loads((tmp_path / "out" / "ckpt-0.json").read_text())
    assert checkpoint["signal"] == signal.SIGTERM
    wait_for(lambda: f"resumed from {checkpoint['step']} attempt 1" in full_log(svc, job), timeout=120)
    said = events(svc, job)
    assert any(r.startswith("elastic scale-up: 2 of 2 nodes fit now") for r in said)
    try:
        wait_for(lambda: any(line.startswith("[worker-1] resumed from") for line in followed), timeout=120)
        assert any(line.startswith("[worker-0] step 20") for line in followed), followed[-20:]
    finally:
        follower.stop()
    assert not any("started with" in r for r in said[said.index(next(r for r in said if "scale-up" in r)) :])


def test_the_cli_drains_and_undrains_a_node(ma_cli):
    drained = ma_cli("nodes", "drain", "node-1", "--reason", "disk check")
    assert drained.returncode == 0, drained.stderr
    said = drained.stdout.strip()
    assert said.startswith("node-1: drained (drained by ") and said.endswith(": disk check)")
    table = ma_cli("nodes").stdout
    row = next(line for line in table.splitlines() if line.startswith("node-1"))
    assert "drained" in row and ": disk check" in table
    assert ma_cli("nodes", "drain").returncode == 2  # no node named
    missing = ma_cli("nodes", "drain", "node-99")
    assert missing.returncode != 0 and "no node 'node-99'" in missing.stderr
    back = ma_cli("nodes", "undrain", "node-1")
    assert back.returncode == 0 and back.stdout.strip() == "node-1: idle"
