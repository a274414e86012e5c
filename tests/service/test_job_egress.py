"""Egress by policy (issue 36, item 5): ``[network] egress`` of ``cluster.toml`` lets a job's
nodes reach exactly the listed destinations, on a real root service with the local backend.

The destination is a network namespace of the test's own, joined to the host by a veth pair the
test owns, with a TCP server on a listed port and on a port that is not listed (and a UDP one on
the listed port).  The service runs in a mount namespace of its own whose ``/etc/hosts`` names
the destination, so a listed host name is resolved by the service as an admin's would be.

1. with ``egress = "none"`` a job reaches nothing, the listed destination included;
2. with the list, a job reaches the listed destination, and stays running, listening on a port
   (the other job of rule 3);
3. with the list, a 2-node job (hostile: it tries everything it can name) still talks between
   its nodes by name, and reaches the listed port by
   address and by the listed name, and nothing else: not a port that is not listed, not the
   host's end of the veth (an address of the machine inside a listed network), not any other
   address of the machine (a real listener of the test, the service's port), not the gate
   itself, not the other running job (each refused: ``Connection refused``), no UDP (``Network is
   unreachable``, at once);
   and the destination sees the connection come from the machine; of more connections at
   once than the gate relays for one user (``egress_relays_per_user``), the ones past the bound
   are reset, and the service log says which bound refused them;
4. the service is killed and started again while the job of rule 2 runs: that job reaches the
   listed destination again (the gate's forwarder is the service's).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
from urllib.parse import urlparse

import psutil
import pytest

from ma_jupyter.models import JobStatus
from ma_jupyter.nodehost import egress, network
from tests.fixtures.egress_destination import Destination
from tests.fixtures.service_process import start_service, stop_services
from tests.helpers import wait_for, writable_dir

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a job's network namespace needs a root service"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(egress.nft_program() is None, reason="the egress gate needs nft (./dev setup)"),
    pytest.mark.timeout(300),
]

#: the destination's name, known only to the service's /etc/hosts
NAME = "mirror.egress.test"
#: ``[network] egress_relays_per_user`` of the module's service (under the 64 of one attempt)
PER_USER = 60

#: what a job tries (stdlib only): prints one JSON line, then, with a port argument, listens
PROBE = r"""
import errno, json, socket, sys, threading, time

targets = json.load(open("/workspace/algorithm/targets.json"))
peer_port = targets.get("peer_port")
if peer_port and socket.gethostname() == "worker-1":  # the job's own nodes still talk
    deadline = time.time() + 120
    while True:
        try:
            sock = socket.create_connection(("worker-0", peer_port), timeout=10)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    sock.sendall(b"hello from worker-1")
    sock.close()
    sys.exit(0)
heard = []
if peer_port:
    peer_server = socket.socket()
    peer_server.bind(("0.0.0.0", peer_port))
    peer_server.listen(1)
    threading.Thread(target=lambda: heard.append(peer_server.accept()[0].recv(64)), daemon=True).start()
found = {}
for host, port in targets["tcp"]:
    sock = socket.socket()
    sock.settimeout(15)
    try:
        sock.connect((host, port))
        found[f"tcp {host}:{port}"] = "connected " + sock.recv(64).decode(errors="replace")
    except OSError as exc:
        found[f"tcp {host}:{port}"] = errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()
for host, port in targets["udp"]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(3)
    try:
        sock.connect((host, port))
        sock.send(b"ping")
        found[f"udp {host}:{port}"] = "reply " + sock.recv(64).decode(errors="replace")
    except OSError as exc:
        found[f"udp {host}:{port}"] = errno.errorcode.get(exc.errno, type(exc).__name__)
    finally:
        sock.close()
if peer_port:
    deadline = time.time() + 120
    while not heard and time.time() < deadline:
        time.sleep(0.1)
    found["peer"] = heard[0].decode() if heard else "nothing"
if targets.get("flood"):  # more connections at once than the gate relays for one attempt
    host, port, count = targets["flood"]
    held, results = [], []
    for _ in range(count):
        try:  # a reset may come before connect() returns (the gate refuses at once)
            sock = socket.create_connection((host, port), timeout=15)
            held.append(sock)
            results.append(sock.recv(4).decode() or "closed")
        except OSError as exc:
            results.append(errno.errorcode.get(exc.errno, type(exc).__name__))
    found["flood"] = {r: results.count(r) for r in results}
    for sock in held:
        sock.close()
print("PROBES " + json.dumps(found), flush=True)
if len(sys.argv) > 1:  # the other job: it listens until told to try its listed destination again
    import os

    server = socket.socket()
    server.bind(("0.0.0.0", int(sys.argv[1])))
    server.listen(8)

    def answer():
        while True:
            conn, _ = server.accept()
            conn.sendall(b"victim-data")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    print("listening", flush=True)
    deadline = time.time() + 600
    while not os.path.exists("/workspace/outputs/again") and time.time() < deadline:
        time.sleep(0.1)
    host, port = targets["tcp"][0]
    deadline = time.time() + 90  # the restarted service opens the gate again as it re-attaches
    while True:
        sock = socket.socket()
        sock.settimeout(15)
        try:
            sock.connect((host, port))
            print("AGAIN connected " + sock.recv(64).decode(errors="replace"), flush=True)
            break
        except OSError as exc:
            if time.time() > deadline:
                print("AGAIN " + errno.errorcode.get(exc.errno, type(exc).__name__), flush=True)
                break
            time.sleep(0.2)
        finally:
            sock.close()
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def dest():
    made = Destination()
    yield made
    made.close()


@pytest.fixture(scope="module")
def egress_service(tmp_path_factory, dest):
    """One root service whose ``cluster.toml`` lists the destination's open port by address and
    by name; its ``/etc/hosts`` (a mount namespace of its own) names the destination.
    ``restart()`` starts another on the same home (the caller ended the first)."""
    base = tmp_path_factory.getbasetemp()
    home = tmp_path_factory.mktemp("egress_home")
    hosts = home / "etc-hosts"
    hosts.write_text(open("/etc/hosts").read() + f"\n{dest.address}\t{NAME}\n")
    _write_policy(home, base, dest, listed=True)
    wrap = ["unshare", "--mount", "--propagation", "private", "--"]
    wrap += ["sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
    services = [start_service(home, env={"MA_JUPYTER_CARDS": "none"}, wrap=wrap)]

    def restart():
        services.append(start_service(home, env={"MA_JUPYTER_CARDS": "none"}, wrap=wrap))
        return services[-1]

    services[0].allowed_root = base  # type: ignore[attr-defined]
    services[0].restart = restart  # type: ignore[attr-defined]
    yield services[0]
    stop_services(services)


def _write_policy(home, base, dest, *, listed: bool) -> None:
    ports = f"{dest.open_port},{dest.hold_port}"
    policy = f'["{dest.address}:{ports}", "{NAME}:{dest.open_port}"]' if listed else '"none"'
    (home / "cluster.toml").write_text(
        f'[mounts]\nallowed_roots = ["{base}"]\n\n[network]\negress = {policy}\n'
        f"egress_relays_per_user = {PER_USER}\n"
    )


def _host_addresses() -> list[str]:
    return sorted(
        {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    )


def _probe_job(
    client, tmp_path, name: str, targets: dict, listen: int | None = None, nodes: int = 1, outputs=None
):
    algo = writable_dir(tmp_path / name)
    (algo / "probe.py").write_text(PROBE)
    (algo / "targets.json").write_text(json.dumps(targets))
    command = "python /workspace/algorithm/probe.py" + (f" {listen}" if listen else "")
    return client.submit(
        name=name,
        algorithm=str(algo),
        command=command,
        access="none",
        grace_period=1,
        nodes=nodes,
        mode="tensorflow",  # the command as it is on each node
        outputs=str(outputs) if outputs else None,
    )


def _probes(client, job_id: str) -> dict:
    log = wait_for(lambda: (text := client.read_log(job_id).data) and "PROBES " in text and text, timeout=180)
    return json.loads(log.split("PROBES ", 1)[1].splitlines()[0])


def test_a_job_reaches_exactly_the_listed_destinations(egress_service, dest, tmp_path):
    from ma_jupyter.client import Client

    client = Client(egress_service.url, egress_service.token)
    home, base = egress_service.home, egress_service.allowed_root
    service_port = urlparse(egress_service.url).port
    listed = (dest.address, dest.open_port)

    # the targets are real: the destination answers from here on both ports, and so does a
    # listener of the test on every address of the machine
    for port in (dest.open_port, dest.closed_port):
        with socket.create_connection((dest.address, port), timeout=10) as sock:
            assert sock.recv(64).startswith(f"dest-{port}".encode())
    host_listener = socket.socket()
    host_listener.bind(("0.0.0.0", 0))
    host_listener.listen(8)
    host_port = host_listener.getsockname()[1]
    socket.create_connection((dest.host_end, host_port), timeout=10).close()
    socket.create_connection(("127.0.0.1", service_port), timeout=10).close()

    # 1. "none": nothing, the listed destination included
    _write_policy(home, base, dest, listed=False)
    closed = _probe_job(client, tmp_path, "closed", {"tcp": [listed], "udp": [listed]})
    assert _probes(client, closed.id) == {
        f"tcp {dest.address}:{dest.open_port}": "ENETUNREACH",
        f"udp {dest.address}:{dest.open_port}": "ENETUNREACH",
    }

    # 2. the list: another job reaches the listed port, then stays, listening
    _write_policy(home, base, dest, listed=True)
    victim_port = random.randrange(20000, 30000)
    victim_out = writable_dir(tmp_path / "victim-out")
    victim = _probe_job(
        client, tmp_path, "victim", {"tcp": [listed], "udp": []}, victim_port, outputs=victim_out
    )
    assert _probes(client, victim.id) == {
        f"tcp {dest.address}:{dest.open_port}": f"connected dest-{dest.open_port} {dest.host_end}"
    }
    wait_for(lambda: "listening" in client.read_log(victim.id).data.split("PROBES", 1)[1], timeout=60)

    # 3. the hostile one: the listed port by address and by name, and nothing else
    tcp = [
        listed,
        (NAME, dest.open_port),
        (dest.address, dest.closed_port),
        (dest.host_end, dest.open_port),
        (dest.host_end, host_port),
        ("127.0.0.1", service_port),
        ("10.254.0.1", victim_port),  # the other job's port, at its address (also this node's)
        (network.EGRESS_GATEWAY, egress.FORWARDER_PORT),
        ("198.51.100.9", dest.open_port),  # an address nobody listed
    ]
    tcp += [(address, port) for address in _host_addresses() for port in (host_port, service_port)]
    peer_port = random.randrange(30000, 40000)
    flood = [dest.address, dest.hold_port, egress.MAX_CONNECTIONS + 6]
    targets = {"tcp": tcp, "udp": [listed], "peer_port": peer_port, "flood": flood}
    prober = _probe_job(client, tmp_path, "open", targets, nodes=2)
    found = _probes(client, prober.id)
    print(json.dumps(found, indent=1))
    assert prober.wait(timeout=120).status is JobStatus.succeeded
    assert found.pop("peer") == "hello from worker-1"  # its nodes still reach each other
    # the gate relays PER_USER connections of a user at once; one more is reset, never queued,
    # and the service log says which bound it met
    assert found.pop("flood") == {"held": PER_USER, "ECONNRESET": egress.MAX_CONNECTIONS + 6 - PER_USER}
    told = (home / "service.log").read_text()
    assert f"refused a connection to {dest.address}:{dest.hold_port}" in told
    assert f"[network] egress_relays_per_user = {PER_USER} allows" in told
    for target in (listed, (NAME, dest.open_port)):
        assert found.pop(f"tcp {target[0]}:{target[1]}") == f"connected dest-{dest.open_port} {dest.host_end}"
    assert set(dest.peers) == {dest.host_end}  # what reached it came from the machine
    # UDP does not go out (at once: no resolver of the job's own waits), other TCP is refused
    assert found.pop(f"udp {dest.address}:{dest.open_port}") == "ENETUNREACH"
    reached = {k: v for k, v in found.items() if v != "ECONNREFUSED"}
    assert reached == {}, reached
    assert len(found) == len(set(tcp)) - 2
    assert client.get(victim.id).status is JobStatus.running  # untouched
    host_listener.close()

    # 4. a service killed and started again while the job runs: its way out opens again
    os.kill(egress_service.proc.pid, signal.SIGKILL)
    egress_service.proc.wait(10)
    service = egress_service.restart()
    client = Client(service.url, service.token)
    wait_for(lambda: client.get(victim.id).status is JobStatus.running, timeout=60)
    (victim_out / "again").write_text("")
    again = wait_for(lambda: "AGAIN" in (log := client.read_log(victim.id).data) and log, timeout=180)
    assert again.split("AGAIN ", 1)[1].splitlines()[0] == f"connected dest-{dest.open_port} {dest.host_end}"
    client.stop(victim.id)


def test_the_service_relays_a_bounded_number_of_connections_in_all(tmp_path, monkeypatch):
    """Two attempts' gates share the service's bound (its descriptors): past it a connection is
    reset, whichever attempt asks; a relay that ends frees its place."""
    if not network.namespaces_supported():
        pytest.skip("job networks need root")
    # a destination of its own: the module's has held and dropped the other test's flood
    dest = Destination()
    monkeypatch.setattr(egress, "max_relays", lambda: 3)
    hold = egress.Destination(
        ipaddress.IPv4Network(f"{dest.address}/32"), ((dest.hold_port, dest.hold_port),)
    )
    gate = egress.Gate((hold,))
    made, forwarders, held = [], [], []
    first_held = len(dest.held)

    def connect(job: network.JobNetwork) -> str:
        def go() -> str:
            network.enter(str(job.nodes["worker-0"][0]))
            try:  # a reset may come before connect() returns (the gate refuses at once)
                sock = socket.create_connection((dest.address, dest.hold_port), timeout=15)
                held.append(sock)
                sock.settimeout(15)
                return sock.recv(4).decode() or "closed"
            except OSError as exc:
                return errno.errorcode.get(exc.errno, type(exc).__name__)

        return network.in_thread(go)

    try:
        for k in range(2):
            job = network.make_job_network(
                tmp_path / "ns", f"a{k}", [("worker-0", network.node_address(0))], gateway=True
            )
            made.append(job)
            forwarders.append(
                egress.Forwarder(egress.open_gate(job.switch, gate), gate, lambda: True, f"a{k}")
            )
        results = [connect(made[0]), connect(made[0]), connect(made[1]), connect(made[1])]
        assert results == ["held", "held", "held", "ECONNRESET"]
        held[0].close()  # one relayed connection ends, both ways
        dest.held[first_held].close()
        wait_for(lambda: connect(made[1]) == "held", timeout=60)
    finally:
        for sock in held:
            sock.close()
        for forwarder in forwarders:
            forwarder.close()
            forwarder.join(10)
        for job in made:
            network.remove_job_network(job)
        dest.close()


def test_a_hostile_job_neither_holds_nor_floods_the_gate(tmp_path, monkeypatch):
    """The bounds of the gate's relays, each met by a job's node as a hostile user would:

    1. an attempt past its own bound, then a user past ``egress_relays_per_user`` with two
       attempts: reset at once, told in the log naming the bound; another user still connects;
    2. a connection that goes silent (the destination said ``held``), and one to a destination
       that accepts and never answers: both reset after ``egress_idle_timeout``, their places
       freed;
    3. a destination that never completes the handshake: the job's connection is reset after
       ``egress_connect_timeout``, told in the log.
    """
    from ma_jupyter.config import EgressBounds

    if not network.namespaces_supported():
        pytest.skip("job networks need root")
    dest = Destination()  # its own: the module's holds the other tests' connections
    dest.blackhole(dest.closed_port)
    monkeypatch.setattr(egress, "MAX_CONNECTIONS", 2)
    here = ipaddress.IPv4Network(f"{dest.address}/32")
    destinations = (egress.Destination(here),)
    shares = EgressBounds(relays_per_user=3)
    short = EgressBounds(idle_timeout=3, connect_timeout=3)
    told: list[str] = []
    made, forwarders, held = [], [], []

    def attempt(key: str, user: str, bounds: EgressBounds) -> network.JobNetwork:
        job = network.make_job_network(
            tmp_path / "ns", key, [("worker-0", network.node_address(0))], gateway=True
        )
        made.append(job)
        gate = egress.Gate(destinations, user=user, bounds=bounds)
        forwarders.append(
            egress.Forwarder(egress.open_gate(job.switch, gate), gate, lambda: True, key, told.append)
        )
        return job

    def connect(job: network.JobNetwork, port: int, send: bytes = b"") -> tuple[str, socket.socket | None]:
        def go() -> tuple[str, socket.socket | None]:
            network.enter(str(job.nodes["worker-0"][0]))
            try:  # a reset may come before connect() returns (the gate refuses at once)
                sock = socket.create_connection((dest.address, port), timeout=15)
            except OSError as exc:
                return errno.errorcode.get(exc.errno, type(exc).__name__), None
            held.append(sock)
            sock.sendall(send)
            return "connected", sock

        return network.in_thread(go)

    def read(sock: socket.socket, timeout: float = 15) -> str:
        sock.settimeout(timeout)
        try:
            return sock.recv(4).decode() or "closed"
        except OSError as exc:
            return errno.errorcode.get(exc.errno, type(exc).__name__)

    try:
        # 1. alice's first attempt holds its two, a third is refused; her second attempt gets
        # one more (three in all), then hers are refused; bob's still connects
        a0, a1, b0 = (
            attempt("a0", "alice", shares),
            attempt("a1", "alice", shares),
            attempt("b0", "bob", shares),
        )
        results = []
        for job in (a0, a0, a0, a1, a1, b0):
            result, sock = connect(job, dest.hold_port)
            results.append(read(sock) if sock else result)
        assert results == ["held", "held", "ECONNRESET", "held", "ECONNRESET", "held"]
        assert any("job attempt a0 of user alice" in t and "the most one attempt may" in t for t in told), (
            told
        )
        assert any(
            "job attempt a1 of user alice" in t and "[network] egress_relays_per_user = 3 allows" in t
            for t in told
        ), told
        assert egress._user_relays == {"alice": 3, "bob": 1}

        # 2. silent ones are reset after the idle timeout, and their places freed
        c0 = attempt("c0", "carol", short)
        _, quiet = connect(c0, dest.hold_port)
        assert quiet is not None and read(quiet) == "held"
        _, asking = connect(c0, dest.silent_port, b"GET / HTTP/1.0\r\n\r\n")
        assert asking is not None
        assert read(quiet, timeout=120) in ("closed", "ECONNRESET")
        assert read(asking, timeout=120) in ("closed", "ECONNRESET")
        wait_for(lambda: "carol" not in egress._user_relays, timeout=60)
        assert any("egress_idle_timeout = 3" in t for t in told), told

        # 3. the handshake that never completes: reset after the connect timeout
        _, hanging = connect(c0, dest.closed_port)
        assert hanging is not None and read(hanging, timeout=120) in ("closed", "ECONNRESET")
        assert any(f"could not reach {dest.address}:{dest.closed_port} within 3 s" in t for t in told), told
    finally:
        for sock in held:
            sock.close()
        for forwarder in forwarders:
            forwarder.close()
            forwarder.join(10)
        for job in made:
            network.remove_job_network(job)
        dest.close()
