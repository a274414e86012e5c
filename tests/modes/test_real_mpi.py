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


STDIN = """
import sys
from mpi4py import MPI

data = sys.stdin.read()  # Open MPI 5 forwarding /dev/null would leave this waiting forever
print(f"rank {MPI.COMM_WORLD.Get_rank()} read {len(data)} bytes from stdin", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_rank_reading_stdin_gets_end_of_file_and_the_job_ends(ma_client, tmp_path):
    job, seconds, logs = run_job(
        ma_client,
        timeout=240,
        name="mpi-stdin",
        mode="horovod",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", stdin=STDIN)),
        command="python /workspace/algorithm/stdin.py",
    )
    print(f"mpi 2x1 ranks read stdin: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_client, job.id)
    assert "rank 0 read 0 bytes from stdin" in logs
    assert "rank 1 read 0 bytes from stdin" in logs
    # mpirun forwards only the variables the node has: no "Could not find the environment
    # variable" banner for an unset LD_LIBRARY_PATH
    assert "Could not find the environment variable" not in logs


SPAWN = """
import json, socket
from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor


def where(x):
    # inside a spawned worker: COMM_WORLD is the group of workers the pool spawned
    return [x * x, socket.gethostname(), MPI.COMM_WORLD.Get_size()]


if __name__ == "__main__":
    rank = MPI.COMM_WORLD.Get_rank()
    universe = MPI.COMM_WORLD.Get_attr(MPI.UNIVERSE_SIZE)
    result = {"universe": universe, "host": socket.gethostname()}
    if rank == 0:
        # as mpi4py's own demos: as many workers as the universe has free slots (MPI_Comm_spawn)
        with MPIPoolExecutor() as pool:
            result["results"] = list(pool.map(where, range(4)))
    MPI.COMM_WORLD.Barrier()
    print(f"rank {rank} {result}", flush=True)
    with open(f"/workspace/outputs/spawn-{rank}.json", "w") as fh:
        json.dump(result, fh)
"""


@pytest.mark.timeout(300)
def test_mpi4py_futures_spawns_workers_in_the_cores_of_each_node(ma_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_client,
        timeout=240,
        name="mpi-spawn",
        mode="horovod",
        nodes=2,
        specs=["cpu.medium"],
        algorithm=str(algorithm(tmp_path / "algo", spawn=SPAWN)),
        outputs=str(outputs),
        command="python /workspace/algorithm/spawn.py",
    )
    print(f"mpi 2x1 mpi4py.futures spawn: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_client, job.id)
    results = [json.loads((outputs / f"spawn-{r}.json").read_text()) for r in range(2)]
    # one rank per node, and each node declares its 2 cores as MPI slots: 4 in the universe
    assert [r["host"] for r in results] == ["worker-0", "worker-1"]
    assert {r["universe"] for r in results} == {4}
    # rank 0 spawned a worker for each of the 2 free slots, and they did the work
    assert [value for value, _, _ in results[0]["results"]] == [0, 1, 4, 9]
    assert {workers for _, _, workers in results[0]["results"]} == {2}
    assert {host for _, host, _ in results[0]["results"]} <= {"worker-0", "worker-1"}
