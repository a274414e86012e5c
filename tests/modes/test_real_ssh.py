"""ssh between a job's nodes with the real OpenSSH (each node's sshd) and the real launchers:
``ssh worker-1`` from node 0 and seed 003's mpirun command over ssh, through the job service
and bubblewrap nodes."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import textwrap

import pytest

from ma_jupyter.backends.local.backend import task_address
from ma_jupyter.models import JobStatus
from ma_jupyter.nodehost import network
from ma_jupyter.nodeside.ssh_node import SSHD
from tests.fixtures.real_jobs import ALLREDUCE, algorithm, events_text, job_processes, node_logs

from ..helpers import wait_for, writable_dir

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.ssh,
    pytest.mark.skipif(not os.access(SSHD, os.X_OK), reason="needs Debian's openssh-server (./dev setup)"),
]

# what worker-0 checks before it starts the ranks
CHECKS = r"""
set -e
out=/workspace/outputs
ssh worker-1 hostname > $out/hostname.txt
ssh worker-1 'echo "$MA_TASK_INDEX|$MY_VAR|$(pwd)|$(id -u)"' > $out/remote.txt
echo "$MA_TASK_INDEX|$MY_VAR|$(pwd)|$(id -u)" > $out/local.txt
cat /proc/net/tcp > $out/tcp.txt
# a key that is not the attempt's, the system's client configuration left out
ssh-keygen -q -t ed25519 -N '' -f /tmp/other
if ssh -F /dev/null -i /tmp/other -o IdentitiesOnly=yes -o BatchMode=yes \
       -o UserKnownHostsFile=/tmp/.ssh/known_hosts -o HostKeyAlias=ma_jupyter-job-node \
       -p "$SSHD_PORT" worker-1 true 2> $out/other.txt; then
  echo accepted >> $out/other.txt
fi
echo "$SSHD_PORT" > $out/port.txt
# the test probes the port from the host's network now; bounded wait for its word
for i in $(seq 1200); do [ -e $out/probed ] && break; sleep 0.1; done
"""

# seed 003's launch command as written, but for its lines of other variables (-tune
# ${TUNE_ENV_FILE}, ${OPENMPI_*_ARGS}), which this test is not about; behind the checks
SEED_003 = """mpirun \\
-np ${OPENMPI_NP} \\
-hostfile ${OPENMPI_HOST_FILE_PATH} \\
-mca plm_rsh_args "-p ${SSHD_PORT}" \\
python /workspace/algorithm/allreduce.py"""


def _listening(tcp: str, port: int) -> set[str]:
    """Addresses listening on ``port`` in a ``/proc/net/tcp`` dump."""
    found = set()
    for line in tcp.splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@pytest.mark.timeout(300)
def _sshd_answers(address: str, port: int) -> bool:
    """Whether an sshd greets a connection to ``address:port`` from here.  A connection alone
    proves nothing: where the host has a default route, a gateway may accept any address."""
    try:
        with socket.create_connection((address, port), timeout=5) as conn:
            conn.settimeout(3)
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def test_ssh_between_nodes_and_seed_003s_mpirun_command_over_it(ma_module_home_client, tmp_path):
    outputs = writable_dir(tmp_path / "out")
    algo = algorithm(tmp_path / "algo", allreduce=ALLREDUCE)
    (algo / "checks.sh").write_text(textwrap.dedent(CHECKS))
    value = "two words \"quoted\" 'single' &;"
    job = ma_module_home_client.submit(
        name="ssh-mpi",
        mode="horovod",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algo),
        outputs=str(outputs),
        env={"MY_VAR": value},
        command=f"bash -c 'bash /workspace/algorithm/checks.sh && {SEED_003}'",
    )
    port_file = outputs / "port.txt"
    wait_for(
        lambda: port_file.exists() or ma_module_home_client.get(job.id).status.is_terminal(), timeout=180
    )
    assert port_file.exists(), node_logs(ma_module_home_client, job.id) + events_text(
        ma_module_home_client, job.id
    )
    port = int(port_file.read_text())
    addresses = [task_address(0), task_address(1)]
    if os.geteuid() == 0:  # a root service gives the job a network namespace of its own
        for address in addresses:
            assert not _sshd_answers(address, port), f"{address}:{port} reached from the host"
    (outputs / "probed").touch()
    job = job.wait(timeout=240, check=False)

    logs = node_logs(ma_module_home_client, job.id)
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    # `ssh worker-1 hostname` reached worker-1, without a password or host-key prompt
    assert (outputs / "hostname.txt").read_text() == "worker-1\n"
    # the remote command ran with worker-1's own variables, the job's env, its working
    # directory and the same account
    local = (outputs / "local.txt").read_text().strip().split("|")
    remote = (outputs / "remote.txt").read_text().strip().split("|")
    assert local[0] == "0" and remote[0] == "1"
    assert remote[1] == local[1] == value
    assert remote[2] == local[2] == "/workspace/algorithm"
    assert remote[3] == local[3]
    # each node's sshd listens on its own address only, one port number for both; where each
    # node is a machine of its own, worker-0 sees only its own sshd
    listening = _listening((outputs / "tcp.txt").read_text(), port)
    assert listening == ({addresses[0]} if network.namespaces_supported() else set(addresses))
    # only the attempt's key gets in
    other = (outputs / "other.txt").read_text()
    assert "accepted" not in other and "Permission denied" in other, other
    # seed 003's command: 2 x 2 ranks across both nodes, started over ssh
    result = json.loads((outputs / "result.json").read_text())
    assert result == {"size": 4, "sum": 10, "hosts": ["worker-0", "worker-0", "worker-1", "worker-1"]}
    wait_for(lambda: not job_processes(job.id), timeout=30)


DEEPSPEED_TRAIN = """
import json, os, socket, sys
import deepspeed, torch
import torch.distributed as dist

deepspeed.init_distributed(dist_backend="gloo")
rank, size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
hosts = [None] * size
dist.all_gather_object(hosts, socket.gethostname())
print(f"rank {rank}/{size} on {socket.gethostname()} sum={total.item()} args={sys.argv[1:]}", flush=True)
if rank == 0:
    with open("/workspace/outputs/result.json", "w") as fh:
        json.dump({"size": size, "sum": total.item(), "hosts": hosts}, fh)
os._exit(0)  # the result is written: never depend on gloo's teardown (it may abort at exit)
"""

#: the DeepSpeed image ./dev setup makes (MA_DEEPSPEED_IMAGE: another one): DeepSpeed's packages
#: on the venv's own torch (``pip install --target``), its shared-memory comm op built at install
#: (``DS_BUILD_SHM_COMM=1``), as a production image has it: without it the first
#: ``init_distributed`` on CPU JIT-builds the op on each node (93 s of this test's 117 s here)
DEEPSPEED_IMAGE = os.environ.get(
    "MA_DEEPSPEED_IMAGE",
    os.path.join(
        os.path.dirname(__file__), "..", "..", os.environ.get("MA_VENV", ".venv"), "images", "deepspeed"
    ),
)
#: the op ./dev setup builds: an image without it would JIT-build it in the test, minutes long
DEEPSPEED_OP = os.path.join(DEEPSPEED_IMAGE, "deepspeed", "ops", "comm", "deepspeed_shm_comm_op*.so")


@pytest.mark.timeout(480)
@pytest.mark.skipif(
    not glob.glob(DEEPSPEED_OP),
    reason=f"needs the DeepSpeed image with its comm op built ({DEEPSPEED_OP}: ./dev setup makes it)",
)
def test_a_plain_deepspeed_command_on_node_0_runs_both_nodes_over_pdsh_and_ssh(
    ma_module_home_client, tmp_path
):
    outputs = writable_dir(tmp_path / "out")
    algo = algorithm(tmp_path / "algo", train=DEEPSPEED_TRAIN)
    (algo / "ds_config.json").write_text('{"train_batch_size": 2}')
    # a copy below the test's folder, which jobs may mount
    shutil.copytree(DEEPSPEED_IMAGE, tmp_path / "deepspeed")
    lib = "/workspace/dataset/private/deepspeed"
    job = ma_module_home_client.submit(
        name="ds-ssh",
        mode="pytorch-deepspeed",
        nodes=2,
        # DeepSpeed's launcher and its rank each import torch and DeepSpeed: 2 GB is too little
        specs=["cpu.medium"],
        algorithm=str(algo),
        outputs=str(outputs),
        datasets=[{"name": "deepspeed", "path": str(tmp_path / "deepspeed")}],
        env={"PYTHONPATH": lib, "PATH": f"{lib}/bin:$PATH"},
        # seed 002's command as a user types it: DeepSpeed finds /job/hostfile by itself
        command="deepspeed train.py --deepspeed --deepspeed_config ds_config.json",
    )
    try:
        job = job.wait(timeout=400, check=False)
    except TimeoutError as exc:
        raise AssertionError(node_logs(ma_module_home_client, job.id)) from exc
    logs = node_logs(ma_module_home_client, job.id)
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    result = json.loads((outputs / "result.json").read_text())
    assert result == {"size": 2, "sum": 3.0, "hosts": ["worker-0", "worker-1"]}
    # worker-1 ran nothing but sshd: its rank came from node 0's launcher, through pdsh
    assert "pdsh" in logs and "rank 1/2 on worker-1" in logs
    wait_for(lambda: not job_processes(job.id), timeout=30)


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="nodes run as root only under a root service")
def test_a_horovod_job_whose_nodes_run_as_root_starts_its_ranks_without_sshd(
    ma_root_jobs, ma_client, tmp_path
):
    """An admin's ``allow_root``: OpenSSH's sshd cannot run as root in the sandbox (privilege
    separation needs the capabilities it drops), so the platform's agent reaches worker-1."""
    outputs = writable_dir(tmp_path / "out")
    algo = algorithm(tmp_path / "algo", allreduce=ALLREDUCE)
    job = ma_client.submit(
        name="mpi-root",
        mode="horovod",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algo),
        outputs=str(outputs),
        command="bash -c 'id -u > /workspace/outputs/uid.txt && python /workspace/algorithm/allreduce.py'",
    )
    job = job.wait(timeout=240, check=False)
    logs = node_logs(ma_client, job.id)
    assert job.status is JobStatus.succeeded, logs + events_text(ma_client, job.id)
    assert (outputs / "uid.txt").read_text() == "0\n"  # the nodes did run as root
    result = json.loads((outputs / "result.json").read_text())
    assert result == {"size": 4, "sum": 10, "hosts": ["worker-0", "worker-0", "worker-1", "worker-1"]}
    wait_for(lambda: not job_processes(job.id), timeout=30)
