"""Watching running jobs, and the end of an attempt.

On every tick :meth:`Watching.watch_running` looks at each running job, on a fresh read under the
lock (a stop, an update or a finishing thread may have changed it since the listing); a job
being wound down, or waiting to retry after a full disk, is passed by.  Where the last listing
found no running job and nothing was written to the store since (:meth:`..store.Store.writing`
rule 4), there is nothing to look at and the store is not asked again (an idle service ticks ten
times a second).  For one job
(:meth:`Watching.watch`), in this order:

1. a job without a placement in memory takes the stored one (a restarted service), or fails as
   lost when none was stored; an end a previous service began for this attempt and did not
   record (:meth:`Watching.carry`) is carried out first, as it was decided;
2. a pending stop or delete, a pending end the full disk kept from being recorded, one of its
   folders full (looked at every ``DISK_CHECK_EVERY`` seconds), or running past its duration
   ends it (:func:`..policies.before_poll`);
3. its nodes are polled through the backend, unless it was polled less than the backend's
   ``poll_every`` ago and no node's end was pushed since (:meth:`Watching.node_ended`);
4. a node on a drained or faulty node moves the job away (:func:`..policies.on_unhealthy`);
5. a batch job ends by its tasks (:func:`..policies.on_batch`); any other job fails at its first
   failed node (:func:`..policies.on_failure`), is rescheduled by its performance samples
   (:func:`..policies.on_perf`, read from the primary nodes' new complete log lines), or
   succeeds when every primary node did (:func:`..policies.on_success`);
6. a job still running is looked at for a hang every ``HANG_LOOK_EVERY`` seconds (a quarter of
   ``[limits] hang_minutes`` when that is shorter; never with ``hang_minutes = 0``): its nodes'
   CPU seconds and cards' use (:meth:`Backend.usage`) and its logs' sizes (:func:`..logs.log_size`),
   both through the backend, feed :func:`..policies.on_quiet`; once a quiet spell lasts the
   window, what its processes are doing (:meth:`Backend.processes`) goes into one alert event
   (:func:`..policy_texts.hang_alert`), and ``hang_policy = stop`` ends it (:func:`..policies.on_hang`).
   A backend that cannot sample (usage None: Ray) is not watched for hangs.

:meth:`Watching.finish` ends an attempt: it marks the job as finishing and, on a thread of its
own (stopping nodes takes up to the grace period, so it never stalls the loop), writes the end
ahead to the store (:func:`..policies.end_record`: stopping the nodes changes what a restarted service would
infer from them), stops what still runs, polls the nodes again, reads the reason (a function
reading the job's files runs there, outside the lock), then under the lock records the end
:func:`..policies.settle` makes of it in one write that also clears the attempt's notes in the
store (its placement, the end written ahead, the request carried out), and only then releases
the placement and forgets the attempt's notes here (a job marked to be deleted is removed).  A
wind-down that fails before the end is recorded (a full disk refuses that write whole) is tried
again with the same end (one the full disk brought, with its pending reason, rule 2); the alerts
said with the end are said once.

:meth:`Watching.guarded` runs one supervision step of a job: a full disk holds the job for
``RECORD_RETRY`` seconds, any other error fails it with the reason.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ...backends.base import Attempt, Backend
from ...config import Limits
from ...errors import DiskFull
from ...models import Event, Job, JobStatus, Mode, NodeRun, utcnow
from ...modes.base import Placement
from .. import distributed_check, policies, policy_texts
from ..disk import full_folder
from ..health import NodeHealth
from ..logs import last_lines, log_size, read_log
from ..policies import End
from ..storage import Uploads
from ..store import Store
from .attempts import attempt_for
from .journal import Journal, call_reason
from .ledger import Ledger

log = logging.getLogger("ma_jupyter.supervisor")

TAIL_LINES = 15  # a failed node's last log lines in its job's reason
DISK_CHECK_EVERY = 1.0  # seconds between looks at the free space of a running job's folders
RECORD_RETRY = 2.0  # seconds before retrying to record the end of a job after the disk was full
HANG_LOOK_EVERY = 30.0  # seconds between looks at a running job for a hang (rule 6)


#: what a failed node's last log lines say when it reached for a network it does not have
#: (urllib3/requests, socket.getaddrinfo, a refused or unroutable connect)
NETWORK_FAILURES = (
    "NameResolutionError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "ConnectionRefusedError",
    "Connection refused",
    "Network is unreachable",
)


def network_hint(reason: str) -> str | None:
    """The event line for a failed node whose reason (its last log lines included) shows a name
    that did not resolve or a connection refused or unroutable, None otherwise.

    Jobs' nodes share a network of their own (docs/network.md): they reach each other and only
    the destinations the admin's ``[network] egress`` lists, so a download, a ``pip install``
    or a call to an outside service fails this way; the line says so once, how to bring what
    the job needs, and how an admin opens the way, instead of leaving the user with the
    tracebacks alone."""
    seen = next((marker for marker in NETWORK_FAILURES if marker in reason), None)
    if seen is None:
        return None
    return (
        f"the job's network is limited ({seen} in its last log lines): a job's nodes reach each "
        "other and only what the admin's [network] egress allows (none by default: no internet, "
        "no name server, never the job service), so a download or pip install inside a job fails; "
        "bring data and models as mounts (--dataset NAME=FOLDER, --model NAME=FOLDER) and packages "
        "in the image's environment, or ask an admin to list the destination in cluster.toml, e.g. "
        '[network] egress = ["pypi.mirror.local:3128"] (docs/network.md)'
    )


class Watching:
    """Watches running jobs (module rules 1 to 5) and winds their attempts down."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        health: NodeHealth,
        ledger: Ledger,
        journal: Journal,
        limits: Callable[[], Limits] = Limits,
    ):
        self._store = store
        self._limits = limits  # the admin's [limits] now (hang_minutes)
        # (job id, attempt) -> its quiet spell (rule 6), and when each job was last looked at
        self._quiet: dict[tuple[str, int], policies.QuietSpell] = {}
        self._hang_looked: dict[str, float] = {}
        self._backend = backend
        self._health = health
        self._ledger = ledger
        self._journal = journal
        self._perf_offsets: dict[tuple[str, int, str], int] = {}
        self._perf_alerted: set[tuple[str, int, str]] = set()
        self._disk_checked: dict[str, float] = {}  # job id -> monotonic time of the last look
        #: the uploads of outputs in object storage (``service/storage.py`` rule 4), set by the supervisor
        self.uploads: Uploads | None = None
        # job id -> why it must end, kept while the store cannot record it (its disk is full)
        self._pending_end: dict[str, str] = {}
        # job id -> an end decided and not recorded, carried out at the next look: one a previous
        # service began (:meth:`carry`), or one whose wind-down failed (:meth:`finish`)
        self._carried: dict[str, End] = {}
        # jobs whose current attempt's end alerts were said (a retried record says them once)
        self._end_told: set[str] = set()
        self._health_noted: set[tuple[str, int, str]] = set()  # (job, attempt, node) said to stay
        #: job id -> bytes its folders grew by on the jobs folder's disk between the disk
        #: reserve's last two looks (set by the inspection; None while it does not measure):
        #: a full disk ends only the jobs writing there (:func:`..policies.full_disk_ends`)
        self.disk_grown: dict[str, int] | None = None
        self._full_seen: set[str] = set()  # job ids whose last look found a folder full
        # polls of running nodes: when each job was last polled, and whether a backend's push of
        # a node's end asks this tick to poll every job (contract rule 11, poll_every)
        self._polled_at: dict[str, float] = {}
        self._end_hinted = threading.Event()
        self._poll_all = True
        #: the store's write count when a listing found no running job (None: it found some)
        self._none_running_at: int | None = None

    def node_ended(self) -> None:
        """The backend's hint that a node may have ended: poll every running node now."""
        self._end_hinted.set()
        self._ledger.wake.set()

    def carry(self, job: Job, attempt: Attempt) -> None:
        """Take up the end a previous service wrote ahead for ``job``'s current attempt and did
        not record (a re-attached job): the next look carries it out (module rule 1).  A record
        that cannot be read is logged and left: the job is watched as any other."""
        try:
            end = policies.carried_end(
                job, self._store.ending(job.id), lambda run: self._failure_reason(attempt, run)
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.warning(
                "job %s: the end written ahead by the previous service is unreadable: %s", job.id, exc
            )
            return
        if end is not None:
            self._carried[job.id] = end

    def watch_running(self) -> None:
        """One look at every running job (the module's rules), each on a fresh read."""
        self._poll_all = self._end_hinted.is_set()
        self._end_hinted.clear()
        writes = self._store.writes  # read before the listing: a write after it lists again
        if writes == self._none_running_at:
            return  # still none running: no job can have started without a write
        running = self._store.by_status(JobStatus.running)
        self._none_running_at = None if running else writes
        for listed in running:
            with self._ledger.lock:
                if listed.id in self._ledger.finishing:
                    continue
                if self._ledger.retry_at.get(listed.id, 0.0) > time.monotonic():
                    continue  # its end could not be recorded (full disk): do not retry in a busy loop
                self.guarded(listed, self.watch)  # which reads the job fresh, under the lock

    def guarded(self, job: Job, step: Callable[[Job], object]):
        """Run one supervision step for a job and return what it returns; an unexpected error
        fails that job, with the reason (and gives None)."""
        ledger = self._ledger
        try:
            return step(job)
        except DiskFull as exc:
            # Nothing can be recorded now: try again a little later, when the disk check of the
            # job's folders names what is full (the store's own folder is not the job's story).
            log.warning("job %s: %s", job.id, exc.message)
            retry = ledger.hold_off(job.id, RECORD_RETRY)
            if job.status is JobStatus.queued:  # no event will come: admission tries it again then
                ledger.retry_admission(retry)
        except Exception as exc:
            log.exception("supervising job %s failed", job.id)
            message = exc.message if hasattr(exc, "message") else f"{type(exc).__name__}: {exc}"
            current = self._store.get(job.id)
            placement = ledger.placements.get(job.id)
            action = policies.on_supervise_error(current, job.id in ledger.finishing, placement is not None)
            reason = f"the service could not supervise this job: {message}"
            if action == "finish":
                attempt = attempt_for(self._store, current, placement)
                self.finish(current, attempt, End(JobStatus.error, reason, current.spec.grace_period))
            elif action == "error":
                self._journal.transition(current, JobStatus.error, reason)
        return None

    def watch(self, job: Job) -> None:
        """Rules 1 to 5 for one job (under the lock)."""
        job = self._store.get(job.id)  # never act on a stale copy: it may have finished meanwhile
        if job.status is not JobStatus.running or job.id in self._ledger.finishing:
            return
        placement = self._ledger.placements.get(job.id)
        if placement is None:
            data = self._store.placement(job.id)
            if data is None:
                self._journal.transition(
                    job, JobStatus.error, "lost: the service has no record of where this job ran"
                )
                return
            placement = self._ledger.placements[job.id] = Placement.from_json(data)
        attempt = attempt_for(self._store, job, placement)
        carried = self._carried.get(job.id)  # until it is recorded (forget): a failed try is retried
        if carried is not None:
            self.finish(job, attempt, carried)
            return
        end = policies.before_poll(
            job,
            desired=self._store.desired(job.id),
            pending_end=self._pending_end.get(job.id),
            disk_full=self._full_disk(job, attempt),
            now=utcnow(),
        )
        if end is not None:
            if end.pending and job.id not in self._pending_end:
                log.warning("job %s: %s", job.id, end.reason)
            self.finish(job, attempt, end)
            return
        now = time.monotonic()
        if not self._poll_all and now - self._polled_at.get(job.id, 0.0) < self._backend.poll_every:
            return  # polled recently, and no end was pushed since
        self._polled_at[job.id] = now
        if self.uploads is not None:
            self.uploads.due(job)  # outputs in object storage: its changed files, off the lock
        # a batch task that succeeded in an earlier attempt is not run again: its result stands
        current = {plan.name for plan in attempt.plans}
        runs = [self._backend.poll(attempt, r) if r.name in current else r for r in job.nodes]
        if runs != job.nodes:
            job = job.model_copy(update={"nodes": runs})
            self._store.save(job)
        if self._health.marks and self._on_unhealthy(job, attempt, runs):
            return
        if job.spec.type.value == "batch":
            end = policies.on_batch(job, runs, lambda run: self._failure_reason(attempt, run))
            if end is not None:
                if end.failed is not None:
                    full = self._full_disk(job, attempt, now=True)
                    if full is not None:
                        end = policies.on_failure(job, end.failed, end.reason, full)
                self.finish(job, attempt, end)
                return
            end = self._hang(job, runs)
            if end is not None:
                self.finish(job, attempt, end)
            return
        failed = policies.first_failure(runs)
        if failed is not None:

            def reason() -> str:
                return self._failure_reason(attempt, failed)

            full = self._full_disk(job, attempt, now=True)
            self.finish(job, attempt, policies.on_failure(job, failed, reason, full))
            return
        if job.spec.checkpoint_resume and job.spec.checkpoint_resume.perf_threshold:
            end = self._perf(job, attempt)
            if end is not None:
                self.finish(job, attempt, end)
                return
        end = policies.on_success(runs) or self._hang(job, runs)
        if end is not None:
            self.finish(job, attempt, end)

    def _hang(self, job: Job, runs: list[NodeRun]) -> End | None:
        """Rule 6: one look for a hang when it is due; the end ``hang_policy = stop`` makes of it."""
        window = self._limits().hang_minutes * 60.0
        if window <= 0 or not policies.watches_hangs(job):
            return None
        clock = time.monotonic()
        if clock - self._hang_looked.get(job.id, 0.0) < min(HANG_LOOK_EVERY, window / 4):
            return None
        self._hang_looked[job.id] = clock
        usage = self._backend.usage(job.id, runs)
        if not usage:  # the backend cannot sample (Ray), or no node runs yet
            return None
        cpu = sum(u.cpu_seconds for u in usage)
        cards = max((u.card_percent or 0.0 for u in usage), default=0.0)
        logs = sum(log_size(self._backend, job.id, r.name) for r in runs)
        key = (job.id, job.attempt)
        before = self._quiet.get(key)
        spell, hung = policies.on_quiet(before, logs, cpu, cards, clock, window)
        self._quiet[key] = spell
        if not hung:
            return None
        looks = self._backend.processes(job.id, runs)
        said = (
            None
            if looks is None
            else {n: [(p.pid, p.name, p.state, p.wait) for p in ps] for n, ps in looks.items()}
        )
        stop = job.spec.hang_policy.value == "stop"
        alert = policy_texts.hang_alert(job.id, window / 60.0, cpu - spell.cpu_seconds, said, stop)
        log.warning("job %s %s", job.id, alert)
        self._journal.notice(job, alert, alert=True)
        return policies.on_hang(job, window / 60.0)

    def _on_unhealthy(self, job: Job, attempt: Attempt, runs: list[NodeRun]) -> bool:
        """Rule 4 (:func:`..policies.on_unhealthy`): True when the attempt is being ended."""
        snapshot = self._health.snapshot()
        marks = {name: (m.status, m.reason) for name, m in snapshot.items()}
        spared = {name for name, m in snapshot.items() if m.only_new_work}
        notice, end = policies.on_unhealthy(job, runs, marks, spared)
        if notice is None and end is None:
            return False
        if end is None:
            bad = next(r.host for r in runs if r.host in marks)
            key = (job.id, job.attempt, bad)
            if notice and key not in self._health_noted:
                self._health_noted.add(key)
                self._journal.notice(job, notice)
            return False
        if notice:
            self._journal.notice(job, notice)
        self.finish(job, attempt, end)
        return True

    def _full_disk(self, job: Job, attempt: Attempt, *, now: bool = False) -> Path | None:
        """The first full folder among those the job writes to (its job folder, outputs and
        volumes); looked at every ``DISK_CHECK_EVERY`` seconds unless ``now``."""
        clock = time.monotonic()
        if not now and clock - self._disk_checked.get(job.id, 0.0) < DISK_CHECK_EVERY:
            return None
        self._disk_checked[job.id] = clock
        folders = policies.disk_folders(attempt.spec, attempt.jobdir.root, attempt.jobdir.outputs)
        full = full_folder(f for f in folders if f.is_dir())
        if full is None or now:
            if full is None:
                self._full_seen.discard(job.id)
            return full  # a failed node: the full disk is named as its likely cause
        try:
            on_jobs_disk = os.stat(full).st_dev == os.stat(attempt.jobdir.root).st_dev
        except OSError:
            on_jobs_disk = False
        grown = self.disk_grown if on_jobs_disk else None
        others = grown is not None and any(g > 0 for j, g in grown.items() if j != job.id)
        before = job.id in self._full_seen
        self._full_seen.add(job.id)
        mine = grown.get(job.id) if grown is not None else None
        return full if policies.full_disk_ends(mine, grown is not None, others, before) else None

    def _perf(self, job: Job, attempt: Attempt) -> End | None:
        """Performance detection: read the primary nodes' new complete log lines and apply
        :func:`..policies.on_perf` to their samples; the end that reschedules the job, if any."""
        for run in job.nodes:
            if not run.primary:
                continue
            key = (job.id, job.attempt, run.name)
            # only this attempt's lines: earlier attempts' slow samples were acted on already
            offset = self._perf_offsets.get(key, run.log_start)
            # bounded, and no backend call blocks on a file the job controls: it may run in the loop
            data = read_log(self._backend, job.id, run.name, offset, 1 << 20)
            complete = data[: data.rfind(b"\n") + 1]
            self._perf_offsets[key] = offset + len(complete)
            samples = policies.perf_samples(complete.decode("utf-8", "replace"))
            alert, end = policies.on_perf(job, run.name, samples, key in self._perf_alerted, run.host)
            if end is not None:
                self._journal.tell_alert(job, call_reason(end.reason), node=run.name)
                return end
            if alert is not None:
                self._perf_alerted.add(key)
                self._journal.notice(job, alert, node=run.name, alert=True)
        return None

    def _failure_reason(self, attempt: Attempt, run: NodeRun) -> str:
        """Why a node failed, with its last log lines; reads what the job could have written (through
        the backend), so it runs on the finishing thread, outside the supervisor lock."""
        lines = last_lines(self._backend, attempt.job_id, run.name, TAIL_LINES)
        hint = self._backend.explain(attempt, run, lines)
        return policy_texts.failure_reason(run, lines, self._backend.failure(attempt, run), hint)

    def forget(self, job_id: str) -> None:
        """Drop the in-memory notes kept about a job's current attempt (here and in the ledger)."""
        self._ledger.forget(job_id)
        self._disk_checked.pop(job_id, None)
        self._full_seen.discard(job_id)
        self._pending_end.pop(job_id, None)
        self._carried.pop(job_id, None)
        self._end_told.discard(job_id)
        self._polled_at.pop(job_id, None)
        self._hang_looked.pop(job_id, None)
        self._quiet = {k: v for k, v in self._quiet.items() if k[0] != job_id}
        self._health_noted = {k for k in self._health_noted if k[0] != job_id}
        for key in [k for k in self._perf_offsets if k[0] == job_id]:
            del self._perf_offsets[key]
        self._perf_alerted = {k for k in self._perf_alerted if k[0] != job_id}

    def finish(self, job: Job, attempt: Attempt, end: End) -> None:
        """End the attempt: stop what still runs (on a thread: it may take the grace period), then
        record what :func:`..policies.settle` makes of ``end``.

        ``end.reason`` may be a function: it is called on that thread, outside the lock, because
        it may read files the job wrote (its log, its failure report).
        """
        ledger, backend, store, journal = self._ledger, self._backend, self._store, self._journal
        if end.pending:  # the disk is full: keep the reason until the store takes it
            self._pending_end[job.id] = call_reason(end.reason)
        ledger.finishing.add(job.id)

        def run() -> None:
            recorded = failed = False
            try:
                # ahead of the stop: a service restarted during it carries out this same end.
                # Not for an end the full disk brought (pending): its reason waits in memory,
                # and a write now would spend the store's disk reserve kept to record the end.
                if not end.pending:
                    store.set_ending(job.id, policies.end_record(end, job.attempt))
                live = policies.live_nodes(job.nodes)
                if live:
                    if self.uploads is not None:  # outputs in object storage: uploads during the grace
                        self.uploads.stopping(job, end.grace)
                    backend.stop(attempt, live, end.grace)
                # the nodes just stopped, and any lost one (its exit code may have come since):
                # a node already seen exited keeps that state and code (a call per node on Ray)
                again = {plan.name for plan in attempt.plans} - {
                    r.name for r in job.nodes if r.state == "exited"
                }
                polled = [backend.poll(attempt, r) if r.name in again else r for r in job.nodes]
                final = policies.final_node_states(polled, end.failed)
                text = call_reason(end.reason)
                # outputs in object storage: the attempt's last files, before its end is recorded
                ended = end
                failed_upload = self.uploads.final(job) if self.uploads is not None else None
                if failed_upload is not None and end.status is JobStatus.succeeded:
                    ended = dataclasses.replace(end, status=JobStatus.error)
                    text = f"the job's command succeeded, but {failed_upload}"
                # said of a success only: a failure or a stop is its own news, and an early stop
                # leaves no trace of a strategy that had no time to form
                solo = self._not_distributed(job, attempt) if end.status is JobStatus.succeeded else None
                with ledger.lock:
                    desired = store.desired(job.id)
                    settled = policies.settle(ended, text, desired)
                    current = store.get(job.id)
                    if job.id not in self._end_told:  # once, also when the end's record is retried
                        if solo is not None:  # before the end: a follower that sees the end finds it
                            journal.notice(current, solo[1], node=solo[0], alert=True)
                        offline = (
                            network_hint(text) if end.failed and settled.status is JobStatus.error else None
                        )
                        if offline is not None:  # likewise before the end, shown with the job's alerts
                            journal.notice(current, offline, node=end.failed.name, alert=True)
                        if settled.status is JobStatus.error and job.spec.debug_terminal:
                            # likewise before the end: whoever waits for the end then reads the events
                            self._tell_kept(job, attempt, polled)
                        self._end_told.add(job.id)
                    updates = policies.record_updates(
                        current,
                        settled,
                        final,
                        end.exit_code,
                        utcnow(),
                        counted=end.counted,
                        exclude=end.exclude,
                    )
                    # One write records the end and clears the attempt's notes (its placement,
                    # the written-ahead end, and the request it carried out, which a job to be
                    # deleted keeps until it is gone: a crash before that leaves it marked).  A
                    # full disk fails it whole: nothing below has happened then, and the retry
                    # finds the placement and the end it needs.
                    notes = ("placement", "ending") if settled.remove else Store.ATTEMPT_NOTES
                    journal.transition(
                        current.model_copy(update=updates),
                        settled.status,
                        settled.reason,
                        node=end.failed.name if end.failed else None,
                        exit_code=end.failed.exit_code if end.failed else end.exit_code,
                        clear=notes,
                    )
                    recorded = True
                    # the end is durable: what follows happens whatever fails in it
                    placement = ledger.placements.pop(job.id, None)
                    self.forget(job.id)
                    if placement:
                        try:
                            backend.release(placement)
                        except Exception:  # a Ray agent's error: its group goes with the cluster
                            log.exception("releasing the placement of job %s failed", job.id)
                        ledger.queue_changed()  # resources freed: the queue's head may start
                if settled.remove:
                    journal.remove(job.id)
            except DiskFull as exc:
                # nothing can be recorded now: the loop retries later, with the reason kept
                log.warning("job %s: cannot record its end: %s", job.id, exc.message)
                ledger.hold_off(job.id, RECORD_RETRY)
                failed = True
            except Exception:
                log.exception("finishing job %s failed", job.id)
                failed = True
            finally:
                # the retry carries out this same end, not one inferred from the stopped nodes
                # (an end the full disk brought has its own: its pending reason, rule 2)
                if failed and not recorded and not end.pending:
                    self._carried[job.id] = end
                ledger.finishing.discard(job.id)
                ledger.wake.set()

        threading.Thread(target=run, name=f"finish-{job.id}", daemon=True).start()

    def _not_distributed(self, job: Job, attempt: Attempt) -> tuple[str | None, str] | None:
        """(node, alert) when this multi-node attempt did not run distributed (see
        :mod:`..distributed_check`); reads what the job could have written, so outside the lock."""
        if len(attempt.plans) < 2:
            return None
        if job.spec.mode is Mode.tensorflow:
            heads = []
            for run in job.nodes:
                try:
                    heads.append(
                        read_log(self._backend, job.id, run.name, run.log_start, distributed_check.HEAD_BYTES)
                    )
                except Exception:  # replaced by the job, gone with its node: not judged
                    heads.append(None)
            if distributed_check.tensorflow_alone(heads):
                return None, distributed_check.tensorflow_alert(len(heads))
            return None
        for run in job.nodes:
            try:
                nodes = self._backend.not_distributed(attempt, run)
            except Exception:  # a node gone, a backend away: say nothing rather than guess
                log.debug("job %s: no not-distributed report from %s", job.id, run.name, exc_info=True)
                continue
            if nodes is not None:
                return run.name, distributed_check.torch_alert(nodes, job.spec.mode.value)
        return None

    def _tell_kept(self, job: Job, attempt: Attempt, runs: list[NodeRun]) -> None:
        """An event per failed node that keeps its sandbox for the debug terminal, with until
        when and how to reach it (called under the lock, just before the job's end is recorded:
        a client that waited for the end finds it among the events)."""
        for run in runs:
            until = self._backend.kept_until(attempt, run)
            if until is None:
                continue
            stamp = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M UTC")
            self._store.add_event(
                Event(
                    job_id=job.id,
                    status=JobStatus.error,
                    node=run.name,
                    reason=f"the sandbox of {run.name} is kept for the debug terminal until {stamp}: "
                    f"ma-jupyter shell {job.id} --node {run.name}; deleting the job ends it sooner",
                )
            )
