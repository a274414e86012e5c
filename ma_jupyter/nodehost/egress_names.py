"""The policy's host names, looked up ahead of the launches that need them (``[network] egress``,
docs/network.md): a launch reads what is known and never waits on a name server.

:class:`Names` keeps each listed name's IPv4 addresses, looked up on threads of its own when the
name is first listed or asked for, then again every :data:`NAME_TTL` seconds; :data:`NAMES` is
the service's one cache (the local backend's launches and the Ray backend's, which sends the
addresses with each launch to its agents).  :mod:`.egress` turns what is known into an attempt's
gate (``gate_for``).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ..config import EgressRule

#: seconds one look-up of a policy's host name may take before a launch reports it unresolved
RESOLVE_TIMEOUT = 5.0
#: seconds a looked-up name's addresses are used before the background looks it up again
NAME_TTL = 60.0
#: seconds between the background's looks at the policy (names listed since, names to refresh)
NAME_REFRESH = 10.0
#: seconds a name's last addresses are still used while its look-ups fail (then it is left out)
NAME_STALE = 600.0
#: names the cache keeps at most (a policy lists at most 256; older ones are forgotten first)
NAME_CACHE_SIZE = 1024
#: addresses of one name an attempt's gate takes at most (the first, in order): a name's owner
#: can answer with thousands, each a rule of the gate and a line of every node's /etc/hosts
MAX_NAME_ADDRESSES = 32


def _look_up(name: str) -> tuple[str, ...]:
    """``name``'s IPv4 addresses (the service's resolver: its ``/etc/hosts``, its name servers),
    in order, at most one more than :data:`MAX_NAME_ADDRESSES` (that one says there were more)."""
    found = {info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)}
    return tuple(sorted(found, key=lambda a: ipaddress.IPv4Address(a))[: MAX_NAME_ADDRESSES + 1])


@dataclass
class _Looked:
    """What the cache knows of one name: its last addresses (None: never resolved), why its
    last look-up failed (None: it did not), when it was last resolved and last asked for."""

    addresses: tuple[str, ...] | None = None
    failure: str | None = None
    resolved_at: float = float("-inf")
    asked_at: float = float("-inf")
    pending: Future | None = None
    pending_since: float = float("-inf")


class Names:
    """The policy's host names, looked up ahead of the launches that need them: a launch reads
    what is here and never waits on a name server.

    1. A name is looked up when it is first asked for (:meth:`addresses` at a launch,
       :meth:`watch`'s policy in the background), then again once its addresses are
       :data:`NAME_TTL` seconds old, on a thread of the cache's own (woken at once for a name
       never seen, else every :data:`NAME_REFRESH` seconds).
    2. At most one look-up of a name runs at once, on a pool of 8 threads: a name server that
       never answers holds a pool thread, never a launch.
    3. A name whose refresh fails keeps its last addresses for :data:`NAME_STALE` seconds.
    4. A name never resolved is reported to the launch asking for it, with the reason (not yet
       looked up, still being looked up after :data:`RESOLVE_TIMEOUT` seconds, or the
       resolver's error).
    5. At most :data:`NAME_CACHE_SIZE` names are kept (the least recently asked for go first).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, _Looked] = {}
        self._wake = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._source: Callable[[], Iterable[EgressRule] | None] | None = None

    def watch(self, source: Callable[[], Iterable[EgressRule] | None]) -> None:
        """Keep the names of the policy ``source()`` says (read every :data:`NAME_REFRESH`
        seconds; an error reading it is ignored until it is fixed) looked up."""
        with self._lock:
            self._source = source
        self._start()

    def addresses(self, names: Iterable[str]) -> tuple[dict[str, tuple[str, ...]], list[str]]:
        """The addresses known now of each of ``names`` and a problem line for each name that
        has none (rule 4); never waits.  A name not known yet is looked up in the background."""
        now = time.monotonic()
        known: dict[str, tuple[str, ...]] = {}
        problems: list[str] = []
        new = False
        with self._lock:
            for name in names:
                looked = self._names.get(name)
                if looked is None:
                    looked = self._names[name] = _Looked()
                    new = True
                looked.asked_at = now
                if looked.addresses is not None and now - looked.resolved_at < NAME_STALE:
                    known[name] = looked.addresses
                elif looked.failure:
                    problems.append(f"{name}: does not resolve ({looked.failure})")
                elif looked.pending is not None and now - looked.pending_since >= RESOLVE_TIMEOUT:
                    problems.append(f"{name}: not resolved within {RESOLVE_TIMEOUT:g} s")
                else:
                    problems.append(
                        f"{name}: not looked up yet (it is now, in the background: the job's next "
                        "attempt gets it)"
                    )
            self._forget_oldest()
        if new:
            self._start()
            self._wake.set()
        return known, problems

    def wait(self, names: Iterable[str], timeout: float) -> None:
        """Wait until each of ``names`` was looked up once (or ``timeout`` seconds): for a
        caller off the launch path (a restarted service reopening a gate, tests)."""
        names = list(names)
        self.addresses(names)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if all(
                    (n := self._names.get(name)) is None or n.addresses is not None or n.failure
                    for name in names
                ):
                    return
            time.sleep(0.05)

    def _forget_oldest(self) -> None:
        if len(self._names) > NAME_CACHE_SIZE:
            by_age = sorted(self._names, key=lambda name: self._names[name].asked_at)
            for name in by_age[: len(self._names) - NAME_CACHE_SIZE]:
                del self._names[name]

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._pool = self._pool or ThreadPoolExecutor(max_workers=8, thread_name_prefix="egress-names")
            self._thread = threading.Thread(target=self._run, name="egress-names", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            source = self._source
            if source is not None:
                try:
                    rules = source() or ()
                    now = time.monotonic()
                    with self._lock:
                        for rule in rules:
                            if rule.host:
                                self._names.setdefault(rule.host, _Looked()).asked_at = now
                        self._forget_oldest()
                except Exception:  # noqa: BLE001 (a policy being edited: read again next time)
                    pass
            try:
                self._refresh()
            except RuntimeError:  # the interpreter is ending: its executors take no more work
                return
            self._wake.wait(NAME_REFRESH)
            self._wake.clear()

    def _refresh(self) -> None:
        """Start a look-up of each name never resolved or older than :data:`NAME_TTL` (rule 1)."""
        now = time.monotonic()
        started: list[tuple[str, Future]] = []
        with self._lock:
            due = [
                name
                for name, looked in self._names.items()
                if looked.pending is None
                and now - looked.resolved_at >= NAME_TTL
                and (looked.failure is None or now - looked.pending_since >= NAME_REFRESH)
            ]
            for name in due:
                looked = self._names[name]
                assert self._pool is not None
                looked.pending = self._pool.submit(_look_up, name)
                looked.pending_since = now
                started.append((name, looked.pending))
        # outside the lock: a look-up already done runs its callback here, at once, and the
        # callback takes the lock
        for name, future in started:
            future.add_done_callback(lambda done, name=name: self._record(name, done))

    def _record(self, name: str, future: Future) -> None:
        with self._lock:
            looked = self._names.get(name)
            if looked is None:
                return
            looked.pending = None
            try:
                looked.addresses = future.result()
            except Exception as exc:  # noqa: BLE001 (the resolver's error, whatever its kind, is the reason)
                looked.failure = str(exc) or type(exc).__name__
                return
            looked.failure = None
            looked.resolved_at = time.monotonic()


#: the service's one cache of the policy's names
NAMES = Names()
