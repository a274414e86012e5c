"""The Horovod (MPI) mode with real Open MPI and mpi4py, through the job service and bubblewrap nodes."""

from __future__ import annotations

import json

import pytest

from ma_jupyter.models import JobStatus

from ..helpers import wait_for, writable_dir
from .real import algorithm, events_text, job_processes, run_job

pytestmark = [pytest.mark.mpi]

ALLREDUCE = """
import json, os, socket
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1)
names = comm.allgather(socket.gethostname())
print(f"rank {rank}/{size} on {socket.gethostname()} sum={total}", flush=True)
if rank == 0:
    with open("/workspace/outputs/result.json", "w") as fh:
        json.dump({"size": size, "sum": total, "hosts": names}, fh)
"""

CRASH = """
import os, time
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.Get_rank() == 3:
    print("rank 3 crashes", flush=True)
    os._exit(3)
time.sleep(600)
"""


def test_mpi4py_allreduce_over_2_nodes_2_slots_with_two_hostnames(ma_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_client,
        name="mpi-2x2",
        mode="horovod",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", allreduce=ALLREDUCE)),
        outputs=str(outputs),
        command="python /workspace/algorithm/allreduce.py",
    )
    print(f"mpi 2x2 allreduce: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_client, job.id)
    result = json.loads((outputs / "result.json").read_text())
    assert result == {"size": 4, "sum": 10, "hosts": ["worker-0", "worker-0", "worker-1", "worker-1"]}
    # the waiting node was stopped once worker-0 finished, and nothing of the job is left
    wait_for(lambda: not job_processes(job.id), timeout=30)
    # each rank's own log lives with the node it ran on
    assert "rank 2/4 on worker-1" in ma_client.read_log(job.id, node="worker-1", rank=2).data
    assert "rank 0/4 on worker-0" in ma_client.read_log(job.id, node="worker-0", rank=0).data


def test_a_crashing_rank_ends_the_mpi_job_in_error(ma_client, tmp_path):
    job, seconds, logs = run_job(
        ma_client,
        timeout=120,
        name="mpi-crash",
        mode="horovod",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", crash=CRASH)),
        command="python /workspace/algorithm/crash.py",
    )
    print(f"mpi 2x2 one rank crashes -> error: {seconds:.1f} s")
    assert job.status is JobStatus.error, logs
    assert "rank 3 crashes" in logs
    wait_for(lambda: not job_processes(job.id), timeout=30)
