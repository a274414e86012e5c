"""A dev environment on the Ray backend: a notebook kernel in a 2-node job's ``worker-1``, reached
through the relay of the Ray node's agent (``backends/ray/kernel_relay.py``).

On Ray the bridge always goes through the relay, whether or not this machine sees the node's
folder: the test cluster's Ray nodes are this machine, so this test exercises the very path a
remote Ray node takes (TCP to the node's address, the relay's secret, the kernel's sockets opened
there as untrusted files), and can also plant files in the kernel folder as the job would.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient, KernelManager

from ma_jupyter import kernel_access
from ma_jupyter.client import Client
from ma_jupyter.client.kernelspec import install_devenv_kernel
from ma_jupyter.models import JobStatus
from tests.helpers import writable_dir
from tests.ray.two_hosts import B

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

#: what the job's own code tries (in its kernel): find the relay's secret in what it sees (its
#: variables, its kernel folder), and guess at the relay
JOB_PROBE = """
import errno, json, os, socket
seen = ' '.join(f'{k}={v}' for k, v in os.environ.items())
for name in os.listdir('/run/ma_jupyter/kernel'):
    path = os.path.join('/run/ma_jupyter/kernel', name)
    if os.path.isfile(path) and not os.path.islink(path):
        seen += open(path, errors='replace').read()
try:
    conn = socket.create_connection((HOST, PORT), timeout=10)
    print('relay connected')
    conn.sendall(json.dumps({"secret": "0" * 64, "channel": "k-1"}).encode() + b"\\n")
    conn.settimeout(30)
    print('relay answered', repr(conn.recv(100)))
except TimeoutError:
    print('relay unreachable timeout')
except OSError as exc:
    print('relay unreachable', errno.errorcode.get(exc.errno, exc.errno))
print('seen', seen)
"""
#: executions of ``1+1`` timed each way (direct ``ipc`` and through the bridge and the relay)
ROUND_TRIPS = 50


def _answer(host: str, port: int, first: bytes) -> bytes:
    """What a client that connects to the relay and sends ``first`` gets, up to the first byte
    of a proven channel (the relay then carries the kernel's bytes) or the relay's close."""
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(first)
        got = b""
        while True:
            data = conn.recv(4096)
            if not data or data.startswith(kernel_access.READY):
                return got + data[:1]
            got += data


def _relays(ray_driver) -> list[dict]:
    """The kernel relays every agent of the cluster holds open."""
    found = []
    for node in ray_driver.nodes():
        if node["Alive"]:
            agent = ray_driver.get_actor(f"agent-{node['NodeID']}", namespace="ma_jupyter")
            found += ray_driver.get(agent.kernel_relays.remote(), timeout=30)
    return found


def _round_trips(kernel) -> list[float]:
    """Seconds from each ``execute_request`` of ``1+1`` to its reply."""
    times = []
    for i in range(ROUND_TRIPS + 5):
        started = time.perf_counter()
        msg_id = kernel.execute("1+1", silent=False)
        while True:
            reply = kernel.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if i >= 5:  # the first ones warm up both ends
            times.append(time.perf_counter() - started)
        assert reply["content"]["status"] == "ok"
    return times


@pytest.fixture
def short_dir():
    """A folder with a short path (a unix socket's path has room for 107 bytes, less than a
    test's ``tmp_path`` leaves), removed after the test."""
    folder = Path(tempfile.mkdtemp(prefix="ma-t-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_kernel_runs_in_the_ray_jobs_node_through_the_relay(
    ray_service, ray_driver, tmp_path, monkeypatch, short_dir
):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    client = Client(autostart=False)
    data = tmp_path / "data"
    data.mkdir()
    (data / "only-here.txt").write_text("ray dataset")
    outputs = writable_dir(tmp_path / "out")
    source = client.submit(
        name="raytrain",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        command="sleep 600",
        datasets=[{"name": "corpus", "path": str(data)}],
        outputs=str(outputs),
        env={"GREETING": "hi-ray"},
    )
    made = client.create_devenv(source.id, 1)
    job = made.info
    deadline = time.monotonic() + 180
    while job.status is not JobStatus.running:
        assert time.monotonic() < deadline and not job.status.is_terminal(), job.reason
        job = client.wait_status(made.id, since=job.status, wait=10)
    assert job.backend == "ray"

    # the owner's authorised call names the relay on the Ray node, with its secret
    route = client.kernel_route(made.id)
    assert route.folder is None and route.relay is not None
    host, port, secret = route.relay.host, route.relay.port, route.relay.secret
    assert [(r["job_id"], r["port"]) for r in _relays(ray_driver)] == [(made.id, port)]
    where = client.local_log_file(made.id, "worker-0")
    assert where is not None  # the test cluster's Ray nodes are this machine: the job's folder is here
    kernel_folder = Path(where.root) / "nodes" / "worker-0" / "kernel"

    # strangers get nothing: no proof, a wrong one, no line at all
    for first in (
        kernel_access.hello("0" * len(secret), channel="k-1"),
        kernel_access.hello(secret[:-1], channel="k-1"),
        kernel_access.hello("0" * len(secret), connection={"key": "theirs"}),
        b'{"channel": "k-1"}\n',
        b"GET / HTTP/1.1\r\n\r\n",
    ):
        assert _answer(host, port, first) == b""
    assert not (kernel_folder / kernel_access.CONNECTION_FILE).exists()  # nothing was written

    # the job plants a link to another socket of this machine (and a file) where the kernel's
    # sockets go, before the kernel made them: the relay refuses, and the other socket is never reached
    decoy_path = short_dir / "other.sock"
    decoy = socket.socket(socket.AF_UNIX)
    decoy.bind(str(decoy_path))
    decoy.listen(4)
    decoy.settimeout(0.5)
    (kernel_folder / "k-3").symlink_to(decoy_path)
    (kernel_folder / "k-4").write_text("not a socket")
    try:
        for name in ("k-3", "k-4"):
            answer = _answer(host, port, kernel_access.hello(secret, channel=name))
            assert answer.startswith(kernel_access.REFUSED) and b"not the kernel's socket" in answer
        with pytest.raises(TimeoutError):
            decoy.accept()
    finally:
        (kernel_folder / "k-3").unlink()
        (kernel_folder / "k-4").unlink()

    name, _ = install_devenv_kernel(client.get(source.id), "worker-1", made.info)
    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    kernel = manager.client()
    kernel.start_channels()
    direct = None
    short = None
    try:
        kernel.wait_for_ready(timeout=300)
        out: list[str] = []
        reply = kernel.execute_interactive(
            "import os\n"
            "print(open('/workspace/dataset/private/corpus/only-here.txt').read(), os.environ['GREETING'], os.environ['RANK'])\n"
            "open('/workspace/outputs/ray-kernel.txt', 'w').write('ok')\n",
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", out
        assert "".join(out) == "ray dataset hi-ray 1\n"
        assert (outputs / "ray-kernel.txt").read_text() == "ok"
        assert client.kernel_route(made.id).relay == route.relay  # the same relay while it lives

        # the job itself (its kernel's code) finds no secret in what it sees, and its guess at
        # the relay's address cannot even connect: the job's nodes run in a network namespace
        # of their own (the Ray job network), where nothing of the machine's network is
        # reachable, the Ray node's address and the relay's port included
        out = []
        reply = kernel.execute_interactive(
            f"HOST, PORT = {host!r}, {port}\n{JOB_PROBE}",
            timeout=90,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        text = "".join(out)
        assert reply["content"]["status"] == "ok", text
        assert "relay connected" not in text and "relay answered" not in text, text[:2000]
        unreachable = (
            "relay unreachable ECONNREFUSED",
            "relay unreachable ENETUNREACH",
            "relay unreachable EHOSTUNREACH",
            "relay unreachable timeout",
        )
        assert any(reason in text for reason in unreachable), text[:2000]
        assert secret not in text and "seen " in text

        # the cost of the relay: execute_request round trips through it against the kernel's
        # own ipc sockets (this machine sees them; a short link keeps the paths short)
        short = short_dir / "k"
        short.symlink_to(kernel_folder)
        info = manager.get_connection_info()
        direct = BlockingKernelClient()
        direct.load_connection_info(
            {
                **kernel_access.CHANNEL_PORTS,
                "transport": "ipc",
                "ip": f"{short}/k",
                "key": info["key"].decode() if isinstance(info["key"], bytes) else info["key"],
                "signature_scheme": info["signature_scheme"],
            }
        )
        direct.start_channels()
        through_relay = _round_trips(kernel)
        through_ipc = _round_trips(direct)
        relayed, local = statistics.median(through_relay), statistics.median(through_ipc)
        print(
            f"execute_request round trip, median of {ROUND_TRIPS}: through the bridge and the relay "
            f"{relayed * 1e3:.2f} ms, the kernel's own ipc {local * 1e3:.2f} ms, ratio {relayed / local:.2f}",
            file=sys.stderr,
        )
        direct.stop_channels()
        direct = None

        # the job (its kernel's code) swaps a socket the relay reached for a link to the decoy:
        # the relay keeps the socket it found, so a new connection still reaches the kernel
        reply = kernel.execute_interactive(
            "import os\nos.rename('/run/ma_jupyter/kernel/k-2', '/run/ma_jupyter/kernel/k-2.moved')\n"
            f"os.symlink({str(decoy_path)!r}, '/run/ma_jupyter/kernel/k-2')\n",
            timeout=60,
        )
        assert reply["content"]["status"] == "ok"
        assert _answer(host, port, kernel_access.hello(secret, channel="k-2")) == kernel_access.READY
        with pytest.raises(TimeoutError):
            decoy.accept()

        # stopping the dev environment ends its relay: listener, connections, threads
        held = socket.create_connection((host, port), timeout=30)
        held.sendall(kernel_access.hello(secret, channel="k-1"))
        assert held.recv(1) == kernel_access.READY
        client.stop(made.id)
        deadline = time.monotonic() + 120
        while not client.get(made.id).status.is_terminal():
            assert time.monotonic() < deadline, "the dev environment still runs after its stop"
            time.sleep(0.2)
        held.settimeout(60)
        while held.recv(4096):  # the kernel's greeting, then the end
            pass
        held.close()
        while _relays(ray_driver):
            assert time.monotonic() < deadline, f"relays left: {_relays(ray_driver)}"
            time.sleep(0.2)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, port), timeout=10)
    finally:
        if direct is not None:
            direct.stop_channels()
        kernel.stop_channels()
        decoy.close()
        if not client.get(made.id).status.is_terminal():
            client.stop(made.id)
        manager.shutdown_kernel(now=True)
        if short is not None:
            os.unlink(short)


def test_a_kernel_on_another_host(two_hosts, service_on, tmp_path, monkeypatch):  # noqa: F811
    """The dev environment runs on host B (its own network namespace, 10.77.0.2) with its job
    folder on B's own disk: this machine sees neither its sockets nor its files, and the kernel
    is reached through B's relay over the veth pair (``test_ray_lost_host.py``'s two hosts)."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    service_on(two_hosts.private)  # job folders on B lie on B's own disk
    client = Client(autostart=False)
    data = tmp_path / "data"
    data.mkdir()
    (data / "only-here.txt").write_text("seen on B")
    # which inventory node B is: a 2-node job has one node there
    probe = client.submit(name="probe", mode="pytorch", nodes=2, specs=["cpu.small"], command="sleep 600")
    job = probe.info
    while job.status is not JobStatus.running:
        assert not job.status.is_terminal(), job.reason
        job = client.wait_status(probe.id, since=job.status, wait=10)
    [on_b] = [n.host for n in job.nodes if n.host == two_hosts.b_name()]
    client.stop(probe.id)
    source = client.submit(
        name="on-b",
        specs=["cpu.small"],
        node_name=on_b,
        command="sleep 600",
        datasets=[{"name": "corpus", "path": str(data)}],
        env={"GREETING": "hi-b"},
    )
    made = client.create_devenv(source.id)
    name, _ = install_devenv_kernel(client.get(source.id), "worker-0", made.info)
    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    kernel = manager.client()
    kernel.start_channels()
    try:
        kernel.wait_for_ready(timeout=300)
        devenv = client.get(made.id)
        assert devenv.nodes[0].host == on_b
        assert client.local_log_file(made.id, "worker-0") is None  # its files are not here
        route = client.kernel_route(made.id)
        assert route.relay is not None and route.relay.host == B
        out: list[str] = []
        reply = kernel.execute_interactive(
            "import os, socket\n"
            "print(open('/workspace/dataset/private/corpus/only-here.txt').read(), os.environ['GREETING'])\n"
            "print(os.path.realpath('/run/ma_jupyter/kernel') == '/run/ma_jupyter/kernel')\n",
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", out
        assert "".join(out) == "seen on B hi-b\nTrue\n"
        assert _answer(B, route.relay.port, kernel_access.hello("0" * 64, channel="k-1")) == b""
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel()  # Jupyter's shutdown request: the kernel, then the dev environment end
    deadline = time.monotonic() + 120
    while not client.get(made.id).status.is_terminal():
        assert time.monotonic() < deadline, "the dev environment still runs after its kernel shut down"
        time.sleep(0.5)
    while True:
        try:
            socket.create_connection((B, route.relay.port), timeout=10).close()
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "B's relay still listens after its dev environment ended"
        time.sleep(0.2)
