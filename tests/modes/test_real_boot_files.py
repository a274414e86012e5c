"""DeepSpeed and MindSpore-Ascend boot files, run by the real service, checking what the platform gives them."""

from __future__ import annotations

import json

import pytest

from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import algorithm, events_text, run_job

from ..helpers import writable_dir

DEEPSPEED_BOOT = """
import json, os, socket
# torch.distributed.run's per-process values; the node's own ones are in the platform's variables
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert world == 4, world
assert os.environ["MASTER_ADDR"] == socket.gethostbyname("worker-0")  # worker-0's own address
assert os.environ["SLOTS"] == "2"
hostfile = open("/job/hostfile").read()
assert hostfile == "worker-0 slots=2\\nworker-1 slots=2\\n", hostfile
with open(f"/workspace/outputs/ds-{rank}.json", "w") as fh:
    json.dump({"rank": rank, "local": int(os.environ["LOCAL_RANK"]), "host": os.uname().nodename}, fh)
"""

ASCEND_BOOT = """
import json, os, socket
from ma_jupyter.modes import rank_table

table = rank_table.wait_completed(os.environ["RANK_TABLE_FILE"], timeout=60)
converted = rank_table.to_template1(table)
rank = int(os.environ["RANK_ID"])
devices = [d for s in converted["server_list"] for d in s["device"]]
assert int(os.environ["RANK_SIZE"]) == len(devices) == 4
assert devices[rank]["rank_id"] == str(rank)
assert converted["server_list"][rank // 2]["server_id"] == socket.gethostbyname(socket.gethostname())
with open(f"/workspace/outputs/ms-{rank}.json", "w") as fh:
    json.dump({"device": os.environ["ASCEND_DEVICE_ID"], "host": socket.gethostname()}, fh)
"""


@pytest.mark.torch
def test_deepspeed_boot_file_sees_the_variables_and_the_hostfile(ma_module_home_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="ds-boot",
        mode="pytorch-deepspeed",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", boot=DEEPSPEED_BOOT)),
        outputs=str(outputs),
        command="python /workspace/algorithm/boot.py",
    )
    print(f"deepspeed 2x2 boot file: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    results = [json.loads((outputs / f"ds-{r}.json").read_text()) for r in range(4)]
    assert [(r["host"], r["local"]) for r in results] == [
        ("worker-0", 0),
        ("worker-0", 1),
        ("worker-1", 0),
        ("worker-1", 1),
    ]


def test_mindspore_boot_file_runs_once_per_card_with_a_completed_rank_table(ma_module_home_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="ms-boot",
        mode="mindspore-ascend",
        nodes=2,
        specs=["npu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", boot=ASCEND_BOOT)),
        outputs=str(outputs),
        command="python /workspace/algorithm/boot.py",
    )
    print(f"mindspore 2x2 boot file: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    results = [json.loads((outputs / f"ms-{r}.json").read_text()) for r in range(4)]
    assert [(r["host"], r["device"]) for r in results] == [
        ("worker-0", "0"),
        ("worker-0", "1"),
        ("worker-1", "0"),
        ("worker-1", "1"),
    ]
    streams = {(s.node, s.rank) for s in ma_module_home_client.log_streams(job.id)}
    assert {("worker-0", 0), ("worker-0", 1), ("worker-1", 2), ("worker-1", 3)} <= streams
