"""A Ray attempt's overlay as the agents make it (``nodehost/overlay.py``), without Ray: two
machines' parts made side by side on this machine's loopback, as two Ray nodes of one machine
would have them.  Machine A holds two nodes of the attempt (a worker and its parameter server),
machine B one: each node is a machine of its own (its namespace, its address on ``ma0``, no
other interface), the two nodes of A reach each other through A's switch, and B's node over
the VXLAN segment, each end seeing the other's own address."""

from __future__ import annotations

import fcntl
import os
import socket
import struct

import pytest

from ma_jupyter.nodehost import network, overlay

pytestmark = pytest.mark.skipif(
    overlay.supported() is not None, reason=f"cannot make overlays here: {overlay.supported()}"
)

SIOCGIFADDR = 0x8915


def _free_udp_port() -> int:
    """A port free over TCP and UDP on every address (as the agents reserve them)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("0.0.0.0", 0))
            port = udp.getsockname()[1]
            with socket.socket() as tcp:
                try:
                    tcp.bind(("0.0.0.0", port))
                except OSError:
                    continue
        return port


def _in(path, fn):
    """``fn()`` run on a thread inside the namespace kept at ``path``."""

    def run():
        network.enter(str(path))
        return fn()

    return network.in_thread(run)


def _what_the_node_sees() -> tuple[list[str], str]:
    """Its interfaces and the address of ``ma0``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", b"ma0"))
    return sorted(name for _, name in socket.if_nameindex()), socket.inet_ntoa(answer[20:24])


def test_each_node_of_a_machine_is_its_own_machine_on_the_attempts_overlay(tmp_path):
    a0, a1, b0 = (overlay.overlay_address(k) for k in range(3))
    seg_a = overlay.Segment("127.0.0.1", _free_udp_port(), 101, (a0, a1))
    seg_b = overlay.Segment("127.0.0.1", _free_udp_port(), 202, (b0,))
    made_a = overlay.make(
        tmp_path / "a", "job-0", [("worker-0", a0), ("ps-0", a1)], overlay.Overlay(seg_a, (seg_b,))
    )
    try:
        made_b = overlay.make(tmp_path / "b", "job-0", [("worker-1", b0)], overlay.Overlay(seg_b, (seg_a,)))
    except BaseException:
        network.remove_job_network(made_a)
        raise
    ns = {**{n: p for n, (p, _) in made_a.nodes.items()}, **{n: p for n, (p, _) in made_b.nodes.items()}}
    servers: list[socket.socket] = []
    try:
        seen = {name: _in(path, _what_the_node_sees) for name, path in ns.items()}
        assert seen == {
            "worker-0": (["lo", "ma0"], a0),  # the VXLAN device is the switch's, not the node's
            "ps-0": (["lo", "ma0"], a1),
            "worker-1": (["lo", "ma0"], b0),
        }

        def listen(address):
            def make():
                server = socket.socket()
                server.bind((address, 0))
                server.listen(2)
                server.settimeout(60)
                return server

            return make

        for name, address in (("ps-0", a1), ("worker-1", b0)):
            servers.append(_in(ns[name], listen(address)))

        def from_worker_0():
            for server in servers:
                with socket.create_connection(server.getsockname(), timeout=60) as conn:
                    conn.sendall(b"hello")

        _in(ns["worker-0"], from_worker_0)
        for server in servers:
            conn, peer = server.accept()
            with conn:
                conn.settimeout(60)
                assert (conn.recv(5), peer[0]) == (b"hello", a0)  # worker-0's own address
    finally:
        for server in servers:
            server.close()
        network.remove_job_network(made_a)
        network.remove_job_network(made_b)
    assert not os.listdir(tmp_path / "a") and not os.listdir(tmp_path / "b")


def test_the_service_gives_each_node_its_own_address_and_each_machine_its_nodes_segment():
    from ma_jupyter.backends.ray import overlay_plan
    from ma_jupyter.modes.base import TaskSlot

    hosts = ["ray-a", "ray-b", "ray-a"]  # a worker on each machine, a parameter server beside A's
    addresses = overlay_plan.task_addresses(len(hosts))
    assert addresses == ["10.253.0.1", "10.253.0.2", "10.253.0.3"]
    tasks = [
        TaskSlot(role, index, address=address, ports=(port, port + 1), host=host)
        for (role, index), address, port, host in zip(
            [("worker", 0), ("worker", 1), ("ps", 0)], addresses, (5000, 6000, 7000), hosts, strict=True
        )
    ]
    underlay = {"ray-a": "192.0.2.1", "ray-b": "192.0.2.2"}
    parts = overlay_plan.segments(tasks, underlay.__getitem__)
    assert parts is not None
    a, b = parts["ray-a"], parts["ray-b"]
    assert (a.own.underlay, a.own.port, a.own.addresses) == ("192.0.2.1", 5000, ("10.253.0.1", "10.253.0.3"))
    assert (b.own.underlay, b.own.port, b.own.addresses) == ("192.0.2.2", 6000, ("10.253.0.2",))
    assert a.peers == (b.own,) and b.peers == (a.own,) and a.own.vni != b.own.vni
    # a fenced attempt (the tasks at their Ray nodes' own addresses) has no overlay
    fenced = [TaskSlot("worker", 0, address="192.0.2.1", ports=(1, 2), host="ray-a")]
    assert overlay_plan.segments(fenced, underlay.__getitem__) is None


def test_mpi_gets_sshd_over_the_overlay_where_every_agent_can_run_it_else_the_agent():
    from ma_jupyter.backends.local.backend import LocalBackend
    from ma_jupyter.backends.ray.overlay_plan import remote_shell

    able = {"isolation": "bubblewrap", "sshd": True}
    assert remote_shell([able, able], runs_as_root=False) == LocalBackend.ssh_shell_on_job_network
    agent = LocalBackend.remote_shell_on_job_network
    assert remote_shell([able, able], runs_as_root=True) == agent  # sshd cannot run as root there
    assert remote_shell([able, {**able, "sshd": False}], runs_as_root=False) == agent
    assert remote_shell([able, {**able, "isolation": "symlink"}], runs_as_root=False) == agent


def test_the_node_checks_probe_crosses_an_overlay_and_says_why_when_a_port_cannot_be_opened(tmp_path):
    """A Ray node's network check (``overlay.probe``): two parts of one overlay made on this
    machine, crossed over its own address, and nothing of them left; a UDP port that cannot be
    opened for a device (another socket holds it) is the answer, in words."""
    folder = tmp_path / "probes"
    ports = (_free_udp_port(), _free_udp_port())
    assert overlay.probe(folder, "p", "127.0.0.1", ports) is None
    assert list(folder.iterdir()) == []
    # new ports: a namespace's devices and their sockets go a moment after its last holder
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("0.0.0.0", 0))
        held = taken.getsockname()[1]
        why = overlay.probe(folder, "p", "127.0.0.1", (_free_udp_port(), held))
    assert why is not None and why.startswith("the job's overlay cannot be made: "), why
    assert f"cannot open UDP port {held} of this machine" in why, why
    assert list(folder.iterdir()) == []


def test_a_ray_agents_overlay_check_takes_its_ports_from_the_agents_port_pool(tmp_path):
    """The agent's check (``backends/ray/network_check.py``) as the agent builds it, on its port
    pool: a probe crosses the overlay and hands its two ports back."""
    from ma_jupyter.backends.ray.network_check import OverlayCheck
    from ma_jupyter.nodehost.ports import PortPool

    pool = PortPool()
    check = OverlayCheck(pool, tmp_path / "probes", None)
    check._underlay = "127.0.0.1"
    assert check._probe() is None
    assert pool.reserve_ports(0) == () and not pool._reserved_ports
