"""The address an object storage client connects to for an endpoint the user named is the
address checked: a forward proxy on loopback, in the process that runs the transfers, through
which such a client makes every connection (obstore's ``proxy_url``: the library offers no
resolver hook).

Without it, the submit's check of ``AWS_ENDPOINT_URL`` (``objectstore.check_endpoint``)
resolves the name, and the client library resolves it again itself: a name whose answers change
between the two (DNS rebinding: a public address first, ``127.0.0.1`` or ``169.254.169.254``
next) would reach an address the check refused.

Rules, in order, for each connection the proxy accepts:

1. Its first request names the target: ``CONNECT host:port`` (https: the tunnel carries the
   client's own TLS, whose name and certificate check stay the endpoint's) or an absolute-form
   request ``METHOD http://host[:port]/...`` (http: forwarded as it is, Host header included).
   A target no client was routed to (:func:`route`) is refused (403): the proxy is no open
   relay for other processes of the machine.
2. The target's name is resolved once (:func:`checked_addresses`); any answer that is a
   loopback, link-local, private, reserved or multicast address (or an IPv6 address carrying
   one, :func:`is_refused`) refuses the connection (403,
   and :func:`refusal` keeps why for the client's error); else the proxy connects to the first
   address of that same answer.
3. Bytes are then relayed both ways until either side closes or the connection has been idle
   for :data:`IDLE_TIMEOUT` seconds (a side that reads nothing for that long ends it too); at
   most :data:`MAX_CONNECTIONS` at a time (more: 503).  The first request's head must arrive
   whole within :data:`HEAD_TIMEOUT` seconds (408), however slowly its bytes drip.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import threading
import time

from .errors import AddressRefused

#: seconds a relayed connection may stay idle (the client's pooled connections close sooner)
IDLE_TIMEOUT = 300.0
#: relayed connections at the same time at most
MAX_CONNECTIONS = 256
#: seconds the first request's head may take to arrive, and a connection to the target to open
HEAD_TIMEOUT = 15.0
#: bytes a first request's head may hold (its line and headers)
MAX_HEAD = 16 << 10
#: targets kept routable (the most recently routed or used ones: a client keeps its endpoint's
#: route while its transfers go on, however many other endpoints are routed meanwhile)
MAX_ROUTES = 256
#: seconds a refusal is kept for the client's error
REFUSAL_KEPT = 120.0
_BUFFER = 256 << 10


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
    """Rule 2: ``host`` resolved once; the ``getaddrinfo`` entries, every one a public address.

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


class _Proxy:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, int], float] = {}
        self._refusals: dict[str, tuple[float, str]] = {}
        self._active = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="ma-endpoint-guard", daemon=True).start()

    def route(self, host: str, port: int) -> None:
        with self._lock:
            self._routes[(host.lower(), port)] = time.monotonic()
            while len(self._routes) > MAX_ROUTES:
                del self._routes[min(self._routes, key=self._routes.__getitem__)]

    def refusal(self, host: str) -> str | None:
        with self._lock:
            kept = self._refusals.get(host.lower())
        return kept[1] if kept and time.monotonic() - kept[0] <= REFUSAL_KEPT else None

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # out of descriptors, say: the proxy goes on once some are back
                time.sleep(0.1)
                continue
            with self._lock:
                full = self._active >= MAX_CONNECTIONS
                if not full:
                    self._active += 1
            if full:
                _answer(conn, 503, "too many connections")
                continue
            try:
                threading.Thread(
                    target=self._serve, args=(conn,), name="ma-endpoint-relay", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had now: this connection only is refused
                with self._lock:
                    self._active -= 1
                _answer(conn, 503, "no thread for the connection")

    def _serve(self, conn: socket.socket) -> None:
        upstream = None
        try:
            conn.settimeout(HEAD_TIMEOUT)
            head = _read_head(conn)
            if head is None:
                return
            method, host, port = _target(head)
            if host is None:
                _answer(conn, 400, "not a proxy request")
                return
            with self._lock:
                routed = (host.lower(), port) in self._routes
                if routed:  # in use: the routes of other endpoints are forgotten first
                    self._routes[(host.lower(), port)] = time.monotonic()
            if not routed:
                _answer(conn, 403, "not an endpoint of this service's clients")
                return
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
            upstream.settimeout(HEAD_TIMEOUT)
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
            with self._lock:
                self._active -= 1


def _read_head(conn: socket.socket) -> bytes | None:
    """The first request's head (and whatever of its body came with it), at most :data:`MAX_HEAD`."""
    data = b""
    # one deadline for the whole head: a byte now and then must not hold the thread on
    deadline = time.monotonic() + HEAD_TIMEOUT
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            _answer(conn, 431, "request head too large")
            return None
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            conn.settimeout(left)
            chunk = conn.recv(MAX_HEAD)
        except TimeoutError:
            _answer(conn, 408, "request head too slow")
            return None
        if not chunk:
            return None
        data += chunk
    conn.settimeout(HEAD_TIMEOUT)  # for the answers that follow, not what was left of the head's
    return data


def _target(head: bytes) -> tuple[str, str | None, int]:
    """Rule 1: (method, host, port) of the first request line; host None: not a proxy request."""
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
    """Rule 3: bytes both ways until a side closes or nothing moves for :data:`IDLE_TIMEOUT`
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


def _answer(conn: socket.socket, status: int, text: str) -> None:
    body = text.encode()
    try:
        conn.sendall(
            f"HTTP/1.1 {status} {text}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
    except OSError:
        pass
    finally:
        conn.close()


_proxy: _Proxy | None = None
_proxy_lock = threading.Lock()


def route(host: str, port: int) -> str:
    """The proxy URL (``http://127.0.0.1:<port>``) a client of ``host:port`` connects through;
    the proxy (started on the first call) accepts that target from now on (rule 1)."""
    global _proxy
    with _proxy_lock:
        if _proxy is None:
            _proxy = _Proxy()
        proxy = _proxy
    proxy.route(host, port)
    return f"http://127.0.0.1:{proxy.port}"


def refusal(host: str) -> str | None:
    """Why the proxy last refused a connection to ``host`` (within :data:`REFUSAL_KEPT` seconds)."""
    with _proxy_lock:
        proxy = _proxy
    return proxy.refusal(host) if proxy is not None else None
