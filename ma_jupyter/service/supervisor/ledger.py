"""What the supervisor's rooms share about the jobs it runs, and the one lock that guards it.

Every room of the supervisor is given this ledger explicitly.  It holds only state that more
than one room reads or writes; a room's own notes stay in that room.

Rules:

1. Every read or change of a job's state (the store) and of this ledger's fields happens under
   :attr:`Ledger.lock` (re-entrant: a step may call another that takes it), except what is said
   otherwise where it is done (the finishing thread's backend calls, the node inspection's card
   questions, the disk reserve's measuring, data preparation's copies, a submit's new row and
   its place in the queue index: no one knows that job yet).
2. :meth:`Ledger.queue_changed` is what anything that may let a queued job start calls (a job
   entering the queue, resources freed, a priority change, a queued job leaving): it asks the
   loop for an admission pass and wakes it.
3. A job whose step met a full disk waits in :attr:`Ledger.retry_at` until its retry time; a
   queued one also brings the next admission pass forward to then (:meth:`Ledger.retry_admission`).
"""

from __future__ import annotations

import threading
import time

from ...modes.base import Placement


class Ledger:
    """The lock, the loop's signals and the books of live attempts (see the module's rules)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.wake = threading.Event()  # the loop ticks at once
        self.halt = threading.Event()  # the service stops: the loop and the reserve's watch end
        #: the running jobs' placements (what they hold of the cluster)
        self.placements: dict[str, Placement] = {}
        # queued jobs whose folders are read at their first start, off the lock: the placement
        # each is bound to (used; admission skips them until they are launched)
        self.reading: dict[str, Placement] = {}
        #: jobs whose attempt is being wound down on a thread of its own
        self.finishing: set[str] = set()
        #: job id -> monotonic time before which it is not tried again (a full disk)
        self.retry_at: dict[str, float] = {}
        #: set by what may let a queued job start (rule 2); an admission pass clears it
        self.admit_needed = threading.Event()
        self.admit_needed.set()  # the service starting is such an event
        #: monotonic time of the next pass for a job a full disk (or a busy backend) held
        self.admit_retry: float | None = None
        #: job id -> why it waits, as last said (each kind of wait is said once)
        self.waiting_noted: dict[str, str] = {}
        #: elastic job id -> monotonic time since it runs on fewer nodes than it asked
        self.shrunk_since: dict[str, float] = {}

    def queue_changed(self) -> None:
        """Rule 2: something happened that may let a queued job start: run an admission pass soon."""
        self.admit_needed.set()
        self.wake.set()

    def retry_admission(self, at: float) -> None:
        """Rule 3: an admission pass at monotonic time ``at`` at the latest."""
        self.admit_retry = min(self.admit_retry or float("inf"), at)

    def hold_off(self, job_id: str, seconds: float) -> float:
        """Rule 3: try ``job_id`` again only ``seconds`` from now; the monotonic time of that."""
        self.retry_at[job_id] = time.monotonic() + seconds
        return self.retry_at[job_id]

    def forget(self, job_id: str) -> None:
        """Drop what this ledger notes about a job's current attempt (its end was recorded)."""
        self.waiting_noted.pop(job_id, None)
        self.retry_at.pop(job_id, None)
        self.shrunk_since.pop(job_id, None)
