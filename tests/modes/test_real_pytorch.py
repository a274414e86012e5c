"""The PyTorch mode with real torch: gloo DDP through the job service, the local backend and bubblewrap."""

from __future__ import annotations

import json

import pytest

from ma_jupyter.models import JobStatus

from ..helpers import wait_for, writable_dir
from .real import algorithm, events_text, job_processes, run_job

pytestmark = [pytest.mark.torch]

DDP = """
import json, os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234 + rank)  # different starting points: DDP must sync them
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(8, 4) + rank
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
params = [p.detach().flatten().tolist() for p in model.parameters()]
info = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "SLOTS")}
info.update(params=params, hostname=os.uname().nodename, world=world)
with open(f"/workspace/outputs/rank-{rank}.json", "w") as fh:
    json.dump(info, fh)
print(f"rank {rank}/{world} done loss={loss.item():.4f}", flush=True)
dist.destroy_process_group()
"""

SEED_TORCHRUN = (
    "torchrun --nnodes ${WORLD_SIZE} --nproc_per_node ${SLOTS} --node_rank ${RANK} "
    "--master_addr ${MASTER_ADDR} --master_port ${MASTER_PORT} /workspace/algorithm/ddp.py"
)


def _results(outputs, count):
    return [json.loads((outputs / f"rank-{r}.json").read_text()) for r in range(count)]


def test_wrapped_python_command_2_nodes_ranks_end_with_identical_parameters(ma_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_client,
        name="ddp-2x1",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", ddp=DDP)),
        outputs=str(outputs),
        command="python /workspace/algorithm/ddp.py",
    )
    print(f"pytorch 2x1 wrapped: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_client, job.id)
    results = _results(outputs, 2)
    assert results[0]["params"] == results[1]["params"]
    assert [r["hostname"] for r in results] == ["worker-0", "worker-1"]
    assert {r["world"] for r in results} == {2}
    # per-rank logs exist (global rank numbering) and the node log carries the prefixed lines
    streams = {(s.node, s.rank) for s in ma_client.log_streams(job.id)}
    assert {("worker-0", 0), ("worker-1", 1)} <= streams
    assert {n.name: n.ranks for n in ma_client.get(job.id).nodes} == {"worker-0": [0], "worker-1": [1]}
    rank1 = ma_client.read_log(job.id, node="worker-1", rank=1).data
    assert "rank 1/2 done" in rank1
    assert "[rank 0] rank 0/2 done" in logs


def test_the_seeds_torchrun_command_on_2_nodes_with_2_cards_has_world_size_4(ma_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_client,
        name="torchrun-2x2",
        mode="pytorch",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", ddp=DDP)),
        outputs=str(outputs),
        command=SEED_TORCHRUN,
    )
    print(f"pytorch seed torchrun 2x2: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_client, job.id)
    results = _results(outputs, 4)
    assert {r["world"] for r in results} == {4}
    assert all(r["params"] == results[0]["params"] for r in results)
    assert [r["hostname"] for r in results] == ["worker-0", "worker-0", "worker-1", "worker-1"]
    assert {r["SLOTS"] for r in results} == {"2"}


FAIL = """
import os, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 3:
    print("rank 3 gives up", flush=True)
    sys.exit(3)
time.sleep(600)  # the others would run on: only the failure can end this job quickly
"""


def test_one_rank_exiting_3_ends_a_2x2_job_in_error_with_no_process_left(ma_client, tmp_path):
    job, seconds, logs = run_job(
        ma_client,
        timeout=120,
        name="fail-2x2",
        mode="pytorch",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", fail=FAIL)),
        command="python /workspace/algorithm/fail.py",
    )
    print(f"pytorch 2x2 one rank exits 3 -> error: {seconds:.1f} s")
    assert job.status is JobStatus.error, logs
    assert "rank 3 gives up" in ma_client.read_log(job.id, node="worker-1", rank=3).data
    # the error names the rank that failed first, not the ranks torchrun stopped afterwards
    assert "rank 3 exited with code 3" in events_text(ma_client, job.id)
    wait_for(lambda: not job_processes(job.id), timeout=30)
