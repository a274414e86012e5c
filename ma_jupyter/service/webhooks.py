"""Each user's own notification webhook: where their jobs' alerts and terminal states go.

The administrator's ``[notify]`` command (:mod:`.notify`) hears every event; a user may name a
webhook of their own (``PUT /users/me/notify``), kept with the user in the store.  The contract:

1. A webhook is an ``http://`` or ``https://`` URL with a host, at most :data:`MAX_URL` characters
   (:func:`check_url`).  The service never runs a user's command: a webhook is data, not code.
2. A user's webhook hears only the events of the jobs that user created (``user`` of the event:
   the job's creator), the same JSON object the admin's command reads (:mod:`.notify` rule 3),
   never another user's, never a node's alert.
3. ``push`` only queues: it never waits on the network nor reads the store, so nothing a webhook
   does (an unreachable host, a server that never answers) reaches the supervisor.
4. One thread delivers, reading each user's current webhook from the store when an event's turn
   comes (a user without one: the event is dropped).  Users take turns (round robin), one try per
   turn; a try is one ``POST`` with ``Content-Type: application/json``, no redirect followed, the
   response's body not read, bounded by :data:`TIMEOUT` seconds.  A 2xx status delivers; anything
   else is tried again, at most :data:`TRIES` times in all, after :data:`RETRY_AFTER` seconds
   (doubling), then dropped with a log line.
5. At most :data:`MAX_PENDING_PER_USER` events wait per user and :data:`MAX_USERS` users have
   events waiting; past either bound the oldest waiting event (of that user; of a new user: the
   new event) is dropped with a log line.  Memory stays bounded whatever users and webhooks do.
"""

from __future__ import annotations

import collections
import http.client
import json
import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from ..errors import InvalidSpec

log = logging.getLogger(__name__)

#: the longest webhook URL (rule 1)
MAX_URL = 2048
#: seconds one POST may take, from connecting to the response's status (rule 4)
TIMEOUT = 5.0
#: tries of one event, the first included (rule 4)
TRIES = 3
#: seconds before the second try; each later one waits twice as long (rule 4)
RETRY_AFTER = 2.0
#: events that may wait for one user (rule 5)
MAX_PENDING_PER_USER = 100
#: users that may have events waiting at once (rule 5)
MAX_USERS = 1000


def check_url(url: str) -> str:
    """Rule 1: ``url`` stripped, or InvalidSpec saying what a webhook must be."""
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
    return url


def post(url: str, body: bytes, timeout: float = TIMEOUT) -> int:
    """One POST of ``body`` to ``url`` (rule 4); its status.  Raises OSError (and
    http.client's errors) when no status came."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=timeout)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request(
            "POST",
            path,
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": "ma_jupyter-notify"},
        )
        return conn.getresponse().status
    finally:
        conn.close()


class UserWebhooks:
    """Delivers each user's events to that user's webhook (see the module's rules).

    Args:
        webhook_of: the user's current webhook URL or None (read in the delivery thread).
        timeout, tries, retry_after, per_user, max_users: rules 4 and 5.
    """

    def __init__(
        self,
        webhook_of: Callable[[str], str | None],
        *,
        timeout: float = TIMEOUT,
        tries: int = TRIES,
        retry_after: float = RETRY_AFTER,
        per_user: int = MAX_PENDING_PER_USER,
        max_users: int = MAX_USERS,
    ):
        self.webhook_of = webhook_of
        self.timeout = timeout
        self.tries = tries
        self.retry_after = retry_after
        self.per_user = per_user
        self.max_users = max_users
        # user -> [event, tries so far, not before (monotonic)], oldest first
        self._pending: dict[str, collections.deque[list]] = {}
        self._turns: collections.deque[str] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

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
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver, name="user-webhooks", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (waiting events are dropped; a POST under way ends by its timeout)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _next(self) -> tuple[str, list] | float | None:
        """The next user's next due item (rule 4's round robin); else seconds until one is due,
        or None when nothing waits.  Called with the condition held."""
        now, soonest = time.monotonic(), None
        for _ in range(len(self._turns)):
            user = self._turns.popleft()
            self._turns.append(user)
            item = self._pending[user][0]
            if item[2] <= now:
                self._pending[user].popleft()
                if not self._pending[user]:
                    del self._pending[user]
                    self._turns.remove(user)
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
                    return
            user, item = found
            if not self._try(user, item):
                item[1] += 1
                if item[1] >= self.tries:
                    log.warning("webhooks: %s's webhook failed %d times; dropped %s", user, item[1], item[0])
                    continue
                item[2] = time.monotonic() + self.retry_after * 2 ** (item[1] - 1)
                with self._cond:  # back at the head of its user's queue: order kept
                    queue = self._pending.get(user)
                    if queue is None:
                        queue = self._pending[user] = collections.deque()
                        self._turns.append(user)
                    queue.appendleft(item)

    def _try(self, user: str, item: list) -> bool:
        """One POST of the item's event; True once delivered (or when nothing is to be done)."""
        try:
            url = self.webhook_of(user)
        except Exception as exc:  # the store, read in this thread: log, never end the thread
            log.warning("webhooks: cannot read %s's webhook: %s", user, exc)
            return True
        if not url:
            return True
        try:
            status = post(url, (json.dumps(item[0]) + "\n").encode(), self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            log.info("webhooks: %s's webhook %s: %s", user, url, exc)
            return False
        if 200 <= status < 300:
            return True
        log.info("webhooks: %s's webhook %s answered %d", user, url, status)
        return False
