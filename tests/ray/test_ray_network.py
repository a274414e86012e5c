"""A hostile job on the Ray backend tries to become the cluster and to reach other jobs (issue 24, item 1).

The reproduction: a job reads ``/proc/net/tcp``, finds the Ray GCS (unauthenticated gRPC),
runs ``ray start --address <GCS>``, then ``ray.init`` and a task that would run with the
raylet's account outside every sandbox and write a file on the host.  Here a job of two nodes
(one on each Ray node) does all of that, and also tries every port listening on its machine,
another user's job that starts listening after it (TCP and UDP) and an abstract Unix socket of
the host: everything must fail, while the test shows from outside that the targets are real (the
GCS answers, the socket listens, the other job's ports answer on its own side), and the job's
two nodes still reach each other by name.

Twice: with each attempt in namespaces of its own joined by its overlay (the default, where the
agents can make them), and fenced (``[backend] network = "fence"``), where the rule is by port
at connect time; neither depends on Ray's own authentication.  Last, what the overlay gives a
job: ssh between its nodes on two machines, and seed 003's mpirun over it.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from ma_jupyter.nodeside.ssh_node import SSHD
from tests.fixtures.ray_service import serve
from tests.fixtures.real_jobs import events_text, node_logs
from tests.helpers import writable_dir
from tests.ray.two_hosts import A, B

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

PROBE = r"""
import errno, json, os, socket, subprocess, sys

import time

targets = json.load(open("/workspace/algorithm/targets.json"))
me = socket.gethostname()
found = {}
if targets.get("go"):  # the test says when the other job listens, and what
    deadline = time.monotonic() + 300
    while not os.path.exists(targets["go"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    targets.update(json.load(open(targets["go"])))

# the job's own two nodes still reach each other by name (first: the listener is closed
# before the scan below, which on a fenced job's shared network would find it)
PEER_PORT = 47123
if me == "worker-0":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", PEER_PORT))
    server.listen(1)
    server.settimeout(120)
    try:
        conn, _ = server.accept()
        server.close()  # closed before the peer scans (it waits for the answer)
        conn.settimeout(60)
        found["peer"] = conn.recv(100).decode()
        conn.sendall(b"closed")
        conn.close()
    except OSError as exc:
        found["peer"] = "nothing: " + str(exc)
    server.close()
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            with socket.create_connection(("worker-0", PEER_PORT), timeout=5) as conn:
                conn.settimeout(60)
                conn.sendall(b"hello from " + me.encode())
                found["peer"] = "sent" if conn.recv(100) == b"closed" else "no answer"
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                found["peer"] = "cannot: " + str(exc)
                break
            time.sleep(0.2)

def listening(path):
    ports = set()
    for line in open(path).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports

found["listening"] = sorted(listening("/proc/net/tcp") | listening("/proc/net/tcp6"))
# what listens on the machine, as seen from outside the job (an attacker would scan for it)
ports = sorted(set(found["listening"]) | set(targets.get("host_ports", [])))
for port in ports:
    for proto, name in ((0, "tcp"), (262, "mptcp")):
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
        except OSError as exc:
            found[f"{name} {port}"] = "socket " + errno.errorcode.get(exc.errno, str(exc))
            continue
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", port))
            found[f"{name} {port}"] = "connected"
        except OSError as exc:
            found[f"{name} {port}"] = errno.errorcode.get(exc.errno, type(exc).__name__)
        finally:
            sock.close()
    sock = socket.socket()
    try:  # TCP Fast Open: the connect made by the first send
        sock.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", port))
        found[f"fastopen {port}"] = "connected"
    except OSError as exc:
        found[f"fastopen {port}"] = errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()
def tcp(address, port):
    sock = socket.socket()
    sock.settimeout(5)
    try:
        sock.connect((address, port))
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()

def udp(address, port, data=b"x", times=1):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(times):
            sock.sendto(data, (address, port))
        return "sent"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()

# the machines' own addresses (two-host tests): TCP to the GCS, a datagram to its port
for address in targets.get("machines", []):
    gcs_port = int(targets["gcs"].rsplit(":", 1)[1])
    found[f"tcp {address}:{gcs_port}"] = tcp(address, gcs_port)
    found[f"udp {address}"] = udp(address, gcs_port)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(b"\0" + targets["abstract"].encode())
    found["abstract"] = "connected"
except OSError as exc:
    found["abstract"] = errno.errorcode.get(exc.errno, type(exc).__name__)
sock.close()
found["unix lists the host's socket"] = targets["abstract"] in open("/proc/net/unix").read()

victim = targets.get("victim")
if victim:  # another user's job that started listening after this job's nodes
    for address in ("127.0.0.1", "10.253.0.1", "10.253.0.2"):
        found[f"victim tcp {address}"] = tcp(address, victim)
        udp(address, victim, b"from the attacker " + me.encode(), times=3)

# an attacker gives up on an unreachable GCS after 10 s rather than Ray's 60 (a reachable one
# answers at once): the test then waits seconds, not a minute, for the refusal
IMPATIENT = {**os.environ, "RAY_gcs_rpc_server_reconnect_timeout_s": "10",
             "RAY_gcs_server_port_wait_time_s": "2"}

def attempt(argv):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=IMPATIENT)

def outcome(proc, timeout=60):
    # each would succeed within seconds where the GCS answered; both run at once
    try:
        out, _ = proc.communicate(timeout=timeout)
        return {"code": proc.returncode, "tail": out[-600:]}
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"code": "timed out"}

gcs = targets["gcs"]
start = attempt(
    [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())",
     "start", "--address", gcs, "--num-cpus", "1", "--disable-usage-stats"]
)
escape = f'''
import os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address={gcs!r})
# a real node of the cluster (they have NPU), not one a raylet of the job may have added
real = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "NPU" in n["Resources"]]
@ray.remote(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(real[0], soft=False))
def as_the_raylet():
    open({targets["marker"]!r} + "-{me}", "w").write(str(os.getuid()))
    return os.getuid()
print("RAN AS", ray.get(as_the_raylet.remote(), timeout=60), flush=True)
'''
init = attempt([sys.executable, "-c", escape])
found["ray.init"] = outcome(init)
found["ray start"] = outcome(start)
print("PROBES " + json.dumps(found), flush=True)
"""


VICTIM = r"""
import json, os, socket, threading, time

tcp = socket.socket()
tcp.bind(("0.0.0.0", 0))
tcp.listen(8)
port = tcp.getsockname()[1]
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", port))

def accept():
    while True:
        conn, peer = tcp.accept()
        print("RECEIVED a connection from", peer, flush=True)
        conn.close()

def receive():
    while True:
        data, peer = udp.recvfrom(200)
        print("RECEIVED", data, "from", peer, flush=True)

threading.Thread(target=accept, daemon=True).start()
threading.Thread(target=receive, daemon=True).start()
with open("/workspace/outputs/victim.tmp", "w") as fh:
    json.dump({"port": port}, fh)
os.rename("/workspace/outputs/victim.tmp", "/workspace/outputs/victim.json")
print("LISTENING on", port, flush=True)
deadline = time.monotonic() + 400
while not os.path.exists("/workspace/outputs/done") and time.monotonic() < deadline:
    time.sleep(0.2)
print("DONE", flush=True)
"""


def _host_ports() -> list[int]:
    """The TCP ports listening on this machine (the test's network namespace: the Ray nodes')."""
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(path).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _wait_for(path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def _probe_job(client, gcs: str, tmp_path, name: str, *, go=None, machines=()):
    """Submit the probing job (two nodes, one per Ray node); its handle, outputs and targets."""
    outputs = writable_dir(tmp_path / "out")
    marker = str(outputs / "escaped")
    algo = writable_dir(tmp_path / "algo")
    (algo / "probe.py").write_text(PROBE)
    (algo / "targets.json").write_text(
        json.dumps(
            {
                "gcs": gcs,
                "machines": list(machines),
                "marker": marker,
                "abstract": name,
                "host_ports": _host_ports(),
                "go": f"/workspace/outputs/{go.name}" if go else None,
            }
        )
    )
    handle = client.submit(
        name="escape",
        mode="tensorflow",  # the command as it is, on each node
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algo),
        outputs=str(outputs),
        command="python /workspace/algorithm/probe.py",
    )
    return handle, outputs


def _probes(client, job) -> dict[str, dict]:
    found = {}
    for node in ("worker-0", "worker-1"):
        log = client.read_log(job.id, node=node).data
        found[node] = json.loads(log.split("PROBES ", 1)[1].splitlines()[0])
        print(node, json.dumps(found[node], indent=1))
    return found


def _host_socket(tmp_path) -> tuple[socket.socket, str]:
    host_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"ma-test-host-socket-{tmp_path.name}"
    host_socket.bind(b"\0" + name.encode())
    host_socket.listen(4)
    return host_socket, name


def _assert_not_the_cluster(found: dict, gcs_port: int) -> None:
    """What holds on either network: nothing of the machine or the cluster answered, nothing ran
    as the raylet, and the job's two nodes talked."""
    reached = {k: v for k, v in found.items() if v == "connected"}
    assert reached == {}, reached
    assert found["ray start"]["code"] != 0, found["ray start"]  # 0: a raylet of the job joined
    assert found["ray.init"]["code"] != 0, found["ray.init"]
    assert "RAN AS" not in found["ray.init"].get("tail", "")
    assert found["peer"] in ("sent", "hello from worker-1"), found["peer"]


def test_a_job_on_ray_in_its_own_namespaces_reaches_nothing_but_its_own_nodes(
    ray_service, ray_cluster, tmp_path
):
    """The default network: each machine's part of the attempt in a namespace of its own."""
    gcs_port = int(ray_cluster.address.rsplit(":", 1)[1])
    socket.create_connection(("127.0.0.1", gcs_port), timeout=10).close()  # the GCS is real
    host_socket, name = _host_socket(tmp_path)
    client = Client(autostart=False)
    go = tmp_path / "out" / "go.json"
    try:
        handle, outputs = _probe_job(client, ray_cluster.address, tmp_path, name, go=go)
        deadline = time.monotonic() + 240
        while client.get(handle.id).status is not JobStatus.running:
            assert time.monotonic() < deadline, events_text(client, handle.id)
            time.sleep(0.2)
        # another job starts listening after the probing job's nodes started (TCP and UDP)
        victim_out = writable_dir(tmp_path / "victim-out")
        victim_algo = writable_dir(tmp_path / "victim")
        (victim_algo / "victim.py").write_text(VICTIM)
        victim = client.submit(
            name="victim",
            specs=["cpu.small"],
            algorithm=str(victim_algo),
            outputs=str(victim_out),
            command="python /workspace/algorithm/victim.py",
            access="none",
        )
        _wait_for(victim_out / "victim.json")
        port = json.loads((victim_out / "victim.json").read_text())["port"]
        go.write_text(json.dumps({"victim": port}))
        job = handle.wait(timeout=400, check=False)
    finally:
        host_socket.close()
    (victim_out / "done").write_text("")
    victim_job = victim.wait(timeout=120, check=False)
    logs = node_logs(client, job.id)
    assert job.status is JobStatus.succeeded, logs + events_text(client, job.id)
    assert len({n.host for n in client.get(job.id).nodes}) == 2  # one node on each Ray node
    victim_log = client.read_log(victim_job.id, node="worker-0").data
    assert f"LISTENING on {port}" in victim_log and "DONE" in victim_log, victim_log
    assert "RECEIVED" not in victim_log, victim_log  # neither a connection nor a datagram
    for found in _probes(client, job).values():
        assert gcs_port not in found["listening"]  # nothing of the machine's network is there
        assert found[f"tcp {gcs_port}"] == "ECONNREFUSED"
        assert found["abstract"] == "ECONNREFUSED"  # the host's abstract names are not its own
        assert not found["unix lists the host's socket"]
        assert all(found[f"victim tcp {a}"] != "connected" for a in ("127.0.0.1", "10.253.0.1", "10.253.0.2"))
        _assert_not_the_cluster(found, gcs_port)
    assert not any(p.name.startswith("escaped") for p in outputs.iterdir())


@pytest.fixture
def fenced_service(ray_home):
    """A service whose Ray jobs are fenced rather than in namespaces (``network = "fence"``)."""
    toml = ray_home / "cluster.toml"
    toml.write_text(toml.read_text() + 'network = "fence"\n')
    yield from serve(ray_home)


def test_a_fenced_job_on_ray_reaches_no_port_of_the_cluster_and_never_runs_as_the_raylet(
    fenced_service, ray_cluster, tmp_path
):
    """The fence: the job shares its machine's network, every port of the cluster refused."""
    gcs_port = int(ray_cluster.address.rsplit(":", 1)[1])
    socket.create_connection(("127.0.0.1", gcs_port), timeout=10).close()
    host_socket, name = _host_socket(tmp_path)
    client = Client(autostart=False)
    try:
        handle, outputs = _probe_job(client, ray_cluster.address, tmp_path, name)
        job = handle.wait(timeout=400, check=False)
    finally:
        host_socket.close()
    logs = node_logs(client, job.id)
    assert job.status is JobStatus.succeeded, logs + events_text(client, job.id)
    assert len({n.host for n in client.get(job.id).nodes}) == 2
    for found in _probes(client, job).values():
        assert gcs_port in found["listening"]  # the job sees the GCS: the host's network
        assert found[f"tcp {gcs_port}"] == "EACCES"  # and the fence refuses it
        assert all(found[f"mptcp {p}"].startswith("socket ") for p in found["listening"])
        assert all(found[f"fastopen {p}"] == "EPERM" for p in found["listening"])
        assert found["abstract"] == "EPERM"  # listed (the host's network), but refused
        _assert_not_the_cluster(found, gcs_port)
    assert not any(p.name.startswith("escaped") for p in outputs.iterdir())


def test_a_job_across_two_machines_reaches_neither_machine_and_its_nodes_talk_over_the_overlay(
    two_hosts,  # noqa: F811
    service_on,  # noqa: F811
    tmp_path,
):
    """``test_ray_lost_host.py``'s two hosts (A 10.77.0.1 with the GCS, B 10.77.0.2, joined by a
    veth pair): the job's overlay runs over that link, one node on each; neither machine's
    address is reachable from inside, over TCP (the GCS) or UDP."""
    service_on()
    port = two_hosts.port
    socket.create_connection((A, port), timeout=10).close()  # the GCS answers from outside
    host_socket, name = _host_socket(tmp_path)
    client = Client(autostart=False)
    try:
        handle, outputs = _probe_job(client, f"{A}:{port}", tmp_path, name, machines=(A, B))
        job = handle.wait(timeout=400, check=False)
    finally:
        host_socket.close()
    assert job.status is JobStatus.succeeded, node_logs(client, job.id) + events_text(client, job.id)
    assert {n.host for n in client.get(job.id).nodes} == {n.name for n in client.nodes()}  # A and B
    for found in _probes(client, job).values():
        for address in (A, B):
            assert found[f"tcp {address}:{port}"] == "ENETUNREACH", found  # no route out of the job
            assert found[f"udp {address}"] == "ENETUNREACH", found
        _assert_not_the_cluster(found, port)
    assert not any(p.name.startswith("escaped") for p in outputs.iterdir())


#: seed 003's launch command as written (its ``-tune`` file and argument variables too), over
#: ssh, after worker-0 looked at worker-1 through ssh; in ``bash -c``, whose shell splits the
#: several words each argument variable holds
SEED_003_OVER_SSH = (
    'bash -c \'ssh worker-1 "hostname; hostname -I" > /workspace/outputs/remote.txt && '
    "hostname -I > /workspace/outputs/local.txt && "
    'mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH} -mca plm_rsh_args "-p ${SSHD_PORT}" '
    "-tune ${TUNE_ENV_FILE} ${OPENMPI_BIND_ARGS} ${OPENMPI_X_ARGS} ${OPENMPI_MCA_ARGS} "
    "${OPENMPI_EXTRA_ARGS} python /workspace/algorithm/allreduce.py'"
)

ALLREDUCE = """
import json, socket
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


@pytest.mark.mpi
@pytest.mark.ssh
@pytest.mark.skipif(not os.access(SSHD, os.X_OK), reason="needs Debian's openssh-server (./dev setup)")
def test_seed_003s_mpirun_runs_over_ssh_between_nodes_on_two_machines_of_the_overlay(
    two_hosts,  # noqa: F811
    service_on,  # noqa: F811
    tmp_path,
):
    """``--mode horovod`` on Ray (issue 37 items 1 and 8): every node runs its sshd on
    ``SSHD_PORT`` at its own overlay address, and seed 003's mpirun, pasted as written, starts
    mpi4py ranks on both machines over ssh."""
    service_on()
    client = Client(autostart=False)
    outputs = writable_dir(tmp_path / "out")
    algo = writable_dir(tmp_path / "algo")
    (algo / "allreduce.py").write_text(ALLREDUCE)
    job = client.submit(
        name="mpi-ssh",
        mode="horovod",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algo),
        outputs=str(outputs),
        command=SEED_003_OVER_SSH,
    ).wait(timeout=400, check=False)
    assert job.status is JobStatus.succeeded, node_logs(client, job.id) + events_text(client, job.id)
    assert {n.host for n in job.nodes} == {n.name for n in client.nodes()}  # one node on A, one on B
    addresses = {n.name: n.address for n in job.nodes}
    assert addresses == {"worker-0": "10.253.0.1", "worker-1": "10.253.0.2"}
    # `ssh worker-1` reached worker-1, without a prompt, and each node holds its own address
    assert (outputs / "remote.txt").read_text().split() == ["worker-1", addresses["worker-1"]]
    assert (outputs / "local.txt").read_text().split() == [addresses["worker-0"]]
    # one rank per node (slots=1 on a CPU spec), started on B by mpirun over ssh
    result = json.loads((outputs / "result.json").read_text())
    assert result == {"size": 2, "sum": 3, "hosts": ["worker-0", "worker-1"]}
