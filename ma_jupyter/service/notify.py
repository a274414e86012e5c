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
   (``alert`` or ``ended``), ``job``, ``name``, ``user``, ``status``, ``reason``, ``node``
   (where one node is meant) and ``time`` (ISO 8601, UTC).
4. Events are delivered one at a time, in the order they happened, from one thread of the
   service: a slow command delays the next notification, never a job.  A command running past
   :data:`TIMEOUT` is killed (its whole process group).
5. A command that cannot start, exits non-zero or times out is logged with its exit status and
   the end of its error output; the event is not retried.  At most :data:`MAX_PENDING` events
   wait; past that the oldest is dropped, logged.
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
from datetime import UTC, datetime

log = logging.getLogger(__name__)

#: seconds one run of the command may take (rule 4)
TIMEOUT = 30.0
#: events that may wait for delivery (rule 5)
MAX_PENDING = 1000


class Notifier:
    """Delivers events to the administrator's command (see the module's rules)."""

    def __init__(self, command: str | None, home: str, *, timeout: float = TIMEOUT):
        self.argv = shlex.split(command) if command else []  # rule 1
        self.home = home
        self.timeout = timeout
        self._pending: collections.deque[dict] = collections.deque()
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
        """Queue one event (rule 3); returns at once."""
        if not self.argv:
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
        with self._cond:
            if self._closed:
                return
            if len(self._pending) >= MAX_PENDING:  # rule 5
                dropped = self._pending.popleft()
                log.warning("notify: %d events wait; dropped the oldest (%s)", MAX_PENDING, dropped)
            self._pending.append(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver, name="notify", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (within ``timeout``) and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _deliver(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                event = self._pending.popleft()
            self._run(event)

    def _run(self, event: dict) -> None:
        """One run of the command with ``event`` on its standard input (rules 2, 4, 5)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", self.home),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "MA_JUPYTER_HOME": self.home,
        }
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
