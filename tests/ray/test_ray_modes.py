"""The distributed modes, restarts and expiry on a real Ray cluster of two nodes."""

from __future__ import annotations

import json

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import MWMS, events_text, job_processes, node_logs
from tests.fixtures.real_jobs import writable_algorithm as _algorithm
from tests.helpers import wait_for, writable_dir

pytestmark = [pytest.mark.ray]

BOOT = """
import json, os
from ma_jupyter.nodeside.rank_table import wait_completed

table = wait_completed(os.environ["RANK_TABLE_FILE"])  # boot files start before the table is complete
servers = [i["server_id"] for g in table["group_list"] for i in g["instance_list"]]
print(f"rank {os.environ['RANK_ID']}/{os.environ['RANK_SIZE']} device {os.environ['DEVICE_ID']} "
      f"servers {servers} status {table['status']}", flush=True)
"""


def test_mindspore_ascend_runs_one_process_per_card_on_each_ray_node(ray_service, tmp_path):
    client = Client(autostart=False)
    nodes = client.nodes()
    assert {(n.accelerators, n.accelerator_type) for n in nodes} == {(2, "npu")}
    handle = client.submit(
        name="ascend",
        mode="mindspore-ascend",
        nodes=2,
        specs=["npu.emu-2"],
        algorithm=_algorithm(tmp_path / "algo", boot=BOOT),
        command="python boot.py",
    )
    try:
        job = handle.wait(timeout=180, check=False)
    except TimeoutError:
        raise AssertionError(node_logs(client, handle.id) + events_text(client, handle.id)) from None
    assert job.status is JobStatus.succeeded, node_logs(client, job.id) + events_text(client, job.id)
    assert len({n.host for n in job.nodes}) == 2
    lines = []
    for rank in range(4):
        node = "worker-0" if rank < 2 else "worker-1"
        lines.append(client.read_log(job.id, node=node, rank=rank).data.strip())
    assert [line.split(" servers")[0] for line in lines] == [
        "rank 0/4 device 0",
        "rank 1/4 device 1",
        "rank 2/4 device 0",
        "rank 3/4 device 1",
    ]
    # the rank table names each machine's address on the job's overlay (docs/network.md), and
    # every node's launcher completed it
    expected = "servers ['10.253.0.1', '10.253.0.2'] status completed"
    assert all(line.endswith(expected) for line in lines), lines


def test_deepspeed_hostfile_and_tensorflow_allreduce(ray_service, tmp_path):
    client = Client(autostart=False)
    deepspeed = client.submit(
        name="ds", mode="pytorch-deepspeed", nodes=2, specs=["cpu.small"], command="cat /job/hostfile"
    ).wait(timeout=180, check=False)
    assert deepspeed.status is JobStatus.succeeded, node_logs(client, deepspeed.id)
    assert "worker-0 slots=1\nworker-1 slots=1" in client.read_log(deepspeed.id, node="worker-1").data
    outputs = writable_dir(tmp_path / "out")
    mwms = client.submit(
        name="mwms",
        mode="tensorflow",
        nodes=2,
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", train=MWMS),
        outputs=str(outputs),
        command="python /workspace/algorithm/train.py",
    ).wait(timeout=300, check=False)
    assert mwms.status is JobStatus.succeeded, node_logs(client, mwms.id) + events_text(client, mwms.id)
    results = [json.loads((outputs / f"mwms-{i}.json").read_text()) for i in range(2)]
    assert {r["replicas"] for r in results} == {2}
    assert results[0]["weights"] == results[1]["weights"]  # the all-reduce across Ray nodes kept them equal


def test_a_fault_restart_runs_a_new_attempt_and_a_duration_expires(ray_service, ray_driver, tmp_path):
    import ray.util

    client = Client(autostart=False)
    flaky = "import os, sys\nprint('attempt', os.environ['MA_ATTEMPT'], flush=True)\nsys.exit(0 if os.environ['MA_ATTEMPT'] != '0' else 5)\n"
    job = client.submit(
        name="flaky",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", flaky=flaky),
        command="python /workspace/algorithm/flaky.py",
        fault_restart={"max_restarts": 1},
    ).wait(timeout=240, check=False)
    assert job.status is JobStatus.succeeded, events_text(client, job.id)
    assert (job.attempt, job.restarts) == (1, 1)
    assert "attempt 1" in client.read_log(job.id, node="worker-1").data
    # its ranks never joined a process group: node 0's launcher said so from its Ray node
    alerts = [e for e in client.events(job.id) if e.alert]
    assert [(e.node, e.reason.split(",")[0]) for e in alerts] == [
        ("worker-0", "not distributed: no rank of the 2 nodes joined a process group")
    ], events_text(client, job.id)
    # each attempt had its own placement group, and both are gone
    groups = [g for g in ray.util.placement_group_table().values() if f"-{job.id}-" in g["name"]]
    assert len(groups) == 2 and {g["state"] for g in groups} == {"REMOVED"}, groups
    expiring = client.submit(
        name="expiring",
        specs=["cpu.small"],
        algorithm=_algorithm(
            tmp_path / "algo2", wait="import time\nprint('up', flush=True)\ntime.sleep(600)\n"
        ),
        command="python wait.py",
        duration=5,
    ).wait(timeout=120, check=False)
    assert expiring.status is JobStatus.expired
    wait_for(lambda: job_processes(expiring.id) == [], timeout=30)


CHECKPOINTED = """import os, sys, time
out = "/workspace/outputs/step.txt"
if os.environ["MA_RESUME"] == "1":
    print("resumed at step", open(out).read(), "on attempt", os.environ["MA_ATTEMPT"], flush=True)
    sys.exit(0)
open(out, "w").write("7")
print("saved step 7", flush=True)
time.sleep(0.5)
sys.exit(4)  # a fault after the checkpoint
"""


def test_a_checkpoint_resume_reschedules_and_the_next_attempt_loads_the_checkpoint(ray_service, tmp_path):
    """The outputs folder is shared by the Ray nodes (one machine here): the second attempt,
    in a new placement group, finds what the first saved."""
    client = Client(autostart=False)
    outputs = writable_dir(tmp_path / "out")
    job = client.submit(
        name="resumed",
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", ckpt=CHECKPOINTED),
        outputs=str(outputs),
        command="python /workspace/algorithm/ckpt.py",
        checkpoint_resume={"max_resumes": 1, "grace_period": 5},
    ).wait(timeout=240, check=False)
    assert job.status is JobStatus.succeeded, events_text(client, job.id) + node_logs(client, job.id)
    assert job.attempt == 1 and job.restarts == 1
    log = client.read_log(job.id, node="worker-0").data
    assert "saved step 7" in log and "resumed at step 7 on attempt 1" in log, log
    assert "resum" in events_text(client, job.id)
    assert job.backend == "ray"
