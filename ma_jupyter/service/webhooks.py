"""Each user's own notification webhook: where their jobs' alerts and terminal states go.

The administrator's ``[notify]`` command (:mod:`.notify`) hears every event; a user may name a
webhook of their own (``PUT /users/me/notify``), kept with the user in the store.  The contract:

1. A webhook is an ``http://`` or ``https://`` URL with a host, at most :data:`MAX_URL` characters
   (:func:`check_url`).  The service never runs a user's command: a webhook is data, not code.
   Its host must resolve (within :data:`TIMEOUT` seconds) to public addresses only: loopback,
   link-local (169.254.169.254 included), private, shared, reserved, multicast and unspecified
   addresses are refused, at ``PUT`` and again at each delivery (a name may resolve elsewhere by
   then), unless the administrator's ``[notify] webhook_allow`` (:func:`ma_jupyter.config.
   load_webhook_allow`) names the URL's ``HOST`` or ``HOST:PORT``.  A delivery connects to the
   address it checked, never to a second lookup's.
2. A user's webhook hears only the events of the jobs that user created (``user`` of the event:
   the job's creator), the same JSON object the admin's command reads (:mod:`.notify` rule 3),
   never another user's, never a node's alert.
3. ``push`` only queues: it never waits on the network nor reads the store, so nothing a webhook
   does (an unreachable host, a server that never answers) reaches the supervisor.
4. :data:`WORKERS` threads deliver, each reading a user's current webhook from the store when an
   event's turn comes (a user without one: the event is dropped).  Users take turns (round
   robin), one try per turn, one try of a user at a time (each user's events stay in order); a
   try is one ``POST`` with ``Content-Type: application/json``, no redirect followed, the
   response's body not read, and ends at most :data:`TIMEOUT` seconds after it began, name
   lookup, connection, TLS, request and the response's status line and headers together (a
   timer shuts the socket down; a server trickling bytes gains nothing).  A 2xx status delivers;
   anything else is tried again, at most :data:`TRIES` times in all, after :data:`RETRY_AFTER`
   seconds (doubling), then dropped with a log line; a destination refused by rule 1 is dropped
   at once.  So a user's event waits for others' webhooks at most ``TIMEOUT`` seconds per
   :data:`WORKERS` other users with events waiting, however slow their servers are.
5. At most :data:`MAX_PENDING_PER_USER` events wait per user and :data:`MAX_USERS` users have
   events waiting; past either bound the oldest waiting event (of that user; of a new user: the
   new event) is dropped with a log line.  Memory stays bounded whatever users and webhooks do.
6. ``service.log`` names a webhook by its ``scheme://host:port`` only: never its path, query or
   user information, which may hold a secret.
"""

from __future__ import annotations

import collections
import http.client
import ipaddress
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from ..errors import InvalidSpec, WebhookRefused

log = logging.getLogger(__name__)

#: the longest webhook URL (rule 1)
MAX_URL = 2048
#: seconds one POST may take, from the name's lookup to the response's headers (rules 1 and 4)
TIMEOUT = 5.0
#: threads delivering at once, each for another user (rule 4)
WORKERS = 4
#: tries of one event, the first included (rule 4)
TRIES = 3
#: seconds before the second try; each later one waits twice as long (rule 4)
RETRY_AFTER = 2.0
#: events that may wait for one user (rule 5)
MAX_PENDING_PER_USER = 100
#: users that may have events waiting at once (rule 5)
MAX_USERS = 1000


#: a webhook's destination that rule 1 refuses (the message says why and what to do)
Refused = WebhookRefused


def check_url(url: str, allow: Sequence[str] = (), timeout: float = TIMEOUT) -> str:
    """Rule 1: ``url`` stripped, or InvalidSpec saying what a webhook must be (a destination
    refused names ``[notify] webhook_allow``).  ``allow``: :func:`ma_jupyter.config.
    load_webhook_allow`; the name's lookup waits at most ``timeout`` seconds."""
    url = url.strip()
    if len(url) > MAX_URL:
        raise InvalidSpec(f"the webhook URL has {len(url)} characters; at most {MAX_URL}", field="webhook")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidSpec(
            f"{url[:80]!r} is not a webhook URL: give http://HOST[:PORT]/PATH or https://...",
            field="webhook",
        )
    try:
        parts.port  # noqa: B018 -- a port out of range raises here
    except ValueError as exc:
        raise InvalidSpec(
            f"{url[:80]!r} is not a webhook URL ({exc}): give http://HOST[:PORT]/PATH or https://...",
            field="webhook",
        ) from None
    try:
        destination(url, allow, timeout)
    except (Refused, OSError) as exc:
        raise InvalidSpec(f"webhook {where(url)}: {exc}", field="webhook") from None
    return url


def where(url: str) -> str:
    """Rule 6: ``scheme://host:port`` of ``url``, nothing that may hold a secret."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = "?"
    host = parts.hostname or "?"
    return f"{parts.scheme}://{'[' + host + ']' if ':' in host else host}:{port}"


def destination(url: str, allow: Sequence[str] = (), timeout: float = TIMEOUT) -> str:
    """Rule 1: the address ``url``'s host resolves to that a POST may connect to.

    Raises:
        Refused: the host resolves to an address rule 1 refuses, and ``allow`` names neither
            ``HOST`` nor ``HOST:PORT``.
        OSError: the name does not resolve (TimeoutError: not within ``timeout`` seconds).
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    allowed = host in allow or f"{host}:{port}" in allow or f"[{host}]:{port}" in allow
    addresses = _resolve(host, port, timeout)
    if allowed:
        return addresses[0]
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not ip.is_global or ip.is_multicast:
            raise Refused(
                f"{host} resolves to {ip}, a loopback, link-local, private, multicast or unspecified "
                f'address; give a public one, or ask the administrator to name "{host}:{port}" in '
                "[notify] webhook_allow of cluster.toml"
            )
    return addresses[0]


def _resolve(host: str, port: int, timeout: float) -> list[str]:
    """The addresses of ``host``, looked up in a thread of its own so that a resolver that
    never answers costs this call at most ``timeout`` seconds (the thread ends by the
    resolver's own timeouts)."""
    found: list = []

    def lookup():
        try:
            found.append([info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)])
        except OSError as exc:
            found.append(exc)

    thread = threading.Thread(target=lookup, name="webhook-lookup", daemon=True)
    thread.start()
    thread.join(timeout)
    if not found:
        raise TimeoutError(f"looking up {host} took more than {timeout:g} s")
    if isinstance(found[0], OSError):
        raise found[0]
    if not found[0]:
        raise OSError(f"{host} has no address")
    return found[0]


class _Cutter:
    """Shuts down the sockets of one POST once its deadline passes (rule 4): a blocked read or
    handshake then ends at once, whatever the server trickles."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.cut = False

    def hold(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._socks.append(sock)
            if self.cut:
                self._shut(sock)
        return sock

    def now(self) -> None:
        with self._lock:
            self.cut = True
            for sock in self._socks:
                self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already, or never connected


class _Connection(http.client.HTTPConnection):
    """An HTTP(S) connection to the address rule 1 checked (the Host header and TLS's server
    name stay the URL's host), each socket held by a :class:`_Cutter`."""

    def __init__(self, host, port, address, tls, cutter, timeout):
        super().__init__(host, port, timeout=timeout)
        self.address, self.tls, self.cutter = address, tls, cutter

    def connect(self):
        sock = self.cutter.hold(socket.create_connection((self.address, self.port), self.timeout))
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(
                sock, server_hostname=self.host, do_handshake_on_connect=False
            )
            self.cutter.hold(sock)
            sock.do_handshake()
        self.sock = sock


def post(url: str, body: bytes, timeout: float = TIMEOUT, allow: Sequence[str] = ()) -> int:
    """One POST of ``body`` to ``url`` (rules 1 and 4); its status, at most ``timeout``
    seconds after the call.  Raises Refused (rule 1), OSError or http.client's errors when
    no status came (TimeoutError: the deadline passed)."""
    start = time.monotonic()
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = destination(url, allow, timeout)
    left = timeout - (time.monotonic() - start)
    if left <= 0:
        raise TimeoutError(f"no answer within {timeout:g} s")
    cutter = _Cutter()
    conn = _Connection(parts.hostname, port, address, parts.scheme == "https", cutter, left)
    timer = threading.Timer(left, cutter.now)
    timer.daemon = True
    timer.start()
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request(
            "POST",
            path,
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": "ma_jupyter-notify"},
        )
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        if cutter.cut:
            raise TimeoutError(f"no answer within {timeout:g} s") from None
        raise
    finally:
        timer.cancel()
        conn.close()


class UserWebhooks:
    """Delivers each user's events to that user's webhook (see the module's rules).

    Args:
        webhook_of: the user's current webhook URL or None (read in a delivery thread).
        allow: the administrator's ``[notify] webhook_allow`` (rule 1), read at each try so
            that an edit of ``cluster.toml`` applies at once.
        timeout, tries, retry_after, workers, per_user, max_users: rules 4 and 5.
    """

    def __init__(
        self,
        webhook_of: Callable[[str], str | None],
        *,
        allow: Callable[[], Sequence[str]] = tuple,
        timeout: float = TIMEOUT,
        tries: int = TRIES,
        retry_after: float = RETRY_AFTER,
        workers: int = WORKERS,
        per_user: int = MAX_PENDING_PER_USER,
        max_users: int = MAX_USERS,
    ):
        self.webhook_of = webhook_of
        self.allow = allow
        self.timeout = timeout
        self.tries = tries
        self.retry_after = retry_after
        self.workers = workers
        self.per_user = per_user
        self.max_users = max_users
        # user -> [event, tries so far, not before (monotonic)], oldest first
        self._pending: dict[str, collections.deque[list]] = {}
        self._turns: collections.deque[str] = collections.deque()
        self._busy: set[str] = set()  # users whose try is under way (rule 4: one at a time)
        self._cond = threading.Condition()
        self._closed = False
        self._threads: list[threading.Thread] = []

    def push(self, event: dict) -> None:
        """Queue ``event`` for its user's webhook (rules 2, 3 and 5); returns at once."""
        user = event.get("user")
        if not user or not event.get("job"):
            return  # rule 2: the service's own jobs and the nodes' alerts have no user to tell
        with self._cond:
            if self._closed:
                return
            queue = self._pending.get(user)
            if queue is None:
                if len(self._pending) >= self.max_users:
                    log.warning("webhooks: %d users have events waiting; dropped %s's", self.max_users, user)
                    return
                queue = self._pending[user] = collections.deque()
                self._turns.append(user)
            if len(queue) >= self.per_user:
                dropped = queue.popleft()[0]
                log.warning("webhooks: %s has %d events waiting; dropped %s", user, self.per_user, dropped)
            queue.append([event, 0, 0.0])
            if len(self._threads) < self.workers:
                thread = threading.Thread(target=self._deliver, name="user-webhooks", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads (waiting events are dropped; a POST under way ends by its deadline)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = list(self._threads)
        end = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    def _next(self) -> tuple[str, list] | float | None:
        """The next idle user's next due item (rule 4's round robin), its user then busy; else
        seconds until one is due, or None when nothing waits.  Called with the condition held."""
        now, soonest = time.monotonic(), None
        for _ in range(len(self._turns)):
            user = self._turns.popleft()
            self._turns.append(user)
            if user in self._busy:
                continue
            item = self._pending[user][0]
            if item[2] <= now:
                self._pending[user].popleft()
                if not self._pending[user]:
                    del self._pending[user]
                    self._turns.remove(user)
                self._busy.add(user)
                return user, item
            soonest = item[2] - now if soonest is None else min(soonest, item[2] - now)
        return soonest

    def _deliver(self) -> None:
        while True:
            with self._cond:
                found = self._next()
                while not isinstance(found, tuple) and not self._closed:
                    self._cond.wait(found)
                    found = self._next()
                if self._closed:
                    if isinstance(found, tuple):
                        self._busy.discard(found[0])
                    return
            user, item = found
            done = self._try(user, item)
            with self._cond:
                self._busy.discard(user)
                if not done:
                    item[1] += 1
                    if item[1] >= self.tries:
                        log.warning(
                            "webhooks: %s's webhook failed %d times; dropped %s", user, item[1], item[0]
                        )
                    else:
                        item[2] = time.monotonic() + self.retry_after * 2 ** (item[1] - 1)
                        queue = self._pending.get(user)  # back at the head of its queue: order kept
                        if queue is None:
                            queue = self._pending[user] = collections.deque()
                            self._turns.append(user)
                        queue.appendleft(item)
                self._cond.notify_all()

    def _try(self, user: str, item: list) -> bool:
        """One POST of the item's event; True once delivered (or when nothing is to be done,
        or rule 1 refuses the destination)."""
        try:
            url = self.webhook_of(user)
            allow = self.allow()
        except Exception as exc:  # the store or cluster.toml, read here: log, never end the thread
            log.warning("webhooks: cannot read %s's webhook or [notify] webhook_allow: %s", user, exc)
            return False
        if not url:
            return True
        try:
            status = post(url, (json.dumps(item[0]) + "\n").encode(), self.timeout, allow)
        except Refused as exc:
            log.warning("webhooks: %s's webhook %s refused; dropped %s: %s", user, where(url), item[0], exc)
            return True
        except (OSError, http.client.HTTPException) as exc:
            log.info("webhooks: %s's webhook %s: %s", user, where(url), exc)
            return False
        if 200 <= status < 300:
            return True
        log.info("webhooks: %s's webhook %s answered %d", user, where(url), status)
        return False
