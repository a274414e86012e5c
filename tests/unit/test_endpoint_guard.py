"""An object storage endpoint whose name answers differently after the submit's check (DNS
rebinding) never gets a connection to the address the check refuses: the transfers connect
through ``endpoint_guard``, which checks the address it connects to.

The hostile name lives in a test-local resolver: the child process runs in a mount namespace of
its own, where a file of the test's is bind-mounted over ``/etc/hosts`` (glibc reads it at each
lookup, the service's and the client library's alike: no resolver of the process is patched),
and in a network namespace of its own, where ``8.8.8.8`` (a public address) is an address of
its loopback: a stand-in for the endpoint's public server, and listeners on both addresses
record every connection they get.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import json, os, socket, subprocess, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

hosts = sys.argv[1]
subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "8.8.8.8/32", "dev", "lo"], check=True)

seen = {"8.8.8.8": [], "127.0.0.1": []}

class Answer(BaseHTTPRequestHandler):
    def do_GET(self):  # an empty listing, as S3 answers one
        seen[self.server.server_address[0]].append(self.path)
        body = b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

public = ThreadingHTTPServer(("8.8.8.8", 0), Answer)
port = public.server_address[1]
inner = ThreadingHTTPServer(("127.0.0.1", port), Answer)  # what the rebinding aims at
for server in (public, inner):
    threading.Thread(target=server.serve_forever, daemon=True).start()

from ma_jupyter import objectstore
from ma_jupyter.errors import StorageError

endpoint = f"http://rebind.example:{port}"
creds = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "k", "AWS_ENDPOINT_URL": endpoint}
out = {}
with open(hosts, "w") as f:
    f.write("8.8.8.8 rebind.example\n")
objectstore.check_endpoint(creds)  # the submit's check: a public address
out["public"] = len(objectstore.listing(objectstore.ObjectURI.parse("s3://bkt/a"), creds, endpoint))
with open(hosts, "w") as f:  # the name now answers with loopback
    f.write("127.0.0.1 rebind.example\n")
try:
    objectstore.listing(objectstore.ObjectURI.parse("s3://bkt/b"), creds, endpoint, timeout=5.0)
    out["rebound"] = "listed"
except StorageError as exc:
    out["rebound"] = str(exc)
out["seen"] = seen
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_name_that_rebinds_after_the_check_never_reaches_the_refused_address(tmp_path: Path):
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        ["unshare", "--mount", "--net", sys.executable, "-c", CHILD, str(hosts)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout + done.stderr
    out = json.loads(line[len("RESULT ") :])
    # the public address, checked, is reached through the guard: the listing works
    assert out["public"] == 0 and len(out["seen"]["8.8.8.8"]) >= 1, out
    # the rebound name: refused, with the reason, and loopback never got a connection
    assert out["rebound"] != "listed" and "127.0.0.1" in out["rebound"], out
    assert "allow_endpoints" in out["rebound"], out
    assert out["seen"]["127.0.0.1"] == [], out


def _ask(port: int, head: bytes) -> bytes:
    """The proxy's answer to ``head`` on a connection of its own (what it sent before closing)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(head)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer


def _auth(secret: str) -> bytes:
    """The header with which a client presents its secret (as obstore sends it: user ``ma``)."""
    import base64

    return b"Proxy-Authorization: Basic " + base64.b64encode(f"ma:{secret}".encode()) + b"\r\n"


def test_ipv6_forms_that_carry_a_refused_ipv4_address_are_refused_by_the_check_and_the_proxy():
    """An endpoint named by a literal that reaches a refused IPv4 address: IPv4 in other
    spellings (decimal, octal, short), IPv4-mapped IPv6, and the IPv6 forms a translator on the
    way turns into IPv4 (NAT64, as a cloud's NAT64 gateway does, 6to4, Teredo, IPv4-compatible):
    each is refused by the check and by the proxy, which never connects to it."""
    from ma_jupyter import endpoint_guard

    refused = [
        "2130706433",  # 127.0.0.1
        "0177.0.0.1",
        "127.1",
        "0.0.0.0",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",  # NAT64: 169.254.169.254
        "64:ff9b:1::a00:1",  # NAT64, local use: 10.0.0.1
        "2002:a00:1::1",  # 6to4: 10.0.0.1
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
        "::127.0.0.1",  # IPv4-compatible
    ]
    for host in refused:
        with pytest.raises(endpoint_guard.Refused):
            endpoint_guard.checked_addresses(host, 80)
    assert not endpoint_guard.is_refused("64:ff9b::808:808")  # NAT64 of a public address

    proxy = endpoint_guard._Proxy()
    secret = proxy.route("64:ff9b::a00:1", 80)
    answer = _ask(proxy.port, b"CONNECT [64:ff9b::a00:1]:80 HTTP/1.1\r\n" + _auth(secret) + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert "allow_endpoints" in (proxy.refusal("64:ff9b::a00:1") or ""), proxy.refusal("64:ff9b::a00:1")


def test_a_slow_drip_head_or_a_bad_port_never_holds_a_proxy_thread(monkeypatch):
    """A local process dripping a request head a byte at a time (each byte well within the head
    timeout) is answered 408 once the whole head's time is spent, not held until 16 KiB arrive;
    a port of non-ASCII digits gets an answer too, not a thread ending in a traceback."""
    import select
    import socket
    import time

    from ma_jupyter import endpoint_guard

    monkeypatch.setattr(endpoint_guard, "HEAD_TIMEOUT", 1.0)
    proxy = endpoint_guard._Proxy()
    secret = proxy.route("example.com", 443)
    answer = _ask(
        proxy.port, "CONNECT example.com:\u00b2 HTTP/1.1\r\n".encode("latin-1") + _auth(secret) + b"\r\n"
    )
    # an answer (not a proxy request, or not the client's endpoint), past the secret's check
    assert answer.startswith(b"HTTP/1.1 40") and not answer.startswith(b"HTTP/1.1 407"), answer

    with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as conn:
        conn.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nX-Drip: ")
        answer, ended = b"", False
        deadline = time.monotonic() + 120  # the old per-byte timeout: 16 KiB at 20 a second
        while not ended and time.monotonic() < deadline:
            try:
                conn.sendall(b"a")
                if select.select([conn], [], [], 0.05)[0]:
                    while chunk := conn.recv(4096):
                        answer += chunk
                    ended = True
            except OSError:  # reset: the proxy closed with the drip's last bytes unread
                ended = True
    assert ended and (answer == b"" or answer.startswith(b"HTTP/1.1 408")), answer


STALLED = r"""
import base64, json, socket, subprocess, sys, threading, time

subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "8.8.8.8/32", "dev", "lo"], check=True)

from ma_jupyter import endpoint_guard

endpoint_guard.IDLE_TIMEOUT = 1.0
# the user's endpoint: it takes connections and never reads a byte of them
endpoint = socket.create_server(("8.8.8.8", 0))
held = []
threading.Thread(target=lambda: [held.append(endpoint.accept()) for _ in range(2)], daemon=True).start()
port = endpoint.getsockname()[1]
proxy = endpoint_guard._Proxy()
secret = proxy.route("8.8.8.8", port)

client = socket.create_connection(("127.0.0.1", proxy.port), timeout=60)
client.sendall(f"CONNECT 8.8.8.8:{port} HTTP/1.1\r\nProxy-Authorization: Basic ".encode())
client.sendall(base64.b64encode(f"ma:{secret}".encode()) + b"\r\n\r\n")
answer = client.recv(4096)
client.settimeout(2.0)
sent = 0
try:  # an upload the endpoint never reads: every buffer on the way fills
    while sent < 256 << 20:
        sent += client.send(b"x" * 65536)
except OSError:  # its own timeout, or the proxy ended the relay first
    pass
client.close()
deadline = time.monotonic() + 60
while proxy._active and time.monotonic() < deadline:
    time.sleep(0.05)
print("RESULT " + json.dumps({"answer": answer.decode("latin-1"), "sent": sent, "active": proxy._active}), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_an_endpoint_that_never_reads_holds_no_relay_past_the_idle_timeout():
    """A user's endpoint that accepts a connection and never reads it (the client's upload
    fills every buffer, then the client gives up) ends its relay once nothing moved for the idle
    timeout: a write to it no longer waits without bound, so such endpoints cannot take every
    one of the proxy's connections from the other users' transfers."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", STALLED],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout + done.stderr
    out = json.loads(line[len("RESULT ") :])
    assert out["answer"].startswith("HTTP/1.1 200") and out["sent"] > 0, out
    assert out["active"] == 0, out


def test_another_local_process_never_uses_the_proxy_as_a_relay():
    """Another local account asking the proxy for a target: without a secret, or with a wrong
    one, it gets 407 even for a target a client was made for; a client's secret takes that
    client's own target only (403 for a listener of this machine, by address and by name); a
    client made for this machine's own name is refused its address.  The listener never gets a
    connection."""
    import socket

    from ma_jupyter import endpoint_guard

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    proxy = endpoint_guard._Proxy()
    try:
        theirs = proxy.route("localhost", port)  # a user's endpoint naming this machine
        other = proxy.route("other.example", 443)
        for head in (f"CONNECT localhost:{port}", f"GET http://localhost:{port}/"):
            for auth in (
                b"",
                _auth("guessed-" + theirs[8:]),
                b"Proxy-Authorization: Bearer " + theirs.encode() + b"\r\n",
            ):
                answer = _ask(proxy.port, f"{head} HTTP/1.1\r\n".encode() + auth + b"\r\n")
                assert answer.startswith(b"HTTP/1.1 407 "), (auth, answer)
                assert theirs.encode() not in answer and b"Proxy-Authenticate: Basic" in answer, answer
        for head in (f"CONNECT 127.0.0.1:{port}", f"GET http://localhost:{port}/"):
            answer = _ask(proxy.port, f"{head} HTTP/1.1\r\n".encode() + _auth(other) + b"\r\n")
            assert answer.startswith(b"HTTP/1.1 403 not the endpoint"), answer
        answer = _ask(proxy.port, f"CONNECT localhost:{port} HTTP/1.1\r\n".encode() + _auth(theirs) + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 403 refused address"), answer
        assert "allow_endpoints" in (proxy.refusal("localhost") or ""), proxy.refusal("localhost")
        assert theirs not in repr(vars(proxy)) and other not in repr(vars(proxy))  # digests only
        with pytest.raises(TimeoutError):  # every answer came: nothing still on its way
            listener.accept()
    finally:
        listener.close()


def test_a_side_that_never_reads_frees_the_relay_within_the_idle_timeout(monkeypatch):
    """A hostile endpoint that accepts the connection and never reads (while the client keeps
    sending) must not hold a relay, one of the places every user shares, for ever."""
    import socket
    import threading

    from ma_jupyter import endpoint_guard

    monkeypatch.setattr(endpoint_guard, "IDLE_TIMEOUT", 1.0)
    client, client_end = socket.socketpair()
    endpoint_end, endpoint = socket.socketpair()  # ``endpoint`` never reads
    outcome: list[BaseException | None] = []

    def relay() -> None:
        try:
            endpoint_guard._relay(client_end, endpoint_end)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (recorded for the assertion)
            outcome.append(exc)

    def send() -> None:  # the client uploads until the relay gives up on it
        client.settimeout(60)
        try:
            while True:
                client.sendall(b"x" * 65536)
        except OSError:
            pass

    threads = [threading.Thread(target=relay, daemon=True), threading.Thread(target=send, daemon=True)]
    for thread in threads:
        thread.start()
    threads[0].join(60)
    try:
        assert not threads[0].is_alive(), "the relay still waits on an endpoint that never reads"
        assert outcome and isinstance(outcome[0], OSError), outcome  # _serve's end of a failed relay
    finally:
        for sock in (client, client_end, endpoint_end, endpoint):
            sock.close()
        threads[1].join(60)


def test_an_endpoint_in_use_keeps_its_route_while_other_endpoints_are_routed(monkeypatch):
    """Clients (their secrets) are bounded (the most recent kept): a client that connects keeps
    its secret, so another user making many clients of their own never makes a running
    transfer's next connection a 407."""
    import socket

    from ma_jupyter import endpoint_guard

    monkeypatch.setattr(endpoint_guard, "MAX_ROUTES", 3)
    proxy = endpoint_guard._Proxy()

    def answer(secret: str) -> str:  # a client's target is checked (localhost: refused)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
            conn.sendall(b"CONNECT localhost:9 HTTP/1.1\r\nHost: localhost:9\r\n" + _auth(secret) + b"\r\n")
            return conn.makefile("rb").readline().decode()

    victim = proxy.route("localhost", 9)  # the victim's client, its transfer running
    first = proxy.route("other-1.example", 443)
    proxy.route("other-2.example", 443)
    assert "refused address" in answer(victim)  # its secret stands (and is used now)
    proxy.route("other-3.example", 443)  # one more client: the least recently used goes
    assert "refused address" in answer(victim), "a client in use lost its secret"
    assert " 407 " in answer(first)  # the one forgotten


def test_a_relay_moves_bytes_between_descriptors_numbered_above_1024():
    """A service whose descriptor limit is raised holds descriptors numbered 1024 and more under
    load: a relay between two of them still moves the bytes both ways."""
    import fcntl
    import resource
    import socket
    import threading

    from ma_jupyter import endpoint_guard

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the descriptor limit stays under 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    pairs = [socket.socketpair(), socket.socketpair()]
    high = []
    try:
        for pair in pairs:  # each relay end moved to a descriptor above 1024
            fd = fcntl.fcntl(pair[1].fileno(), fcntl.F_DUPFD_CLOEXEC, 1100 + len(high))
            high.append(socket.socket(fileno=fd))
        client, endpoint = pairs[0][0], pairs[1][0]
        thread = threading.Thread(target=endpoint_guard._relay, args=(high[0], high[1]), daemon=True)
        thread.start()
        client.sendall(b"request")
        endpoint.settimeout(30)
        assert endpoint.recv(100) == b"request"
        endpoint.sendall(b"answer")
        client.settimeout(30)
        assert client.recv(100) == b"answer"
        client.close()  # one side ends: the relay ends
        thread.join(30)
        assert not thread.is_alive()
    finally:
        for sock in [*high, *(s for pair in pairs for s in pair)]:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


CROWDED = r"""
import base64, json, socket, subprocess, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "8.8.8.8/32", "dev", "lo"], check=True)

seen = []

class Answer(BaseHTTPRequestHandler):
    def do_GET(self):  # an empty listing, as S3 answers one
        seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

server = ThreadingHTTPServer(("8.8.8.8", 0), Answer)
port = server.server_address[1]
threading.Thread(target=server.serve_forever, daemon=True).start()

from ma_jupyter import endpoint_guard, objectstore
from ma_jupyter.errors import StorageError

# small bounds, a long head deadline: only the secret and the pending bound let the client in
endpoint_guard.MAX_CONNECTIONS, endpoint_guard.MAX_PENDING, endpoint_guard.HEAD_TIMEOUT = 4, 8, 60.0
urls = []
made = endpoint_guard.route
endpoint_guard.route = lambda host, p: urls.append(made(host, p)) or urls[-1]  # the URLs handed out
proxy_port = int(made("unused.example", 443).rsplit(":", 1)[1])
out = {}

def ask(head):  # a whole head on a connection of its own: the proxy's first answer line
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=60) as conn:
        conn.sendall(head)
        return conn.makefile("rb").readline().decode()

# the stranger: whole heads without a secret and with a guessed one, to the client's target
target = f"CONNECT 8.8.8.8:{port} HTTP/1.1\r\n"
guessed = base64.b64encode(b"ma:" + b"A" * 43).decode()
out["no secret"] = ask(target.encode() + b"\r\n")
out["wrong secret"] = ask(f"{target}Proxy-Authorization: Basic {guessed}\r\n\r\n".encode())
# then far more dripping heads than every bound together, each holding its connection open
dripping = []
for _ in range(endpoint_guard.MAX_CONNECTIONS + endpoint_guard.MAX_PENDING + 8):
    conn = socket.create_connection(("127.0.0.1", proxy_port), timeout=60)
    conn.sendall(f"{target}X-Drip: ".encode())
    dripping.append(conn)
for conn in dripping:
    try:
        conn.sendall(b"a")
    except OSError:  # dropped by the pending bound
        pass
out["relayed by the stranger"] = endpoint_guard._proxy._active

endpoint = f"http://8.8.8.8:{port}"
creds = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "k", "AWS_ENDPOINT_URL": endpoint}
try:
    out["client"] = len(objectstore.listing(objectstore.ObjectURI.parse("s3://bkt/a"), creds, endpoint, timeout=30.0))
except StorageError as exc:
    out["client"] = str(exc)
secret = urls[-1].split("@")[0].rsplit(":", 1)[1]
out["secret in what the endpoint saw"] = any(secret in json.dumps(h) or "proxy-authorization" in h for h in seen)
out["requests seen"] = len(seen)
out["secret in the store's repr"] = any(secret in repr(s) for _, s in objectstore._stores.values())
# an https endpoint: the client's CONNECT carries its secret too (the tunnel reaches the
# endpoint, whose first bytes are the client's TLS hello; no TLS server here: the listing fails)
tls = socket.create_server(("8.8.8.8", 0))
tls_endpoint = f"https://8.8.8.8:{tls.getsockname()[1]}"
hello = []
def first_bytes():  # each retry's connection closed at its first byte: the client fails fast
    while True:
        conn, _ = tls.accept()
        conn.settimeout(30)
        hello.append(conn.recv(1))
        conn.close()
threading.Thread(target=first_bytes, daemon=True).start()
creds = {**creds, "AWS_ENDPOINT_URL": tls_endpoint}
try:
    objectstore.listing(objectstore.ObjectURI.parse("s3://bkt/a"), creds, tls_endpoint, timeout=10.0)
except StorageError:
    pass
out["tunnel's first byte"] = hello[0].hex() if hello else None
for conn in dripping:
    conn.close()
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_stranger_without_the_secret_never_keeps_a_client_from_its_endpoint():
    """Another local account, playing against a client's target: a whole head without a secret
    or with a guessed one is refused at once (407), and dripping heads on more connections than
    every bound of the proxy together holds no place the client needs: the client (obstore,
    through the proxy URL it was given) still lists its bucket, and its CONNECT to an https
    endpoint carries the secret as well.  The endpoint never sees the
    client's secret, nor does the store's repr show it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", CROWDED],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout + done.stderr
    out = json.loads(line[len("RESULT ") :])
    assert out["no secret"].startswith("HTTP/1.1 407") and out["wrong secret"].startswith("HTTP/1.1 407"), out
    assert out["relayed by the stranger"] == 0, out
    assert out["client"] == 0 and out["requests seen"] >= 1, out
    assert not out["secret in what the endpoint saw"] and not out["secret in the store's repr"], out
    assert out["tunnel's first byte"] == "16", out  # a TLS handshake record, through the CONNECT


#: another local account: connections whose heads it begins and never finishes, opened as fast
#: as it can, then one whole head without a secret, whose 407 says the proxy took them all
STRANGER_FLOOD = """
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(count):
    conn = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        conn.sendall(b"CONNECT ")
    except OSError:  # dropped already
        pass
    held.append(conn)
probe = socket.create_connection(("127.0.0.1", port), timeout=60)
probe.sendall(b"CONNECT 127.0.0.1:443 HTTP/1.1\\r\\n\\r\\n")
print(probe.makefile("rb").readline().decode().strip(), flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the stranger runs as another account")
def test_another_account_opening_connections_fast_never_drops_a_clients_pending_one(monkeypatch):
    """Another local account opens connections faster than a client on a loaded machine sends
    its head: the pending bound drops the stranger's own connections, never the client's."""
    import socket

    from ma_jupyter import endpoint_guard

    python = shutil.which("python3", path="/usr/bin:/bin")  # one another account may run
    if python is None:
        pytest.skip("no python3 in /usr/bin or /bin for another account to run")
    monkeypatch.setattr(endpoint_guard, "MAX_PENDING", 8)
    monkeypatch.setattr(endpoint_guard, "HEAD_TIMEOUT", 120.0)  # only the pending bound drops
    proxy = endpoint_guard._Proxy()
    secret = proxy.route("127.0.0.1", 443)
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=60)  # its head still to come
    uid = 3_000_000 + os.getpid() % 100_000  # an account of this test alone
    stranger = subprocess.Popen(
        [python, "-c", STRANGER_FLOOD, str(proxy.port), str(4 * endpoint_guard.MAX_PENDING)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=uid,
        group=uid,
        extra_groups=[],
        cwd="/",
    )
    try:
        assert stranger.stdout.readline().startswith("HTTP/1.1 407")
        auth = base64.b64encode(f"ma:{secret}".encode()).decode()
        try:
            client.sendall(
                f"CONNECT 127.0.0.1:443 HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            answer = client.makefile("rb").readline().decode()
        except OSError as exc:
            answer = repr(exc)
        # admitted: its target, loopback, is then refused (rule 5); dropped: no answer at all
        assert answer.startswith("HTTP/1.1 403"), f"the client's connection was dropped: {answer!r}"
    finally:
        client.close()
        stranger.stdin.close()
        stranger.wait(timeout=60)


def test_a_ray_agent_guards_an_endpoint_again_once_the_administrator_takes_it_out(tmp_path, monkeypatch):
    """An agent told once that an endpoint is the administrator's (``[storage] allow_endpoints``)
    does not trust it past that call: once ``cluster.toml`` no longer names it, what the service
    sends says so (read at each request), and the agent's next download goes through the guard,
    which refuses the endpoint's loopback address: the endpoint gets no further request, and
    the agent was not restarted."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ma_jupyter import objectstore
    from ma_jupyter.backends.base import ObjectFetch
    from ma_jupyter.backends.ray import objects
    from ma_jupyter.errors import StorageError
    from ma_jupyter.service import storage

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("MA_JUPYTER_HOME", str(home))
    cluster = home / "cluster.toml"

    # what the service sends with each download request follows cluster.toml as it is then
    public = "http://8.8.8.8:9000"  # a literal: resolved without a network
    uri = objectstore.ObjectURI.parse("s3://bkt/out")
    said_trusted = []
    for text in (f'[storage]\nallow_endpoints = ["{public}"]\n', ""):
        cluster.write_text(text)
        at = storage.endpoint(uri, {"AWS_ENDPOINT_URL": public})
        said_trusted.append(not objectstore.guarded(at))  # as preparation makes ObjectFetch
    assert said_trusted == [True, False]

    # the agent: an administrator's endpoint on loopback (a local S3 server), trusted, then not
    requests_seen: list[str] = []

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):  # an empty listing, as S3 answers one
            requests_seen.append(self.path)
            body = b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    credentials = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "k", "AWS_ENDPOINT_URL": url}
    node_root = str(tmp_path / "node")
    try:
        said = objects.fetch(
            node_root,
            "job-trust",
            [ObjectFetch("outputs", str(uri), url, "outputs", True)],
            credentials,
            None,
        )
        assert "0 object(s)" in said[-1] and len(requests_seen) == 1, (said, requests_seen)
        with pytest.raises(StorageError, match="allow_endpoints"):
            objects.fetch(
                node_root,
                "job-trust",
                [ObjectFetch("outputs", str(uri), url, "outputs", False)],
                credentials,
                None,
            )
        assert len(requests_seen) == 1, requests_seen  # the guard refused it: nothing reached it
    finally:
        server.shutdown()
        server.server_close()
