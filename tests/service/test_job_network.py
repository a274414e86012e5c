"""A hostile job against the network it shares with the service and other jobs (issue 24, items
1 and 7), on a real root service with the local backend.

The job does what the reproduction did: it reads ``/proc/net/tcp`` and ``/proc/net/unix`` for
listeners, then tries to connect to the service's port, to another (``--access none``) job's
listening port on every address that job could be reached at, and to that job's abstract
debug-terminal socket.  Each must fail, while the test shows from outside that every target is
real (the service answers on the host, the other job's port answers inside its namespace, its
abstract socket is listed there); and the nodes of one job still reach each other (a 2-node
job over TCP by hostname, and a 2-node MPI allreduce through mpirun's agent).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from urllib.parse import urlparse

import psutil
import pytest

from ma_jupyter.models import JobStatus
from ma_jupyter.nodehost import fence, network
from tests.helpers import wait_for, writable_dir

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a job's network namespace needs a root service"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.timeout(300),
]

#: the victim: listens on every address of its namespace, then sleeps
LISTENER = r"""
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.listen(8)
print("victim listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"victim-data")
    conn.close()
"""

#: the prober: what a hostile job reads and tries (stdlib only; prints one JSON line)
PROBE = r"""
import errno, json, socket

targets = json.load(open("/workspace/algorithm/targets.json"))
found = {}

def listening(path):
    ports = set()
    try:
        lines = open(path).read().splitlines()[1:]
    except OSError:
        return ports
    for line in lines:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports

found["listening"] = sorted(listening("/proc/net/tcp") | listening("/proc/net/tcp6"))
found["unix"] = open("/proc/net/unix").read()
found["devices"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
for host, port in targets["tcp"]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect((host, port))
        found[f"tcp {host}:{port}"] = "connected " + sock.recv(64).decode(errors="replace")
    except OSError as exc:
        found[f"tcp {host}:{port}"] = errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()
for name in targets["abstract"]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(b"\0" + name.encode())
        found[f"abstract {name}"] = "connected"
    except OSError as exc:
        found[f"abstract {name}"] = errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()
print("PROBES " + json.dumps(found), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def _host_addresses() -> list[str]:
    """Every IPv4 address of the host's interfaces (loopback included)."""
    return sorted(
        {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    )


def _inside(pid: int, code: str) -> subprocess.CompletedProcess:
    """Run Python ``code`` in the network namespace of process ``pid`` (the test's own look)."""
    return subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_job_reaches_neither_the_service_nor_another_jobs_port_nor_its_abstract_sockets(
    ma_client, tmp_path
):
    service_port = urlparse(ma_client.url).port
    victim_port = _free_port()
    victim_algo = writable_dir(tmp_path / "victim")
    (victim_algo / "listen.py").write_text(LISTENER)
    victim = ma_client.submit(
        name="victim",
        algorithm=str(victim_algo),
        command=f"python /workspace/algorithm/listen.py {victim_port}",
        access="none",
        debug_terminal=True,
        grace_period=1,
    )
    wait_for(lambda: "victim listening" in ma_client.read_log(victim.id).data, timeout=120)
    runner = ma_client.get(victim.id).nodes[0].pid
    shell_name = f"ma_jupyter-shell/{victim.id}/worker-0"
    # the targets are real: the victim's port answers and its terminal is listed in its own
    # namespace, and the service answers on the host
    wait_for(lambda: shell_name in _inside(runner, "print(open('/proc/net/unix').read())").stdout, timeout=60)
    answer = _inside(
        runner,
        f"import socket; s = socket.create_connection(('127.0.0.1', {victim_port})); print(s.recv(64))",
    )
    assert "victim-data" in answer.stdout, answer.stderr
    socket.create_connection(("127.0.0.1", service_port), timeout=10).close()

    victim_addresses = ["127.0.0.1", "127.0.1.1", "10.254.0.1", *_host_addresses()]
    tcp = {("127.0.0.1", service_port), ("::1", service_port)}
    tcp |= {(address, victim_port) for address in victim_addresses}
    tcp |= {(address, service_port) for address in _host_addresses()}
    targets = {
        "tcp": sorted(tcp),
        "abstract": [shell_name, f"ma_jupyter-rsh/{victim.id}/worker-0"],
    }
    algo = writable_dir(tmp_path / "prober")
    (algo / "probe.py").write_text(PROBE)
    (algo / "targets.json").write_text(json.dumps(targets))
    prober = ma_client.submit(
        name="prober", algorithm=str(algo), command="python /workspace/algorithm/probe.py"
    )
    job = prober.wait(timeout=180)
    log = ma_client.read_log(prober.id).data
    assert job.status is JobStatus.succeeded, log
    found = json.loads(log.split("PROBES ", 1)[1].splitlines()[0])
    unix = found.pop("unix")
    print(json.dumps(found, indent=1))
    assert victim.id not in unix  # item 7: no other job's id in /proc/net/unix
    assert "ma_jupyter-" not in unix  # nor any other node's agent name
    assert found.pop("listening") == []  # nothing of the host listens where the job looks
    assert found.pop("devices") == ["lo", "ma0"]  # no device that leads out: ma0 is on its switch
    reached = {k: v for k, v in found.items() if str(v).startswith("connected")}
    assert reached == {}, reached
    assert len(found) == len(targets["tcp"]) + len(targets["abstract"])
    assert ma_client.get(victim.id).status is JobStatus.running  # untouched
    victim.stop()


PEERS = r"""
import os, socket, sys, time
me = socket.gethostname()
port = int(sys.argv[1])
if me == "worker-0":
    server = socket.socket()
    server.bind(("0.0.0.0", port))
    server.listen(1)
    conn, peer = server.accept()
    print("worker-0 heard:", conn.recv(64).decode(), flush=True)
else:
    deadline = time.time() + 60
    while True:
        try:
            sock = socket.create_connection(("worker-0", port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    sock.sendall(b"hello from " + me.encode())
    print("worker-1 sent", flush=True)
"""


def test_the_nodes_of_one_job_still_reach_each_other_by_hostname_and_through_mpirun(
    ma_module_client, tmp_path
):
    from tests.fixtures.real_jobs import ALLREDUCE, algorithm, node_logs

    algo = writable_dir(tmp_path / "peers")
    (algo / "peers.py").write_text(PEERS)
    job = ma_module_client.submit(
        name="peers",
        mode="tensorflow",  # runs the command as it is on each node, TF_CONFIG beside it
        algorithm=str(algo),
        nodes=2,
        command=f"python /workspace/algorithm/peers.py {_free_port()}",
    ).wait(timeout=180)
    logs = node_logs(ma_module_client, job.id)
    assert job.status is JobStatus.succeeded, logs
    assert "worker-0 heard: hello from worker-1" in logs
    outputs = writable_dir(tmp_path / "out")
    mpi = ma_module_client.submit(
        name="mpi-2x2",
        mode="horovod",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", allreduce=ALLREDUCE)),
        outputs=str(outputs),
        command="python /workspace/algorithm/allreduce.py",
    ).wait(timeout=180)
    assert mpi.status is JobStatus.succeeded, node_logs(ma_module_client, mpi.id)
    result = json.loads((outputs / "result.json").read_text())
    assert result["size"] == 4 and result["sum"] == 10


FENCED = r"""
import ctypes, errno, json, socket, sys
from ma_jupyter.nodehost import fence

denied, allowed, abstract, free = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
fence.fence([[denied, denied], [free, free]])
found = {}
for name, port in (("bind denied", free), ("bind any", 0)):
    try:  # a job holding the ports Ray starts its workers on would starve the raylet
        socket.socket().bind(("0.0.0.0", port))
        found[name] = "bound"
    except OSError as exc:
        found[name] = errno.errorcode[exc.errno]
for name, port, proto in (("denied", denied, 0), ("allowed", allowed, 0), ("mptcp", denied, 262)):
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"ping")  # an ordinary send passes the filter
        found[name] = "connected"
    except OSError as exc:
        found[name] = errno.errorcode[exc.errno]
sock = socket.socket()
try:  # TCP Fast Open: a connect made by the first send
    sock.sendto(b"hello", socket.MSG_FASTOPEN, ("127.0.0.1", denied))
    found["fastopen"] = "connected"
except OSError as exc:
    found["fastopen"] = errno.errorcode[exc.errno]
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(b"\0" + abstract.encode())
    found["abstract"] = "connected"
except OSError as exc:
    found["abstract"] = errno.errorcode[exc.errno]
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
found["io_uring"] = "made" if libc.syscall(425, 4, params) >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(found))
"""


@pytest.mark.skipif(fence.landlock_abi() < 6, reason="the fence needs Landlock ABI 6 (Linux 6.12)")
def test_the_fence_of_a_node_on_a_shared_network_refuses_what_it_must_and_nothing_else(tmp_path):
    """The Ray nodes' fence (``fence.fence``) in a process of its own: a denied port refused
    (EACCES), another one reached, no bind on a denied port (free, but Ray's), no MPTCP socket, no TCP Fast Open send, no abstract socket of
    outside, no io_uring."""
    listeners = [socket.socket() for _ in range(2)]
    for sock in listeners:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
    name = f"ma-fence-test-{tmp_path.name}"
    outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    outside.bind(b"\0" + name.encode())
    outside.listen(4)
    with socket.socket() as probe:  # a port nothing holds, denied like a Ray worker port
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    try:
        denied, allowed = (s.getsockname()[1] for s in listeners)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        done = subprocess.run(
            [sys.executable, "-c", FENCED, str(denied), str(allowed), name, str(free)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": root},
        )
    finally:
        for sock in (*listeners, outside):
            sock.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "bind denied": "EACCES",
        "bind any": "bound",
        "denied": "EACCES",
        "allowed": "connected",
        "mptcp": "EPERM",
        "fastopen": "EPERM",
        "abstract": "EPERM",
        "io_uring": "ENOSYS",
    }


def test_after_a_service_crash_the_terminal_still_enters_the_jobs_namespace_and_leftovers_go(ma_home):
    """kill -9 of the service while a job runs: the namespace lives on with the job's processes
    (nothing of it was the service's), a new service opens the node's terminal inside it, and a
    namespace file a service left mid-launch is removed at the next launch."""
    import signal

    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command
    from tests.fixtures.service_process import start_service

    # what a service killed between make and drop leaves: a job network's files
    left = network.make_job_network(
        ma_home / "netns", "left-by-a-crash", [("worker-0", network.node_address(0))]
    )
    svc = start_service(ma_home)
    job_id = None
    try:
        client = Client(url=svc.url, token=svc.token, timeout=30)
        handle = client.submit(
            name="lives-on",
            command=f"{sys.executable} -c \"import time; print('up', flush=True); time.sleep(600)\"",
            debug_terminal=True,
            grace_period=1,
        )
        job_id = handle.id
        wait_for(lambda: "up" in client.read_log(job_id).data, timeout=120)
        assert not left.switch.exists() and not left.nodes["worker-0"][0].exists()  # swept at the launch
        # and the job's own file dropped once its runner entered
        wait_for(lambda: list((ma_home / "netns").iterdir()) == [], timeout=30)
        svc.proc.send_signal(signal.SIGKILL)
        svc.proc.wait(30)
        svc = start_service(ma_home, tokens=svc.tokens)
        client = Client(url=svc.url, token=svc.token, timeout=30)
        wait_for(lambda: client.get(job_id).status is JobStatus.running, timeout=60)
        output, code = run_command(client.shell(job_id, command=["cat", "/proc/net/dev"]), timeout=60)
        assert code == 0 and "ma0" in output and "eth" not in output, output
        client.stop(job_id)
    finally:
        svc.proc.terminate()
        svc.proc.wait(30)


#: what each node of a 2-node job reports of itself (issue 38 item 1): its addresses as
#: `hostname -I` and `ip -j addr` (MindSpore's own check) see them, what its name resolves to,
#: and the other node's address over TCP, as each end sees it
MACHINE = r"""
import json, os, socket, subprocess, time

rank, master, port = int(os.environ["NODE_RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
seen = {"rank": rank, "master": master}
seen["hostname -I"] = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
links = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True).stdout)
seen["ip addr"] = sorted(a["local"] for l in links for a in l.get("addr_info", []) if a["family"] == "inet")
seen["resolves"] = socket.gethostbyname(socket.gethostname())
if rank == 0:
    server = socket.create_server(("0.0.0.0", port))
    conn, peer = server.accept()
    seen["peer"] = peer[0]
    conn.close()
else:
    end = time.monotonic() + 120
    while True:
        try:
            sock = socket.create_connection((master, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
    seen["from"] = sock.getsockname()[0]
    sock.close()
print("MACHINE " + json.dumps(seen), flush=True)
"""


def _full_logs(client, job_id: str) -> dict[str, str]:
    """Every node's log, whole."""
    return {
        s.node: client.read_log(job_id, node=s.node, limit=4_000_000).data
        for s in client.log_streams(job_id)
        if s.rank is None
    }


def _two_node_job(client, tmp_path, name: str, script: str, timeout: float):
    """A 2-node pytorch-mode job (MASTER_ADDR, MASTER_PORT, NODE_RANK) running ``script`` as it
    is on each node; the job, its nodes' addresses in rank order, and its logs."""
    algo = writable_dir(tmp_path / name)
    (algo / "node.py").write_text(script)
    # a command that is not `python ...` runs as written on every node
    (algo / "node.sh").write_text("exec python /workspace/algorithm/node.py\n")
    job = client.submit(
        name=name,
        mode="pytorch",
        algorithm=str(algo),
        nodes=2,
        command="sh /workspace/algorithm/node.sh",
        grace_period=1,
    ).wait(timeout=timeout, check=False)
    logs = _full_logs(client, job.id)
    assert job.status is JobStatus.succeeded, {n: text[-4000:] for n, text in logs.items()}
    addresses = [node.address for node in sorted(job.nodes, key=lambda n: n.index)]
    return job, addresses, logs


def test_each_node_is_a_machine_with_its_own_address_and_the_master_is_one_of_them(
    ma_module_client, tmp_path
):
    _job, addresses, logs = _two_node_job(ma_module_client, tmp_path, "machines", MACHINE, timeout=180)
    assert len(set(addresses)) == 2 and not any(a.startswith("127.") for a in addresses), addresses
    seen = {}
    for text in logs.values():
        report = json.loads(text.split("MACHINE ", 1)[1].splitlines()[0])
        seen[report["rank"]] = report
    for rank, address in enumerate(addresses):
        # a machine of its own: its address on an interface of its own, and nothing else
        assert seen[rank]["hostname -I"] == [address], seen[rank]
        assert seen[rank]["ip addr"] == sorted(["127.0.0.1", address]), seen[rank]
        assert seen[rank]["resolves"] == address
        # the master is node 0 by its own addresses (how MindSpore's msrun and Ray decide)
        assert seen[rank]["master"] == addresses[0]
    # each reaches the other, and each end sees the other's own address
    assert seen[1]["from"] == seen[0]["peer"] == addresses[1]


#: MindSpore's own example of a 2-node msrun job, on CPU: each worker all-reduces its rank + 1
MSRUN_TRAIN = r"""
import numpy as np
import mindspore as ms
from mindspore import ops
from mindspore.communication import get_group_size, get_rank, init

ms.set_device("CPU")
init()
rank, size = get_rank(), get_group_size()
total = ops.AllReduce()(ms.Tensor(np.array([rank + 1.0], dtype=np.float32)))
print(f"MSRESULT rank={rank} size={size} sum={float(total.asnumpy()[0])}", flush=True)
"""

#: the image interpreter ./dev setup makes for MindSpore (MA_MINDSPORE_IMAGE: another one)
MINDSPORE_IMAGE = os.environ.get(
    "MA_MINDSPORE_IMAGE", os.path.join(os.path.dirname(__file__), "..", "..", ".venv", "images", "mindspore")
)


@pytest.mark.mindspore
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not os.path.exists(os.path.join(MINDSPORE_IMAGE, "bin", "msrun")),
    reason="needs the MindSpore image (./dev setup makes .venv/images/mindspore)",
)
def test_msrun_across_two_nodes_starts_its_scheduler_on_the_master_and_all_reduces(
    ma_module_client, tmp_path
):
    algo = writable_dir(tmp_path / "msrun")
    (algo / "train.py").write_text(MSRUN_TRAIN)
    job = ma_module_client.submit(
        name="msrun",
        mode="pytorch",  # MASTER_ADDR, MASTER_PORT, NODE_RANK; msrun runs as written
        algorithm=str(algo),
        nodes=2,
        image={"venv": os.path.realpath(MINDSPORE_IMAGE)},
        command=(
            "msrun --worker_num=2 --local_worker_num=1 --master_addr=${MASTER_ADDR} "
            "--master_port=${MASTER_PORT} --node_rank=${NODE_RANK} --log_dir=/tmp/msrun "
            "--join=True /workspace/algorithm/train.py"
        ),
        grace_period=1,
    ).wait(timeout=480, check=False)
    logs = _full_logs(ma_module_client, job.id)
    assert job.status is JobStatus.succeeded, {n: text[-4000:] for n, text in logs.items()}
    text = "\n".join(logs.values())
    for rank in (0, 1):
        assert f"MSRESULT rank={rank} size=2 sum=3.0" in text, text[-4000:]


def test_mpiruns_agent_reaches_a_node_on_its_job_network_address_with_the_attempts_secret_only(tmp_path):
    """The rsh agent between two nodes of a job network (each node's abstract names its own): the
    waiting node's server listens on a TCP port of its address; a caller with the attempt's
    secret runs a command there, one without is refused."""
    made = network.make_job_network(
        tmp_path / "netns", "rsh", [(f"worker-{k}", network.node_address(k)) for k in (0, 1)]
    )
    ns = {name: str(path) for name, (path, _) in made.nodes.items()}
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MA_JOB_SECRET": "s3cret", "MA_JOB_ID": "job-1"}
    server = subprocess.Popen(
        ["nsenter", f"--net={ns['worker-1']}", sys.executable, "-m", "ma_jupyter.nodehost.rsh_agent"]
        + ["--serve", "--job", "job-1", "--host", "worker-1", "--port", "2222"],
        env={**env, "NODE_MARK": "on-worker-1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "waiting for mpirun" in server.stdout.readline()
        agent = [
            sys.executable,
            "-m",
            "ma_jupyter.nodehost.rsh_agent",
            "--port=2222",
            network.node_address(1),
        ]

        def call(where: list[str], secret: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [*where, *agent, 'echo "$NODE_MARK"; exit 3'],
                env={**env, "MA_JOB_SECRET": secret, "MA_RSH_CONNECT_TIMEOUT": "2"},
                capture_output=True,
                text=True,
                timeout=60,
            )

        from_peer = call(["nsenter", f"--net={ns['worker-0']}"], "s3cret")
        assert (from_peer.returncode, from_peer.stdout) == (3, "on-worker-1\n"), from_peer.stderr
        refused = call(["nsenter", f"--net={ns['worker-0']}"], "guess")
        assert refused.returncode == 255 and "not a node of this job" in refused.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
        network.remove_job_network(made)
