"""The kernel relay of a Ray node's agent (``backends/ray/kernel_relay.py``) and the kernel
bridge's end of it (``client/kernel_bridge.py``'s ``_Relay``), on real TCP and Unix sockets and a
real ZMQ peer as the kernel; the strangers act as a hostile job would (no secret, a wrong one,
a planted link in the kernel folder).  The whole path with Ray and a real kernel:
``tests/ray/test_ray_devenv.py``."""

from __future__ import annotations

import concurrent.futures
import json
import os
import selectors
import socket
import threading
import time

import pytest
import zmq

from ma_jupyter import kernel_access
from ma_jupyter.backends.ray import kernel_relay as relay_module
from ma_jupyter.backends.ray.kernel_relay import KernelRelay
from ma_jupyter.client import kernel_bridge
from ma_jupyter.jobdir import CONNECTION_FILE
from ma_jupyter.models import KernelRelay as RelayAddress
from tests.helpers import wait_for


@pytest.fixture
def kernel(tmp_path):
    """A kernel folder whose ``k-1`` is a ZMQ REP socket (the kernel's side)."""
    folder = tmp_path / "kernel"
    folder.mkdir()
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.linger = 0
    rep.bind(f"ipc://{folder}/k-1")
    yield folder, rep
    rep.close(0)
    ctx.term()


@pytest.fixture
def relay(kernel):
    opened = KernelRelay(kernel[0], "127.0.0.1")
    yield opened
    opened.close()


def _address(relay: KernelRelay, secret: str | None = None) -> RelayAddress:
    return RelayAddress(host="127.0.0.1", port=relay.port, secret=secret or relay.secret)


def _raw(relay: KernelRelay, first: bytes) -> bytes:
    """What a stranger that connects and sends ``first`` gets back before the relay closes."""
    with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as conn:
        conn.sendall(first)
        got = b""
        while True:
            data = conn.recv(4096)
            if not data:
                return got
            got += data


def _ping(endpoint: str, rep: zmq.Socket, text: bytes = b"ping") -> None:
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.linger = 0
    try:
        req.connect(endpoint)
        req.send(text)
        assert rep.poll(30_000), "the kernel's socket got nothing through the relay"
        assert rep.recv() == text
        rep.send(b"pong:" + text)
        assert req.poll(30_000) and req.recv() == b"pong:" + text
    finally:
        req.close(0)


def test_zmq_runs_through_the_bridge_and_the_relay(kernel, relay):
    folder, rep = kernel
    door = kernel_bridge._Relay(_address(relay), again=lambda: _address(relay))
    try:
        assert door.write_connection({"key": "k3y", "signature_scheme": "hmac-sha256"}) is True
        assert door.write_connection({"key": "other"}) is False  # never replaced
        assert json.loads((folder / CONNECTION_FILE).read_text())["key"] == "k3y"
        endpoint = door.endpoint("k-1", time.monotonic() + 30)
        for i in range(3):
            _ping(endpoint, rep, f"ping-{i}".encode())
    finally:
        door.close()


def test_a_stale_secret_is_asked_for_again_through_the_service(kernel, relay):
    asked = []

    def again() -> RelayAddress:
        asked.append(1)
        return _address(relay)

    door = kernel_bridge._Relay(_address(relay, secret="0" * 64), again=again)
    try:
        _ping(door.endpoint("k-1", time.monotonic() + 30), kernel[1])
        assert asked
    finally:
        door.close()


def test_strangers_get_nothing(kernel, relay, tmp_path):
    folder, rep = kernel
    # a plain socket as k-2, to see whether anyone reaches it
    side = socket.socket(socket.AF_UNIX)
    side.bind(str(folder / "k-2"))
    side.listen(4)
    side.settimeout(0.5)
    try:
        assert _raw(relay, kernel_access.hello("f" * 64, channel="k-2")) == b""
        assert _raw(relay, kernel_access.hello("", channel="k-2")) == b""
        assert _raw(relay, json.dumps({"channel": "k-2"}).encode() + b"\n") == b""
        assert _raw(relay, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""
        assert _raw(relay, b"x" * (kernel_access.HELLO_LIMIT + 10)) == b""
        key = kernel_access.hello("f" * 64, connection={"key": "stolen"})
        assert _raw(relay, key) == b""
        with pytest.raises(TimeoutError):
            side.accept()  # nobody reached the kernel's socket
        assert not (folder / CONNECTION_FILE).exists()
        # the right secret does reach it
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as conn:
            conn.sendall(kernel_access.hello(relay.secret, channel="k-2"))
            assert conn.recv(1) == kernel_access.READY
            side.settimeout(30)
            side.accept()[0].close()
    finally:
        side.close()


def test_a_planted_link_or_file_is_refused_and_the_first_socket_stays(kernel, relay, tmp_path):
    folder, rep = kernel
    elsewhere = tmp_path / "someone-elses.sock"
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(elsewhere))
    other.listen(4)
    other.settimeout(0.5)
    (folder / "k-3").symlink_to(elsewhere)  # the job points the relay at another socket
    (folder / "k-4").write_text("not a socket")
    try:
        for name in ("k-3", "k-4"):
            answer = _raw(relay, kernel_access.hello(relay.secret, channel=name))
            assert answer.startswith(kernel_access.REFUSED) and b"not the kernel's socket" in answer
        for name in ("../someone-elses.sock", str(elsewhere), "k-9"):
            answer = _raw(relay, kernel_access.hello(relay.secret, channel=name))
            assert answer.startswith(kernel_access.REFUSED) and b"not one of the kernel's sockets" in answer
        with pytest.raises(TimeoutError):
            other.accept()
        # k-1 reached once stays the socket it was: swapping it for a link changes nothing
        door = kernel_bridge._Relay(_address(relay), again=lambda: _address(relay))
        try:
            endpoint = door.endpoint("k-1", time.monotonic() + 30)
            (folder / "k-1").unlink()
            (folder / "k-1").symlink_to(elsewhere)
            _ping(endpoint, rep)
            with pytest.raises(TimeoutError):
                other.accept()
        finally:
            door.close()
    finally:
        other.close()


def test_a_hard_link_to_another_accounts_socket_is_refused(tmp_path):
    """The relay runs as root; the job (another account, owning its kernel folder) hard-links a
    socket of root's into the folder (possible where ``fs.protected_hardlinks`` is 0)."""
    job = 65534
    folder = tmp_path / "kernel"
    folder.mkdir()
    os.chown(folder, job, job)
    elsewhere = tmp_path / "roots.sock"
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(elsewhere))
    other.listen(4)
    other.settimeout(0.5)
    os.link(elsewhere, folder / "k-1")
    relay = KernelRelay(folder, "127.0.0.1")
    try:
        answer = _raw(relay, kernel_access.hello(relay.secret, channel="k-1"))
        assert answer.startswith(kernel_access.REFUSED) and b"not the kernel's socket" in answer
        with pytest.raises(TimeoutError):
            other.accept()
        # the kernel's own socket (the job's account's) is reached
        own = socket.socket(socket.AF_UNIX)
        own.bind(str(folder / "k-2"))
        own.listen(4)
        os.chown(folder / "k-2", job, job)
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as conn:
            conn.sendall(kernel_access.hello(relay.secret, channel="k-2"))
            assert conn.recv(1) == kernel_access.READY
        own.close()
    finally:
        relay.close()
        other.close()


def test_a_stranger_holding_unproven_connections_does_not_keep_the_owner_out(kernel, relay):
    """A stranger keeps opening connections it never proves from one address, reopening each
    the relay closes; the bridge, from another address (127.0.0.2), still gets through."""
    held: list[socket.socket] = []
    turned_away = threading.Event()
    stop = threading.Event()
    many = relay_module.MAX_PENDING + 8

    def stranger():
        with selectors.DefaultSelector() as watch:
            while not stop.is_set():
                while len(held) < many:
                    try:
                        conn = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
                    except OSError:
                        break
                    held.append(conn)
                    watch.register(conn, selectors.EVENT_READ)
                for key, _ in watch.select(0.02):
                    watch.unregister(key.fileobj)
                    held.remove(key.fileobj)
                    key.fileobj.close()  # closed by the relay: open another at once
                    turned_away.set()

    thread = threading.Thread(target=stranger, daemon=True)
    thread.start()
    try:
        assert turned_away.wait(30), "the relay took every connection of the stranger"
        assert relay.pending().get("127.0.0.1", 0) <= relay_module.PENDING_PER_SOURCE
        for _ in range(3):
            with socket.create_connection(
                ("127.0.0.1", relay.port), timeout=30, source_address=("127.0.0.2", 0)
            ) as conn:
                conn.sendall(kernel_access.hello(relay.secret, channel="k-1"))
                assert conn.recv(1) == kernel_access.READY
    finally:
        stop.set()
        thread.join(30)
        for conn in held:
            conn.close()


def test_closing_ends_the_listener_the_connections_and_the_threads(kernel, relay):
    folder, rep = kernel
    conn = socket.create_connection(("127.0.0.1", relay.port), timeout=30)
    conn.sendall(kernel_access.hello(relay.secret, channel="k-1"))
    assert conn.recv(1) == kernel_access.READY
    idle = socket.create_connection(("127.0.0.1", relay.port), timeout=30)  # before its proof
    deadline = time.monotonic() + 30
    while relay.threads() < 4:  # accept, the proven connection's two, the idle one's
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started = time.monotonic()
    relay.close()
    assert time.monotonic() - started < 5
    assert relay.threads() == 0
    while conn.recv(4096):  # the kernel's greeting, then the end (a timeout fails the test)
        pass
    assert idle.recv(10) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", relay.port), timeout=5)
    conn.close()
    idle.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(f"kernel-relay-{relay.port}-")]


def test_a_peer_trickling_its_first_line_is_cut_off():
    ours, theirs = socket.socketpair()
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.05):
            try:
                theirs.send(b"x")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    try:
        assert kernel_access.read_hello(ours, wait=0.5) is None
        assert time.monotonic() - started < 5  # the whole line's wait, not one byte's
    finally:
        stop.set()
        ours.close()
        theirs.close()


def _peak_rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_kernel_declaring_an_8_gib_frame_through_the_relay_is_dropped_in_bounded_memory(tmp_path):
    """What answers on the kernel's socket speaks ZMTP itself and declares an 8 GiB message: the
    relay copies it a chunk at a time and the bridge's socket drops the connection, so neither
    (both in this process) grows by what was sent."""
    from tests.fixtures.zmtp import zmtp_greeting, zmtp_ready

    folder = tmp_path / "kernel"
    folder.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(folder / "k-1"))
    listener.listen(8)
    listener.settimeout(60)
    outcome: dict = {}

    def hostile_kernel() -> None:
        while "dropped" not in outcome:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.settimeout(60)
            received = b""
            try:
                conn.sendall(zmtp_greeting(as_server=True) + zmtp_ready(b"ROUTER"))
                while b"READY" not in received:  # the relay's first look closes at once
                    data = conn.recv(4096)
                    if not data:
                        break
                    received += data
            except OSError:
                pass
            if b"READY" not in received:
                conn.close()
                continue
            conn.sendall(b"\x02" + (8 << 30).to_bytes(8, "big"))
            sent, chunk = 0, b"\0" * (1 << 20)
            try:
                while sent < 768 << 20:
                    conn.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                outcome["dropped"] = True
            outcome["sent"] = sent
            conn.close()
            return

    opened = KernelRelay(folder, "127.0.0.1")
    door = kernel_bridge._Relay(_address(opened), again=lambda: _address(opened))
    ctx = zmq.Context()
    thread = threading.Thread(target=hostile_kernel, daemon=True)
    thread.start()
    before = _peak_rss()
    try:
        dealer = kernel_bridge.kernel_socket(ctx, zmq.DEALER)
        dealer.connect(door.endpoint("k-1", time.monotonic() + 30))
        thread.join(120)
        grown = _peak_rss() - before
        print(f"sent {outcome.get('sent', 0) >> 20} MiB of the frame; this process grew by {grown >> 20} MiB")
        assert outcome.get("dropped"), outcome
        assert grown < 160 << 20, grown
    finally:
        ctx.destroy(linger=0)
        door.close()
        opened.close()
        listener.close()


def test_a_kernel_socket_bound_before_it_listens_is_waited_for_not_refused(kernel, relay, monkeypatch):
    """The kernel binds each of its sockets before it listens on it (ZMQ's bind is two system
    calls, which a loaded machine stretches apart): a bridge that asks in between waits for the
    socket to listen, and is not refused (the bridge ends on a refusal, and Jupyter sees its
    kernel die before it answered ``kernel_info``)."""
    folder, _ = kernel
    refused = []
    connect = kernel_access.connect_socket

    def counted(fd: int) -> socket.socket:  # the relay's own connect, with its refusals counted
        try:
            return connect(fd)
        except ConnectionRefusedError:
            refused.append(fd)
            raise

    monkeypatch.setattr(relay_module.kernel_access, "connect_socket", counted)
    early = socket.socket(socket.AF_UNIX)
    early.bind(str(folder / "k-2"))  # bound, not listening yet
    door = kernel_bridge._Relay(_address(relay), again=lambda: _address(relay))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        asked = pool.submit(door.endpoint, "k-2", time.monotonic() + 90)
        wait_for(lambda: len(refused) >= 2 or asked.done(), timeout=30)
        assert not asked.done(), asked.result()  # the relay tries again, the bridge waits
        early.listen(4)
        assert asked.result(timeout=60) == f"ipc://{door._folder / 'k-2'}"
        early.settimeout(30)
        early.accept()[0].close()  # the relay reached the socket once it listened
    finally:
        pool.shutdown(wait=True)
        door.close()
        early.close()
