"""A hostile job on the Ray backend tries to become the cluster (issue 24, item 1).

The reproduction: a job reads ``/proc/net/tcp``, finds the Ray GCS (unauthenticated gRPC),
runs ``ray start --address <GCS>``, then ``ray.init`` and a task that would run with the
raylet's account outside every sandbox and write a file on the host.  Here a job of two nodes
(one on each Ray node) does all of that, and also tries every port listening on its machine over
TCP, Multipath TCP and TCP Fast Open, and an abstract Unix socket of the host: everything must fail, while the
test shows from outside that the targets are real (the GCS answers, the socket listens).  The
fence decides by port at connect time, so Ray's own authentication plays no part.
"""

from __future__ import annotations

import json
import socket

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.helpers import writable_dir
from tests.modes.real import events_text, node_logs

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

PROBE = r"""
import errno, json, os, socket, subprocess, sys

targets = json.load(open("/workspace/algorithm/targets.json"))
me = socket.gethostname()
found = {}

def listening(path):
    ports = set()
    for line in open(path).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports

ports = sorted(listening("/proc/net/tcp") | listening("/proc/net/tcp6"))
found["listening"] = ports
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
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(b"\0" + targets["abstract"].encode())
    found["abstract"] = "connected"
except OSError as exc:
    found["abstract"] = errno.errorcode.get(exc.errno, type(exc).__name__)
sock.close()

def attempt(argv):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

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
found["ray start"] = outcome(start, timeout=5)
print("PROBES " + json.dumps(found), flush=True)
"""


def test_a_job_on_ray_reaches_no_port_of_the_cluster_and_never_runs_as_the_raylet(
    ray_service, ray_cluster, tmp_path
):
    gcs_port = int(ray_cluster.address.rsplit(":", 1)[1])
    # the targets are real: the GCS answers here (outside every job), and so does this socket
    socket.create_connection(("127.0.0.1", gcs_port), timeout=10).close()
    host_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"ma-test-host-socket-{tmp_path.name}"
    host_socket.bind(b"\0" + name.encode())
    host_socket.listen(4)
    outputs = writable_dir(tmp_path / "out")
    marker = str(outputs / "escaped")
    algo = writable_dir(tmp_path / "algo")
    (algo / "probe.py").write_text(PROBE)
    (algo / "targets.json").write_text(
        json.dumps({"gcs": ray_cluster.address, "marker": marker, "abstract": name})
    )
    client = Client(autostart=False)
    try:
        job = client.submit(
            name="escape",
            mode="tensorflow",  # the command as it is, on each node
            nodes=2,
            specs=["cpu.small"],
            algorithm=str(algo),
            outputs=str(outputs),
            command="python /workspace/algorithm/probe.py",
        ).wait(timeout=400)
    finally:
        host_socket.close()
    logs = node_logs(client, job.id)
    assert job.status is JobStatus.succeeded, logs + events_text(client, job.id)
    hosts = {n.host for n in client.get(job.id).nodes}
    assert len(hosts) == 2  # one node on each Ray node
    for node in ("worker-0", "worker-1"):
        log = client.read_log(job.id, node=node).data
        found = json.loads(log.split("PROBES ", 1)[1].splitlines()[0])
        print(node, json.dumps(found, indent=1))
        assert gcs_port in found["listening"]  # the job sees the GCS: the host's network
        assert found[f"tcp {gcs_port}"] == "EACCES"  # and the fence refuses it
        reached = {k: v for k, v in found.items() if v == "connected"}
        assert reached == {}, reached
        assert all(found[f"mptcp {p}"].startswith("socket ") for p in found["listening"])
        assert all(found[f"fastopen {p}"] == "EPERM" for p in found["listening"])
        assert found["abstract"] == "EPERM"
        assert found["ray start"]["code"] != 0, found["ray start"]  # 0: a raylet of the job joined
        assert found["ray.init"]["code"] != 0, found["ray.init"]
        assert "RAN AS" not in found["ray.init"].get("tail", "")
    assert not any(p.name.startswith("escaped") for p in outputs.iterdir())
