"""Egress by policy on the Ray backend (issue 36, item 5): ``[network] egress`` of
``cluster.toml`` lets a job's nodes on Ray reach exactly the listed destinations, through the
gate of their machine's agent (docs/network.md, "Egress by policy").

The destination is a network namespace of the test's own (``tests/fixtures/egress_destination.py``),
joined to the Ray nodes' namespace by a veth pair, with a TCP server on a listed port, on a port
that is not listed, and on the GCS's port number (listed too). The service runs in a mount
namespace of its own whose ``/etc/hosts`` names the destination (the service resolves the
listed name and sends its address with the launch). The policy lists the destination's /30,
which holds the machine's own end of the veth, on a port where a listener of the machine waits.

One hostile job of two nodes (one on each Ray node of the session's cluster) tries, from each
node: the listed port by address and by the listed name (reached; the destination sees the
machine's address), a port that is not listed, the listed GCS port number at the destination,
the machine's own address on the listed port of its listener and on the GCS's port: each
refused (``Connection refused``). Then it fails on a refused connection, and its events carry
the one line saying its network is limited and how an admin opens it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from ma_jupyter.nodehost import egress
from tests.fixtures.egress_destination import Destination
from tests.fixtures.real_jobs import events_text, node_logs
from tests.fixtures.service_process import start_service, stop_services
from tests.helpers import writable_dir

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0, reason="a job's overlay and its gate need root agents"),
    pytest.mark.skipif(egress.nft_program() is None, reason="the egress gate needs nft (./dev setup)"),
]

#: the destination's name, known only to the service's /etc/hosts
NAME = "mirror.ray-egress.test"

PROBE = r"""
import errno, json, socket

targets = json.load(open("/workspace/algorithm/targets.json"))
found = {}
for what, (host, port) in targets.items():
    sock = socket.socket()
    sock.settimeout(30)
    try:
        sock.connect((host, port))
        found[what] = "connected " + sock.recv(64).decode(errors="replace")
    except OSError as exc:
        found[what] = errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()
print("PROBES " + json.dumps(found), flush=True)
# worker-1 fails only once worker-0 has printed its probes: a node that ends the job first would
# have the other stopped before it printed (worker-0 answers on its own TF port, over the overlay)
import os, time
tf_config = json.loads(os.environ["TF_CONFIG"])
first, first_port = tf_config["cluster"]["worker"][0].rsplit(":", 1)
if tf_config["task"]["index"] == 0:
    server = socket.create_server(("0.0.0.0", int(first_port)))
    server.settimeout(300)
    server.accept()[0].close()
    raise SystemExit(0)
deadline = time.monotonic() + 300
while True:
    try:
        socket.create_connection((first, int(first_port)), timeout=10).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
# what a job that expected the network does next: fail on a refused connection
host, port = targets["unlisted port"]
socket.create_connection((host, port), timeout=30)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_job_on_ray_reaches_exactly_the_listed_destinations_through_its_agents_gate(
    ray_home, ray_cluster, tmp_path
):
    gcs_port = int(ray_cluster.address.rsplit(":", 1)[1])
    dest = Destination(also=(gcs_port,))
    machine = socket.socket()  # a listener of the machine (the Ray nodes' and the service's)
    machine.bind(("0.0.0.0", 0))
    machine.listen(8)
    services = []
    try:
        listener_port = machine.getsockname()[1]
        # both are real targets, seen from outside the job
        socket.create_connection((dest.host_end, listener_port), timeout=10).close()
        with socket.create_connection((dest.address, gcs_port), timeout=10) as sock:
            assert sock.recv(64).decode().startswith(f"dest-{gcs_port} ")
        both = ipaddress.IPv4Network(f"{dest.address}/30", strict=False)  # the machine's end too
        policy = [f"{both}:{dest.open_port},{gcs_port},{listener_port}", f"{NAME}:{dest.open_port}"]
        toml = ray_home / "cluster.toml"
        toml.write_text(toml.read_text() + f"\n[network]\negress = {json.dumps(policy)}\n")
        hosts = tmp_path / "etc-hosts"
        hosts.write_text(open("/etc/hosts").read() + f"\n{dest.address}\t{NAME}\n")
        wrap = ["unshare", "--mount", "--propagation", "private", "--"]
        wrap += ["sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
        services.append(start_service(ray_home, timeout=120, wrap=wrap))
        client = Client(services[0].url, services[0].token)

        targets = {
            "listed by address": (dest.address, dest.open_port),
            "listed by name": (NAME, dest.open_port),
            "unlisted port": (dest.address, dest.closed_port),
            "the GCS port elsewhere": (dest.address, gcs_port),
            "the machine's listener": (dest.host_end, listener_port),
            "the machine's GCS": (dest.host_end, gcs_port),
        }
        algo = writable_dir(tmp_path / "algo")
        (algo / "probe.py").write_text(PROBE)
        (algo / "targets.json").write_text(json.dumps(targets))
        job = client.submit(
            name="egress",
            mode="tensorflow",  # the command as it is, on each node
            nodes=2,
            specs=["cpu.small"],
            algorithm=str(algo),
            outputs=str(writable_dir(tmp_path / "out")),
            command="python /workspace/algorithm/probe.py",
        ).wait(timeout=400, check=False)
        logs = node_logs(client, job.id)
        events = events_text(client, job.id)
        assert job.status is JobStatus.error, logs + events
        assert len({n.host for n in job.nodes}) == 2, job.nodes  # one node on each Ray node
        assert all(n.address.startswith("10.253.") for n in job.nodes), job.nodes  # on the overlay
        for node in ("worker-0", "worker-1"):
            log = client.read_log(job.id, node=node).data
            assert "PROBES " in log, logs + events
            found = json.loads(log.split("PROBES ", 1)[1].splitlines()[0])
            # reached, from the machine (the agent's forwarder connects from its network)
            assert found["listed by address"] == f"connected dest-{dest.open_port} {dest.host_end}", found
            assert found["listed by name"] == f"connected dest-{dest.open_port} {dest.host_end}", found
            refused = {k: v for k, v in found.items() if not k.startswith("listed")}
            assert refused == dict.fromkeys(refused, "ECONNREFUSED"), found
        # the one line a job failing on the network gets (item 5's hint), on Ray too
        assert "the job's network is limited (ConnectionRefusedError" in events, events
        assert "[network] egress" in events, events
    finally:
        if services:
            stop_services(services)
        machine.close()
        dest.close()
