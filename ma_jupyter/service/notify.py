"""The administrator's notification hook: ``[notify] command = "..."`` in ``cluster.toml``.

The seed's performance detection "notifies the user by mail"; a platform cannot know every site's
mail, chat or pager, so the service runs one command the administrator names for each event worth
telling (alerts, and every job's terminal state) and the command delivers it.

The contract, in order:

1. The command is an argv (``shlex`` words of the setting, never a shell: an administrator who
   wants one writes ``bash -c '...'``).  Without the setting nothing runs.
2. It runs as the service's account, outside every job and sandbox, in the service's home, with
   a small environment (``PATH``, ``HOME``, ``LANG``, ``MA_JUPYTER_HOME``): nothing of the
   service's secrets or of any job's environment.
3. Each event is one JSON object on the command's standard input (closed after it): ``kind``
   (``alert``, ``ended`` or ``coalesced``, rule 6), ``job``, ``name``, ``user``, ``status``,
   ``reason``, ``node`` (where one node is meant), ``time`` (ISO 8601, UTC) and ``address``:
   where the user asked for their events to go (``PUT /users/me/notify``'s ``address``, a mail
   address or a chat handle the command delivers to, read when the event is delivered; null
   when they named none, and for events of no user).  The seed mails the user; the command
   is the site's mailer, and the address says whom to mail.
4. Events are delivered one at a time from one thread of the service: a slow command delays the
   next notification, never a job.  A command running past :data:`TIMEOUT` is killed (its whole
   process group).
5. Each user's events wait in a queue of their own (the events of jobs without a creator in the
   service's own queue), and nodes marked faulty in one more.  The thread takes the nodes' alerts
   first, then one event of each user in turn (round robin), each user's in the order they
   happened: one user's thousands of jobs delay another's notification by one run of the command
   per waiting user, never by their number.
6. Nothing is dropped silently.  At most :data:`MAX_PENDING_PER_USER` events wait in one queue;
   past that its oldest event is folded into one ``coalesced`` event of that queue, delivered in
   the queue's next turn (before the events still waiting, which are newer): ``count`` (the events
   folded), ``kinds`` and ``statuses`` (how many of each), ``jobs`` (their job ids, the first
   :data:`MAX_FOLDED_IDS`; ``jobs_omitted`` counts the others) and ``nodes`` (likewise, for node
   alerts).  A terminal state or a faulty node is thus never lost, only told in a summary; the
   service's log says when a queue starts folding.
7. A command that cannot start, exits non-zero or times out is logged with its exit status and
   the end of its error output; the event is not retried.
8. Each event of a user's job also goes to that user's own webhook, if they named one
   (:mod:`.webhooks`), with or without the command.
9. No command a user names is ever run: the service runs the administrator's command only, as
   its own account, outside every sandbox, and a user's program run there would run with the
   service's rights.  A user's own delivery is their webhook (rule 8) or their address in the
   administrator's command's events (rule 3).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from .webhooks import UserWebhooks

log = logging.getLogger(__name__)

#: seconds one run of the command may take (rule 4)
TIMEOUT = 30.0
#: events that may wait in one user's queue before its oldest are folded (rule 6)
MAX_PENDING_PER_USER = 100
#: job ids (and node names) one ``coalesced`` event lists; the others are only counted (rule 6)
MAX_FOLDED_IDS = 1000

#: the queue of the nodes' alerts (rule 5): no user name can be this object
_NODES = object()


@dataclass
class _Folded:
    """The events of one queue folded so far (rule 6), until its next turn."""

    count: int = 0
    kinds: collections.Counter = field(default_factory=collections.Counter)
    statuses: collections.Counter = field(default_factory=collections.Counter)
    jobs: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    omitted: int = 0
    first: str = ""

    def add(self, event: dict) -> None:
        self.count += 1
        self.kinds[event["kind"]] += 1
        self.statuses[event["status"]] += 1
        self.first = self.first or event["time"]
        for name, ids in (("job", self.jobs), ("node", self.nodes)):
            if event.get(name):
                if len(ids) < MAX_FOLDED_IDS:
                    ids.append(event[name])
                else:
                    self.omitted += 1

    def event(self, user: str | None, limit: int) -> dict:
        return {
            "kind": "coalesced",
            "job": "",
            "name": "",
            "user": user,
            "status": "",
            "reason": (
                f"{self.count} events since {self.first} were folded into this one: the notify "
                f"command was slower than they came (at most {limit} wait per user)"
            ),
            "node": None,
            "time": datetime.now(UTC).isoformat(),
            "count": self.count,
            "kinds": dict(self.kinds),
            "statuses": dict(self.statuses),
            "jobs": self.jobs,
            "nodes": self.nodes,
            "jobs_omitted": self.omitted,
        }


class Notifier:
    """Delivers events to the administrator's command (see the module's rules).

    Args:
        command: the ``[notify] command`` setting (None: nothing runs).
        home: the service's home (the command's working folder).
        timeout: seconds one run may take (rule 4).
        per_user: events that may wait in one queue (rule 6).
        webhooks: the users' own webhooks (rule 8); None: none.
        address_of: the address a user named for their events (rule 3; read in the delivery
            thread, never where an event is queued); None: no addresses.
    """

    def __init__(
        self,
        command: str | None,
        home: str,
        *,
        timeout: float = TIMEOUT,
        per_user: int = MAX_PENDING_PER_USER,
        webhooks: UserWebhooks | None = None,
        address_of: Callable[[str], str | None] | None = None,
    ):
        self.webhooks = webhooks
        self.address_of = address_of
        self.argv = shlex.split(command) if command else []  # rule 1
        self.home = home
        self.timeout = timeout
        self.per_user = per_user
        # queue key (a user, None, or _NODES) -> its waiting events, oldest first (rule 5)
        self._pending: dict[object, collections.deque[dict]] = {}
        self._folded: dict[object, _Folded] = {}  # queue key -> what was folded (rule 6)
        self._turns: collections.deque[object] = collections.deque()  # users with work, in turn
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def notify(
        self,
        kind: str,
        *,
        job: str,
        name: str,
        user: str | None,
        status: str,
        reason: str | None = None,
        node: str | None = None,
    ) -> None:
        """Queue one event (rules 3, 5, 6 and 8); returns at once."""
        if not self.argv and self.webhooks is None:
            return
        event = {
            "kind": kind,
            "job": job,
            "name": name,
            "user": user,
            "status": status,
            "reason": reason,
            "node": node,
            "time": datetime.now(UTC).isoformat(),
        }
        if self.webhooks is not None:
            self.webhooks.push(dict(event))  # rule 8
        if not self.argv:
            return
        key = _NODES if not job and node and user is None else user
        with self._cond:
            if self._closed:
                return
            queue = self._pending.setdefault(key, collections.deque())
            if not queue and key not in self._folded and key is not _NODES:
                self._turns.append(key)  # it had nothing waiting: it joins the round (rule 5)
            if len(queue) >= self.per_user:  # rule 6
                folded = self._folded.get(key)
                if folded is None:
                    folded = self._folded[key] = _Folded()
                    log.warning(
                        "notify: %d events of %s wait; folding the oldest into one 'coalesced' event",
                        len(queue),
                        "the nodes" if key is _NODES else key or "the service",
                    )
                folded.add(queue.popleft())
            queue.append(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver, name="notify", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (within ``timeout``) and stop the thread."""
        if self.webhooks is not None:
            self.webhooks.close(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _next(self) -> dict | None:
        """The next event to deliver (rule 5), its folded summary first (rule 6); None: none waits.
        Called with the condition held."""
        if self._pending.get(_NODES) or _NODES in self._folded:
            key = _NODES
        elif self._turns:
            key = self._turns.popleft()
        else:
            return None
        folded = self._folded.pop(key, None)
        queue = self._pending.get(key)
        if folded is not None:
            event = folded.event(None if key is _NODES else key, self.per_user)  # type: ignore[arg-type]
        else:
            event = queue.popleft()  # type: ignore[union-attr]
        if queue:
            if key is not _NODES:
                self._turns.append(key)  # more waits: its next turn is after every other user's
        else:
            self._pending.pop(key, None)
        return event

    def _deliver(self) -> None:
        while True:
            with self._cond:
                event = self._next()
                while event is None and not self._closed:
                    self._cond.wait()
                    event = self._next()
                if event is None:
                    return
            self._run(event)

    def _address(self, user: str | None) -> str | None:
        """Rule 3's ``address`` of ``user`` (None: none, or it cannot be read now)."""
        if not user or self.address_of is None:
            return None
        try:
            return self.address_of(user)
        except Exception:  # the store unreadable (its disk full): the event still goes
            log.warning("notify: cannot read %s's address", user, exc_info=True)
            return None

    def _run(self, event: dict) -> None:
        """One run of the command with ``event`` on its standard input (rules 2, 4, 7)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", self.home),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "MA_JUPYTER_HOME": self.home,
        }
        event = {**event, "address": self._address(event.get("user"))}
        data = (json.dumps(event) + "\n").encode()
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=self.home,
                env=env,
                start_new_session=True,  # its own process group: a timeout ends all of it
            )
        except OSError as exc:
            log.warning("notify: cannot run %s: %s", self.argv[0], exc)
            return
        try:
            _, err = proc.communicate(data, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            log.warning(
                "notify: %s ran past %g s and was killed (event %s)", self.argv[0], self.timeout, event
            )
            return
        if proc.returncode:
            tail = err.decode("utf-8", "replace").strip()[-500:]
            log.warning("notify: %s exited %d: %s", self.argv[0], proc.returncode, tail)
