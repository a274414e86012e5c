"""The Horovod (MPI) mode with real Open MPI and mpi4py, through the job service and bubblewrap nodes."""

from __future__ import annotations

import json
import os

import pytest

from ma_jupyter.models import JobStatus
from ma_jupyter.nodehost import network
from ma_jupyter.nodeside.ssh_node import SSHD
from tests.fixtures.real_jobs import ALLREDUCE, algorithm, events_text, job_processes, run_job

from ..helpers import wait_for, writable_dir

pytestmark = [pytest.mark.mpi]

CRASH = """
import os, time
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.Get_rank() == 3:
    print("rank 3 crashes", flush=True)
    os._exit(3)
time.sleep(600)
"""


def test_mpi4py_allreduce_over_2_nodes_2_slots_with_two_hostnames(ma_module_home_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="mpi-2x2",
        mode="horovod",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", allreduce=ALLREDUCE)),
        outputs=str(outputs),
        command="python /workspace/algorithm/allreduce.py",
    )
    print(f"mpi 2x2 allreduce: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    result = json.loads((outputs / "result.json").read_text())
    assert result == {"size": 4, "sum": 10, "hosts": ["worker-0", "worker-0", "worker-1", "worker-1"]}
    # the waiting node was stopped once worker-0 finished, and nothing of the job is left
    wait_for(lambda: not job_processes(job.id), timeout=30)
    # each rank's own log lives with the node it ran on
    assert "rank 2/4 on worker-1" in ma_module_home_client.read_log(job.id, node="worker-1", rank=2).data
    assert "rank 0/4 on worker-0" in ma_module_home_client.read_log(job.id, node="worker-0", rank=0).data


def test_a_crashing_rank_ends_the_mpi_job_in_error(ma_module_home_client, tmp_path):
    job, seconds, logs = run_job(
        ma_module_home_client,
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
def test_a_rank_reading_stdin_gets_end_of_file_and_the_job_ends(ma_module_home_client, tmp_path):
    job, seconds, logs = run_job(
        ma_module_home_client,
        timeout=240,
        name="mpi-stdin",
        mode="horovod",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", stdin=STDIN)),
        command="python /workspace/algorithm/stdin.py",
    )
    print(f"mpi 2x1 ranks read stdin: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    assert "rank 0 read 0 bytes from stdin" in logs
    assert "rank 1 read 0 bytes from stdin" in logs
    # mpirun forwards only the variables the node has: no "Could not find the environment
    # variable" banner for an unset LD_LIBRARY_PATH
    assert "Could not find the environment variable" not in logs


SEED_003 = """
import json, os, socket
from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor


def where(x):
    # inside a worker the pool spawned (MPI_Comm_spawn)
    return [x * x, socket.gethostname()]


if __name__ == "__main__":
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    names = (
        "MA_TASK_INDEX",
        "SHARED_X",
        "SCC_NOTE",
        "HOROVOD_MPI_THREADS_DISABLE",
        "NCCL_SOCKET_IFNAME",
        "HYDRA_IFACE",
    )
    result = {
        "host": socket.gethostname(),
        "size": comm.Get_size(),
        "sum": comm.allreduce(rank + 1),
        "universe": comm.Get_attr(MPI.UNIVERSE_SIZE),
        "env": {n: os.environ.get(n) for n in names},
    }
    if rank == 0:
        with open(os.environ["TUNE_ENV_FILE"]) as fh:
            result["tune"] = fh.read().splitlines()
        # as mpi4py's demos: a worker per free slot of the universe, at least one
        # (OPENMPI_EXTRA_ARGS=--oversubscribe lets it start beyond the hostfile's slots)
        with MPIPoolExecutor() as pool:
            result["results"] = list(pool.map(where, range(3)))
    comm.Barrier()
    print(f"rank {rank} {result}", flush=True)
    with open(f"/workspace/outputs/seed3-{rank}.json", "w") as fh:
        json.dump(result, fh)
"""

#: seed 003's launch command pasted as its page prints it: one option per line, the argument
#: variables unquoted (each several words, OPENMPI_EXTRA_ARGS empty unless the job sets it); its
#: ``-mca plm_rsh_args "-p ${SSHD_PORT}"`` line where the nodes run sshd (Debian's openssh-server,
#: which ./dev setup installs), as without it mpirun reaches the nodes through the platform's agent
SEED_003_COMMAND = (
    "mpirun \\\n"
    "-np ${OPENMPI_NP} \\\n"
    "-hostfile ${OPENMPI_HOST_FILE_PATH} \\\n"
    + ('-mca plm_rsh_args "-p ${SSHD_PORT}" \\\n' if os.access(SSHD, os.X_OK) else "")
    + "-tune ${TUNE_ENV_FILE} \\\n"
    "${OPENMPI_BIND_ARGS} \\\n"
    "${OPENMPI_X_ARGS} \\\n"
    "${OPENMPI_MCA_ARGS} \\\n"
    "${OPENMPI_EXTRA_ARGS} \\\n"
    "python /workspace/algorithm/seed3.py"
)


@pytest.mark.timeout(300)
def test_seed_003_mpirun_command_runs_with_the_variables_and_worker_0s_tune_file(
    ma_module_home_client, tmp_path
):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_module_home_client,
        timeout=240,
        name="mpi-seed3",
        mode="horovod",
        nodes=2,
        specs=["cpu.medium"],
        env={
            "SHARED_X": "from-worker-0",
            "MA_EMPTY": "",
            "SCC_NOTE": "two words",
            "OPENMPI_EXTRA_ARGS": "--oversubscribe",
        },
        algorithm=str(algorithm(tmp_path / "algo", seed3=SEED_003)),
        outputs=str(outputs),
        command=SEED_003_COMMAND,
    )
    print(f"mpi 2x1 seed 003 command + mpi4py.futures spawn: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    results = [json.loads((outputs / f"seed3-{r}.json").read_text()) for r in range(2)]
    # one rank per node: the hostfile has slots=1 on a CPU spec (seed 002), OPENMPI_NP is 2
    assert [r["host"] for r in results] == ["worker-0", "worker-1"]
    assert {r["size"] for r in results} == {2} and {r["sum"] for r in results} == {3}
    assert {r["universe"] for r in results} == {2}
    # the node's own interface on the job's network (the host's loopback where shared)
    interface = network.NODE_INTERFACE if network.namespaces_supported() else network.SHARED_INTERFACE
    # OPENMPI_X_ARGS reached both ranks; the tune file gave worker-1's rank worker-0's values
    # (its own MA_TASK_INDEX is 1)
    for r in results:
        assert r["env"] == {
            "MA_TASK_INDEX": "0",
            "SHARED_X": "from-worker-0",
            "SCC_NOTE": "two words",  # every node's own (the job's env)
            "HOROVOD_MPI_THREADS_DISABLE": "1",
            "NCCL_SOCKET_IFNAME": interface,
            "HYDRA_IFACE": interface,  # seed 002's eth0: the interface the node reaches its peers on
        }
    tune = results[0]["tune"]
    assert "-x SHARED_X=from-worker-0" in tune and "-x MA_TASK_INDEX=0" in tune
    assert any(line.startswith("-x PATH=") for line in tune)
    # seed 003's grep -v '=$' and the names it selects; a value with white space is left out
    assert not any(line.startswith(("-x MA_EMPTY", "-x SCC_NOTE", "-x OPENMPI_")) for line in tune)
    assert "TUNE_ENV_FILE leaves out SCC_NOTE: its value has white space" in logs
    # mpi4py.futures: rank 0 spawned one worker, which did the work
    assert [value for value, _ in results[0]["results"]] == [0, 1, 4]
    # -x LD_LIBRARY_PATH of OPENMPI_X_ARGS with no LD_LIBRARY_PATH set: no warning banner
    assert "Could not find the environment variable" not in logs
