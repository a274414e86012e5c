"""The address an object storage client connects to for an endpoint the user named is the
address checked: a forward proxy on loopback, in the process that runs the transfers, through
which such a client makes every connection (obstore's ``proxy_url``: the library offers no
resolver hook).

Without it, the submit's check of ``AWS_ENDPOINT_URL`` (``objectstore.check_endpoint``)
resolves the name, and the client library resolves it again itself: a name whose answers change
between the two (DNS rebinding: a public address first, ``127.0.0.1`` or ``169.254.169.254``
next) would reach an address the check refused.

The proxy listens on loopback, where every local account can connect to it: each client
(each object storage client made for an endpoint, :func:`route`) gets a secret of its own, which
its proxy URL carries (``http://ma:SECRET@127.0.0.1:PORT``: the client sends it as
``Proxy-Authorization: Basic``, in its ``CONNECT`` and in its plain http requests alike).  The
proxy keeps only the secrets' SHA-256 digests, never a secret: none is in its state, its
answers or a repr.

Rules, in order, for each connection the proxy accepts:

1. Until its first request's head has arrived whole, a connection is *pending*: read by one
   thread of the proxy's own (no thread per connection), at most :data:`MAX_PENDING` of them
   (one more drops the oldest pending one of the local account holding the most of them, its
   account asked of the kernel by the connection's addresses (:func:`peer_account`): so
   connections that never finish their head, however fast another account opens them, cannot
   keep a client's fresh one out), each for at most :data:`HEAD_TIMEOUT` seconds from its
   accept (408), however slowly its bytes drip, and at most :data:`MAX_HEAD` bytes (431).
2. The head must carry a client's secret (``Proxy-Authorization: Basic``, the password part),
   compared in constant time with every client's digest: else 407 and closed, before it counts
   against any bound of the relayed connections.
3. The head names the target: ``CONNECT host:port`` (https: the tunnel carries the client's own
   TLS, whose name and certificate check stay the endpoint's) or an absolute-form request
   ``METHOD http://host[:port]/...`` (http: forwarded as it is, Host header included, the
   ``Proxy-*`` headers taken out).  A target other than the one that client was made for is
   refused (403): the proxy is no open relay for other processes of the machine.
4. At most :data:`MAX_CONNECTIONS` relayed connections at a time, :data:`MAX_PER_CLIENT` of
   them one client's (more: 503).
5. The target's name is resolved once (:func:`checked_addresses`); any answer that is a
   loopback, link-local, private, reserved or multicast address (or an IPv6 address carrying
   one, :func:`is_refused`) refuses the connection (403, and :func:`refusal` keeps why for the
   client's error); else the proxy connects to the first address of that same answer, within
   :data:`CONNECT_TIMEOUT` seconds.
6. Bytes are then relayed both ways until either side closes or the connection has been idle
   for :data:`IDLE_TIMEOUT` seconds (a side that reads nothing for that long ends it too).

A plain http endpoint's later requests on a connection kept open are relayed as they come
(the relay does not parse them), ``Proxy-Authorization`` included: that endpoint may learn its
own client's secret, which reaches only that endpoint, at most :data:`MAX_PER_CLIENT`
connections at a time.  An https endpoint's tunnel carries the client's TLS only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import select
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from .errors import AddressRefused

#: seconds a relayed connection may stay idle (the client's pooled connections close sooner)
IDLE_TIMEOUT = 300.0
#: relayed connections at the same time at most (rule 4)
MAX_CONNECTIONS = 256
#: relayed connections of one client at the same time at most (rule 4: obstore puts or gets 16
#: objects at a time, and its retries open more)
MAX_PER_CLIENT = 32
#: connections whose head has not arrived yet, at most (rule 1: one more drops the oldest)
MAX_PENDING = 256
#: seconds from a connection's accept by which its first request's head (and the client's
#: secret in it) must have arrived whole (rule 1): a client sends it at once
HEAD_TIMEOUT = 5.0
#: seconds a connection to the target may take to open (rule 5)
CONNECT_TIMEOUT = 15.0
#: bytes a first request's head may hold (its line and headers)
MAX_HEAD = 16 << 10
#: clients (secrets) kept, the most recently made or used ones: a client keeps its secret while
#: its transfers go on, however many other clients are made meanwhile
MAX_ROUTES = 256
#: seconds a refusal is kept for the client's error
REFUSAL_KEPT = 120.0
_BUFFER = 256 << 10
#: the user name of the proxy URLs (the secret is the password; the name is not checked)
_USER = "ma"


#: an address the service sends no request to (the message names the name and address)
Refused = AddressRefused


#: IPv6 networks whose last 32 bits are an IPv4 address a translator reaches (NAT64's
#: well-known and local-use prefixes, the deprecated IPv4-compatible form)
_EMBEDDING = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96"))


def is_refused(address: str) -> bool:
    """Whether ``address`` is loopback, link-local, private, reserved or multicast; an IPv6
    address that carries an IPv4 address (mapped, IPv4-compatible, NAT64, 6to4, Teredo) counts
    as that IPv4 address too: a translator on the way (a cloud's NAT64 gateway) would reach it."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6:
        carried = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
        carried += [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) for net in _EMBEDDING if ip in net]
        if any(v4 is not None and is_refused(str(v4)) for v4 in carried):
            return True
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def checked_addresses(host: str, port: int) -> list[tuple]:
    """Rule 5: ``host`` resolved once; the ``getaddrinfo`` entries, every one a public address.

    Raises:
        Refused: an answer is a refused address (naming it).
        OSError: the name does not resolve.
    """
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    for entry in found:
        address = str(entry[4][0])
        if is_refused(address):
            raise Refused(
                f"{host[:200]} is {address.split('%')[0]}, a loopback, link-local, private or reserved "
                "address: the service sends no request there unless the administrator names the "
                "endpoint in [storage] allow_endpoints of cluster.toml"
            )
    return found


@dataclass(eq=False)
class _Client:
    """One client's target and its relayed connections now; ``digest`` is its secret's SHA-256
    (the secret itself is never kept)."""

    digest: bytes = field(repr=False)
    host: str
    port: int
    used: float
    active: int = 0


@dataclass(eq=False)
class _Pending:
    """A connection whose first request's head has not arrived whole yet (rule 1), and the local
    account that opened it (None: not known)."""

    conn: socket.socket
    deadline: float
    account: int | None = None
    data: bytes = b""


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF


def peer_account(conn: socket.socket) -> int | None:
    """The uid of the local account whose socket is the other end of the loopback TCP
    connection ``conn`` (the kernel's socket table, one exact look-up by the connection's
    addresses: ``sock_diag``); None where it cannot be told (not IPv4 loopback, ended already)."""
    try:
        (local, local_port), (peer, peer_port) = conn.getsockname(), conn.getpeername()
        if not peer.startswith("127."):
            return None
        # the peer's socket: its source is our peer address, its destination our own address
        sockid = struct.pack(
            "!HH16s16s",
            peer_port,
            local_port,
            socket.inet_aton(peer).ljust(16, b"\0"),
            socket.inet_aton(local).ljust(16, b"\0"),
        ) + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
        request = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(header + request)
            answer = nl.recv(4096)
    except (OSError, ValueError):
        return None
    if len(answer) < 16 + 72 or struct.unpack_from("=H", answer, 4)[0] == _NLMSG_ERROR:
        return None
    return struct.unpack_from("=I", answer, 16 + 64)[0]  # inet_diag_msg.idiag_uid


class _Proxy:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: list[_Client] = []
        self._refusals: dict[str, tuple[float, str]] = {}
        self._active = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._gate, name="ma-endpoint-guard", daemon=True).start()

    def route(self, host: str, port: int) -> str:
        """A new client of ``host:port``: its secret (rule 2), accepted for that target only (rule 3)."""
        secret = secrets.token_urlsafe(32)  # URL-safe: it goes into the proxy URL as it is
        client = _Client(hashlib.sha256(secret.encode()).digest(), host.lower(), port, time.monotonic())
        with self._lock:
            self._clients.append(client)
            while len(self._clients) > MAX_ROUTES:  # the least recently used idle one goes first
                self._clients.remove(min(self._clients, key=lambda c: (c.active > 0, c.used)))
        return secret

    def refusal(self, host: str) -> str | None:
        with self._lock:
            kept = self._refusals.get(host.lower())
        return kept[1] if kept and time.monotonic() - kept[0] <= REFUSAL_KEPT else None

    def _gate(self) -> None:
        """Rule 1: accepts connections and reads their heads, one thread for all of them."""
        watch = select.poll()  # poll, not select: descriptors may be numbered 1024 and more
        watch.register(self._listener.fileno(), select.POLLIN)
        pending: dict[int, _Pending] = {}  # by descriptor, the oldest first
        while True:
            now = time.monotonic()
            wait = min((p.deadline for p in pending.values()), default=now + 60.0) - now
            for fd, _ in watch.poll(max(0, int(wait * 1000) + 1)):
                if fd == self._listener.fileno():
                    self._take(watch, pending)
                elif fd in pending:
                    self._read(watch, pending, fd)
            now = time.monotonic()
            for fd in [fd for fd, p in pending.items() if p.deadline <= now]:
                _answer(self._drop(watch, pending, fd), 408, "request head too slow")

    @staticmethod
    def _drop(watch, pending: dict[int, _Pending], fd: int) -> socket.socket:
        watch.unregister(fd)
        return pending.pop(fd).conn

    def _take(self, watch, pending: dict[int, _Pending]) -> None:
        """Rule 1: the connections waiting to be accepted (a bounded batch: the heads of those
        already pending are read in between)."""
        for _ in range(64):
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors, say: the proxy goes on once some are back
                time.sleep(0.1)
                return
            conn.setblocking(False)
            account = peer_account(conn)
            if len(pending) >= MAX_PENDING:  # the oldest one of the account that holds the most
                most = Counter(p.account for p in pending.values()).most_common(1)[0][0]
                oldest = next(fd for fd, p in pending.items() if p.account == most)
                self._drop(watch, pending, oldest).close()
            pending[conn.fileno()] = _Pending(conn, time.monotonic() + HEAD_TIMEOUT, account)
            watch.register(conn.fileno(), select.POLLIN)
            self._read(watch, pending, conn.fileno())  # a client's head is there already, mostly

    def _read(self, watch, pending: dict[int, _Pending], fd: int) -> None:
        waiting = pending[fd]
        try:
            chunk = waiting.conn.recv(MAX_HEAD + 1)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(watch, pending, fd).close()
            return
        waiting.data += chunk
        if b"\r\n\r\n" in waiting.data:
            conn = self._drop(watch, pending, fd)
            try:
                self._admit(conn, waiting.data)
            except Exception:  # noqa: BLE001 (this connection ends; the gate goes on for the others)
                conn.close()
        elif len(waiting.data) > MAX_HEAD:
            _answer(self._drop(watch, pending, fd), 431, "request head too large")

    def _client_of(self, head: bytes) -> _Client | None:
        """Rule 2: the client whose secret the head carries, if any."""
        presented = _presented_secret(head)
        if presented is None:
            return None
        digest = hashlib.sha256(presented).digest()
        found = None
        with self._lock:
            for client in self._clients:  # every one compared, in constant time: no early end
                if hmac.compare_digest(client.digest, digest):
                    found = client
        return found

    def _admit(self, conn: socket.socket, head: bytes) -> None:
        """Rules 2 to 4 for a whole head; the connection goes to a relay thread of its own."""
        client = self._client_of(head)
        if client is None:
            _answer(conn, 407, "proxy authentication required", 'Proxy-Authenticate: Basic realm="ma"\r\n')
            return
        method, host, port = _target(head)
        if host is None:
            _answer(conn, 400, "not a proxy request")
            return
        if (host.lower(), port) != (client.host, client.port):
            _answer(conn, 403, "not the endpoint of this client")
            return
        with self._lock:
            full = self._active >= MAX_CONNECTIONS or client.active >= MAX_PER_CLIENT
            if not full:
                self._active += 1
                client.active += 1
                client.used = time.monotonic()  # in use: other clients are forgotten first
        if full:
            _answer(conn, 503, "too many connections")
            return
        try:
            threading.Thread(
                target=self._serve,
                args=(conn, _without_proxy_headers(head), method, host, port, client),
                name="ma-endpoint-relay",
                daemon=True,
            ).start()
        except RuntimeError:  # no thread to be had now: this connection only is refused
            self._release(client)
            _answer(conn, 503, "no thread for the connection")

    def _release(self, client: _Client) -> None:
        with self._lock:
            self._active -= 1
            client.active -= 1

    def _serve(
        self, conn: socket.socket, head: bytes, method: str, host: str, port: int, client: _Client
    ) -> None:
        """Rules 5 and 6 for one admitted connection."""
        upstream = None
        try:
            conn.settimeout(CONNECT_TIMEOUT)
            try:
                found = checked_addresses(host, port)
            except Refused as exc:
                with self._lock:
                    self._refusals[host.lower()] = (time.monotonic(), str(exc))
                    for old in [
                        h for h, (at, _) in self._refusals.items() if time.monotonic() - at > REFUSAL_KEPT
                    ]:
                        del self._refusals[old]
                _answer(conn, 403, "refused address")
                return
            except OSError:
                _answer(conn, 502, "cannot resolve")
                return
            family, kind, proto, _, address = found[0]
            upstream = socket.socket(family, kind, proto)
            upstream.settimeout(CONNECT_TIMEOUT)
            try:
                upstream.connect(address)  # the address checked above, never a new lookup
            except OSError:
                _answer(conn, 502, "cannot connect")
                return
            if method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(head)
            _relay(conn, upstream)
        except OSError:
            pass
        finally:
            for s in (conn, upstream):
                if s is not None:
                    s.close()
            self._release(client)


def _header_lines(head: bytes) -> tuple[list[bytes], bytes]:
    """The head's lines up to its blank line, and what came after it (a body's first bytes)."""
    lines, _, after = head.partition(b"\r\n\r\n")
    return lines.split(b"\r\n"), after


def _presented_secret(head: bytes) -> bytes | None:
    """Rule 2: the password of the head's ``Proxy-Authorization: Basic`` header, if any."""
    for line in _header_lines(head)[0][1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"proxy-authorization":
            scheme, _, encoded = value.strip().partition(b" ")
            if scheme.lower() != b"basic":
                return None
            try:
                decoded = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                return None
            user, sep, secret = decoded.partition(b":")
            return secret if sep else None
    return None


def _without_proxy_headers(head: bytes) -> bytes:
    """Rule 3: the head as the endpoint gets it (a plain http request): no ``Proxy-*`` header,
    the client's secret among them."""
    lines, after = _header_lines(head)
    kept = [lines[0], *(x for x in lines[1:] if not x.lstrip().lower().startswith(b"proxy-"))]
    return b"\r\n".join(kept) + b"\r\n\r\n" + after


def _target(head: bytes) -> tuple[str, str | None, int]:
    """Rule 3: (method, host, port) of the first request line; host None: not a proxy request."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3:
        return "", None, 0
    method, target, _ = parts
    if method == "CONNECT":
        authority, default = target, 443
    elif target.startswith("http://"):
        authority, default = target[len("http://") :].split("/", 1)[0], 80
    else:
        return method, None, 0
    host, sep, port = authority.rpartition(":")
    # ASCII digits only: str.isdigit takes '²', which int() refuses
    if not sep or not (port.isascii() and port.isdigit()) or "]" in port:
        host, port = authority, str(default)
    host = host.strip("[]")
    if not host or not 0 < int(port) < 65536:
        return method, None, 0
    return method, host, int(port)


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Rule 6: bytes both ways until a side closes or nothing moves for :data:`IDLE_TIMEOUT`
    (a side that stops reading fails the send to it within that time: :class:`TimeoutError`)."""
    for s in (a, b):
        # not None: a blocking send to an endpoint (or client) that never reads would hold the
        # thread, and one of the MAX_CONNECTIONS places every user shares, for ever
        s.settimeout(IDLE_TIMEOUT)
    # poll, not select: select refuses a descriptor numbered 1024 or more (a service whose
    # descriptor limit is raised holds that many under load), failing every transfer
    peers = {a.fileno(): (a, b), b.fileno(): (b, a)}
    watch = select.poll()
    for fd in peers:
        watch.register(fd, select.POLLIN)
    while True:
        ready = watch.poll(IDLE_TIMEOUT * 1000)
        if not ready:
            return
        for fd, _ in ready:
            source, sink = peers[fd]
            data = source.recv(_BUFFER)
            if not data:
                return
            sink.sendall(data)


def _answer(conn: socket.socket, status: int, text: str, headers: str = "") -> None:
    body = text.encode()
    try:
        conn.sendall(
            f"HTTP/1.1 {status} {text}\r\n{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
    except OSError:
        pass
    finally:
        conn.close()


_proxy: _Proxy | None = None
_proxy_lock = threading.Lock()


def route(host: str, port: int) -> str:
    """The proxy URL (``http://ma:SECRET@127.0.0.1:<port>``) of a new client of ``host:port``,
    with a secret of its own (rule 2) for that target only (rule 3); the proxy is started on the
    first call.  The URL is a secret: it goes to the client's options, never to a log or error."""
    global _proxy
    with _proxy_lock:
        if _proxy is None:
            _proxy = _Proxy()
        proxy = _proxy
    return f"http://{_USER}:{proxy.route(host, port)}@127.0.0.1:{proxy.port}"


def refusal(host: str) -> str | None:
    """Why the proxy last refused a connection to ``host`` (within :data:`REFUSAL_KEPT` seconds)."""
    with _proxy_lock:
        proxy = _proxy
    return proxy.refusal(host) if proxy is not None else None
