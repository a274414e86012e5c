"""The supervisor's loop: its thread, its tick, and taking over from a previous service.

One loop thread is woken at once by a submission, a stop request, a change of the queue or a
node's end pushed by the backend, otherwise every ``POLL_INTERVAL``, or every ``poll_every`` of
a backend that polls less often, at most ``TICK_MAX``.  A tick (:meth:`Loop.tick`), in order:

1. every 10 s, the store takes back its own disk reserve (given up when the disk filled);
2. the node inspection, when due (:mod:`.inspection`);
3. a change of the backend's inventory (a node joined or left) asks for an admission pass;
4. every running job is watched (:mod:`.watching`);
5. an admission pass runs if an event asked for one, or a job a full disk held is due
   (:mod:`.admission`).

After each tick the prepared data past its retention is swept when due (:mod:`..preparation`).
A bug in one tick is logged and never ends supervision.

**Recovery** (:meth:`Loop.recover`, the first thing :meth:`Loop.start` does): every decision is
derived from durable state (the store, the node exit-code files, pids with their start times),
so a service killed with ``kill -9`` and started again:

1. stops the partly started nodes of a launch it was in the middle of (placement stored, job
   still queued), releases what bind reserved, and leaves the job queued to start again;
2. re-attaches to the jobs that kept running (their placements held again, an elastic job
   running shrunk watched for scale-up from now), takes up the end it had begun to carry out
   for one and not recorded (written ahead of the stop: carried out at the first look), and
   says how many nodes it found alive;
3. asks for an admission pass.

:meth:`Loop.start` then removes the folders of deleted jobs a previous service had not finished
removing, starts the loop, the resource sampler and the disk reserve's thread (measuring what
jobs hold on a nearly full disk may take a while, and must never slow a tick).
"""

from __future__ import annotations

import logging
import threading
import time

from ... import config
from ...backends.base import Backend
from ...models import JobStatus, NodeRun
from ...modes.base import Placement
from .. import policies
from ..preparation import Preparation
from ..resources import ResourceSampler
from ..store import Store
from .admission import Admission
from .attempts import attempt_for
from .inspection import Inspection
from .journal import Journal, remove_folder
from .ledger import Ledger
from .watching import Watching

log = logging.getLogger("ma_jupyter.supervisor")

# How often running jobs are polled when nothing woke the loop: on the local backend a node that
# ended by itself is noticed within it.  Everything else (a submit, a stop, a change of the queue) wakes the loop.
# A backend that pushes its nodes' ends and polls less often (Ray) slows the pace, to at most
# TICK_MAX: ticking faster would re-read every running job for nothing, CPU taken from the
# jobs, while expiry, grace periods and retries are still checked at every tick.
POLL_INTERVAL = 0.1
TICK_MAX = 1.0
STORE_RESERVE_EVERY = 10.0  # seconds between the store's attempts to take back its disk reserve


class Loop:
    """The loop thread, its tick, recovery, start and shutdown (the module's rules)."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        ledger: Ledger,
        journal: Journal,
        preparation: Preparation,
        watching: Watching,
        inspection: Inspection,
        admission: Admission,
        resources: ResourceSampler,
    ):
        self._store = store
        self._backend = backend
        self._ledger = ledger
        self._journal = journal
        self._preparation = preparation
        self._watching = watching
        self._inspection = inspection
        self._admission = admission
        self._resources = resources
        self._thread: threading.Thread | None = None
        self._reserve_checked = 0.0
        self._inventory = backend.inventory()  # a change (a node joined or left) asks for a pass

    def start(self) -> None:
        """Re-attach to jobs left running by a previous service, then run the loop."""
        self._backend.on_node_end(self._watching.node_ended)  # a node's end is handled at once
        self._backend.on_notice(self._journal.backend_notice)
        self.recover()
        # folders of deleted jobs a previous service had not finished removing
        for doomed in config.jobs_root().glob(".deleted-*"):
            threading.Thread(target=remove_folder, args=(doomed,), daemon=True).start()
        self._thread = threading.Thread(target=self._run, name="ma-supervisor", daemon=True)
        self._thread.start()
        self._resources.start()
        # its own thread: measuring what jobs hold on a nearly full disk may take a while, and
        # must never slow a tick
        threading.Thread(target=self._inspection.reserve_loop, name="ma-disk-reserve", daemon=True).start()

    def shutdown(self) -> None:
        """Stop the loop; running jobs keep running (they do not depend on the service)."""
        self._ledger.halt.set()
        self._ledger.wake.set()
        self._preparation.cancel_all()  # no copy goes on without its service (the sweep removes it)
        self._resources.stop()
        if self._thread:
            self._thread.join(timeout=5)
        self._backend.close()

    def _run(self) -> None:
        ledger = self._ledger
        while not ledger.halt.is_set():
            ledger.wake.wait(min(max(POLL_INTERVAL, self._backend.poll_every), TICK_MAX))
            ledger.wake.clear()
            try:
                self.tick()
            except Exception:  # a bug in one tick must not end supervision of every job
                log.exception("supervisor tick failed")
            self._preparation.sweep_if_due()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no attempt is being wound down (every finishing thread has recorded its
        job's end); True if so within ``timeout`` seconds.  For tests and orderly shutdowns."""
        deadline = time.monotonic() + timeout
        while self._ledger.finishing:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def tick(self) -> None:
        """One pass (the module's steps 1 to 5)."""
        if time.monotonic() >= self._reserve_checked + STORE_RESERVE_EVERY:
            self._reserve_checked = time.monotonic()
            self._store.keep_reserve()  # given up when the disk filled; back once there is room
        self._inspection.inspect_if_due()
        inventory = self._backend.inventory()
        if inventory is not self._inventory:  # a node joined or left: queued jobs may fit now
            self._inventory = inventory
            self._ledger.admit_needed.set()
        self._watching.watch_running()
        if self._admission.due():
            self._admission.admit()

    def recover(self) -> None:
        """Take over from a previous service (the module's recovery rules).

        :meth:`start` calls it; a test may call it on a supervisor whose loop it drives itself.
        """
        store, backend, ledger = self._store, self._backend, self._ledger
        for job in store.placed(JobStatus.queued):  # only these can need a clean-up
            data = store.placement(job.id)
            if policies.recovery(job, data is not None) != "stop_partial_launch":
                continue
            placement = Placement.from_json(data)
            attempt = attempt_for(store, job, placement)
            # Those nodes may have started without the job being marked running: stop them (by
            # their markers) so the job starts once, cleanly, when it is admitted again.
            backend.stop(attempt, [NodeRun(name=p.name) for p in attempt.plans], 1.0)
            backend.release(placement)  # what bind reserved (the Ray backend: a placement group)
            store.set_placement(job.id, None)
            self._journal.notice(
                job,
                "the service stopped while launching this job; its partly started nodes were "
                "stopped and it waits in the queue to start again",
            )
        for job in store.by_status(JobStatus.running):
            data = store.placement(job.id)
            if policies.recovery(job, data is not None) != "reattach":
                continue
            placement = Placement.from_json(data)
            ledger.placements[job.id] = placement
            backend.hold(placement)
            resume = job.spec.checkpoint_resume
            if resume and resume.elastic_min_nodes and policies.workers(placement.tasks) < job.spec.nodes:
                ledger.shrunk_since[job.id] = time.monotonic()  # the interval counts from now
            attempt = attempt_for(store, job, placement)
            self._watching.carry(job, attempt)  # an end the previous service began: carried out first
            alive = [r.name for r in job.nodes if backend.poll(attempt, r).state == "running"]
            self._journal.notice(
                job,
                f"service restarted: re-attached to {len(alive)} running node(s) {', '.join(alive)}".rstrip(),
            )
        ledger.queue_changed()
