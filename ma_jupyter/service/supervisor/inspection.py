"""Node health and the looks at running jobs beside the watch: drains, inspections, the disk reserve.

* **Drain and undrain** (an admin's): a drained node takes no new placement (:mod:`..health`);
  a job with checkpoint resume running there is moved away by the next watch.  Undraining a
  drained or faulty node asks for an admission pass.
* **The node inspection**, every ``HEALTH_EVERY`` seconds from the loop
  (:meth:`Inspection.inspect_if_due`), in this order:

  1. a service that was itself frozen or suspended (its last inspection long ago by the wall
     clock) sees every heartbeat as old: it judges none this time;
  2. for each running job, under the lock: each running runner's heartbeat age by inventory
     node, the tasks holding real cards, and an elastic job running shrunk is checkpointed to
     scale up once the nodes it lacks are free for long enough (:func:`..policies.on_scale_up`);
  3. outside the lock (the driver may take a while to answer), each card is asked whether it
     failed (:meth:`Backend.card_fault`): its node is marked faulty, said to the jobs there;
  4. a node where every running runner has been silent longer than ``heartbeat_timeout`` is
     marked faulty (one job stopping or loading its own runner must not end the others there).

  5. every ``NODE_CHECK_EVERY`` seconds, each node of the inventory, idle ones too, is checked
     for what breaks training (:meth:`Inspection.node_checks`: its job folders' disk free
     space, its real cards, its job network): a failing check marks it faulty with the reason (an alert to the
     jobs running there and to the notification hook); a node whose mark a check set and that
     passes again is put back into placement (an admin's drain and a heartbeat fault stay).
     A failing disk check first looks for the job whose writing explains it: a job running
     there that wrote the most on that disk since the reserve's last look, fast enough
     (:func:`..policies.reserve_offender` against ``node_disk_free_mb``), is ended with the
     reason (:func:`..policies.on_node_disk`) and the node is not marked for it.  Otherwise
     the disk's mark only holds new work off the node: the jobs running there keep running
     (:attr:`..health.Mark.only_new_work`).

* **The pre-check** (seed 002) before every placement of a checkpoint-resume job, its first one
  too (:meth:`Inspection.precheck`), in this order:

  6. the checkpoint folder (the job's outputs) is there, and the job's account (the backend's
     ``job_account``, not the service's root) may read and write in it (at the first placement
     it may not be made yet); otherwise the job ends in error, naming the account;
  7. each node of the placement passes its checks (rule 5), now: a node failing one is marked
     faulty and the job waits for the next placement (which avoids it);
  8. the result, with where the job is placed and which nodes it avoids (marked nodes, and the
     nodes it was rescheduled away from), is an event of the job.
* **The disk reserve** (:mod:`..policies`, "across running jobs"), on a thread of its own once
  a second (:meth:`Inspection.reserve_loop`): under twice the reserve (or twice
  ``node_disk_free_mb``, the larger), what each running job holds on the jobs folder's disk is
  measured (outside the lock: it may take a while); under the reserve, the job writing the most
  is ended (:func:`..policies.on_reserve`).  Rule 5 reads the same measurements.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass

from ... import config
from ...backends.base import Attempt, Backend
from ...errors import InvalidSpec, NotFound
from ...models import Job, JobStatus, Node, RunAs
from ...modes.base import Placement, TaskSlot
from .. import policies
from ..disk import FULL_BELOW, disk_use, free_bytes
from ..health import NodeHealth
from ..queue import QueueIndex
from ..scheduler import Scheduler
from ..store import Store
from .attempts import attempt_for
from .journal import Journal
from .ledger import Ledger
from .watching import DISK_CHECK_EVERY, Watching

log = logging.getLogger("ma_jupyter.supervisor")

HEALTH_EVERY = 1.0  # seconds between two node inspections (heartbeats, elastic scale-up)
NODE_CHECK_EVERY = 5.0  # seconds between two checks of every node (disk, cards)
MIB = 1 << 20


@dataclass(frozen=True)
class Precheck:
    """The pre-check's outcome: ``passed``; ``reason`` (the event's text); ``fatal``: the job
    cannot run anywhere (its checkpoint folder), so it ends in error, else a node failed its
    checks (it is marked faulty now) and the job waits for another placement."""

    passed: bool
    reason: str
    fatal: bool = False


def _usable_by(folder: str, run_as: RunAs | None) -> bool:
    """Whether the job's account (``run_as``; None: the service's own) may list, read and write
    in ``folder`` by its mode, owner and group, as the job itself would (rule 6: the service
    runs as root, and root's own access says nothing of the job's); ACLs are not considered."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    if run_as is None:
        return os.access(folder, os.R_OK | os.W_OK | os.X_OK)
    if run_as.uid == 0:
        return True
    if st.st_uid == run_as.uid:
        bits = st.st_mode >> 6
    elif st.st_gid == run_as.gid:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & 0o7 == 0o7


class Inspection:
    """Drains, node inspections, the resume pre-check and the disk reserve (module docstring)."""

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        backend: Backend,
        health: NodeHealth,
        queue: QueueIndex,
        ledger: Ledger,
        journal: Journal,
        watching: Watching,
    ):
        self._store = store
        self._scheduler = scheduler
        self._backend = backend
        self._health = health
        self._queue = queue
        self._ledger = ledger
        self._journal = journal
        self._watching = watching
        self._inspected = 0.0
        self._inspected_wall = 0.0  # time.time() of the last inspection (counts a suspend)
        self._nodes_checked = float("-inf")  # monotonic time of the last node checks
        # the disk reserve: when it was last looked at, and what each running job held on the
        # jobs folder's disk then (only while it is nearly full)
        self._reserve_watched = 0.0
        self._held: dict[str, int] = {}
        # what each running job wrote on the jobs folder's disk between the reserve's last two
        # looks, and in how many seconds (rule 5 names a writer from it)
        self._grown: dict[str, int] = {}
        self._grown_seconds = 0.0

    # --------------------------------------------------------------------- drains

    def drain(self, node: str, reason: str | None = None, by: str | None = None) -> None:
        """Take ``node`` out of placement (an admin's drain); a job with checkpoint resume running
        there is moved away by the next watch.

        Raises:
            NotFound: no node of the inventory has that name.
        """
        self._known_node(node)
        why = f"drained by {by or 'an admin'}" + (f": {reason}" if reason else "")
        if self._health.mark(node, "drained", why, source="admin"):
            log.warning("node %s %s", node, why)
        self._ledger.wake.set()

    def undrain(self, node: str) -> None:
        """Put a drained or faulty ``node`` back into placement (queued jobs may fit now).

        Raises:
            NotFound: no node of the inventory has that name.
        """
        self._known_node(node)
        if self._health.clear(node) is not None:
            self._ledger.queue_changed()

    def _known_node(self, node: str) -> None:
        names = [n.name for n in self._scheduler.nodes()]
        if node not in names:
            raise NotFound(f"no node {node!r}: the nodes are {', '.join(names)} (see `ma-jupyter nodes`)")

    # ----------------------------------------------------------- the node inspection

    def inspect_if_due(self) -> None:
        """An inspection when the last one is ``HEALTH_EVERY`` seconds old (rule 1 decides
        whether it judges heartbeats and cards)."""
        if time.monotonic() < self._inspected + HEALTH_EVERY:
            return
        wall = time.time()
        timeout = self._scheduler.cluster.limits.heartbeat_timeout
        judge = wall - self._inspected_wall < timeout / 2
        self._inspected, self._inspected_wall = time.monotonic(), wall
        self.inspect(judge)
        if self._inspected >= self._nodes_checked + NODE_CHECK_EVERY:
            self._nodes_checked = self._inspected
            self.check_nodes()

    def inspect(self, judge: bool) -> None:
        """Rules 2 to 4 (3 and 4 only when ``judge``)."""
        ledger, health, backend, scheduler = self._ledger, self._health, self._backend, self._scheduler
        timeout = scheduler.cluster.limits.heartbeat_timeout
        interval = scheduler.cluster.limits.elastic_scale_up_interval
        now = time.time()
        # the age of each running runner's last beat, by inventory node: a node is faulty only
        # when every runner on it is silent (one job stopping its own runner, or loading it,
        # must not end the other users' jobs there)
        ages: dict[str, list[float]] = {}
        # inventory node -> the running jobs' tasks holding real cards there (asked outside the lock)
        card_tasks: dict[str, list[tuple[Job, TaskSlot]]] = {}
        for job in self._store.by_status(JobStatus.running):
            with ledger.lock:
                placement = ledger.placements.get(job.id)
                if placement is None or job.id in ledger.finishing:
                    continue
                attempt = attempt_for(self._store, job, placement)
                if judge:
                    for task in placement.tasks:
                        if task.card_type and task.host not in health.marks:
                            card_tasks.setdefault(task.host, []).append((job, task))
                for run in job.nodes:
                    if run.state != "running" or run.host in health.marks:
                        continue
                    beat = backend.heartbeat(attempt, run)
                    if beat is not None:
                        ages.setdefault(run.host, []).append(now - beat)
                since = ledger.shrunk_since.get(job.id)
                if since is None:
                    continue
                use = scheduler.usage(p for j, p in ledger.placements.items() if j != job.id)
                exclude = scheduler.exclusions(job.id, job.spec, job.excluded_nodes)
                possible = scheduler.place(job.id, job.spec, use, exclude)
                end = policies.on_scale_up(
                    job,
                    policies.workers(placement.tasks),
                    policies.workers(possible.tasks) if possible else 0,
                    time.monotonic() - since,
                    interval,
                    len(self._queue),
                )
                if end is not None:
                    self._journal.notice(job, end.reason.split(";")[0] + ": checkpointing to scale up")
                    self._watching.finish(job, attempt, end)
        if not judge:
            return
        for host, held in card_tasks.items():
            # the driver may take a while to answer (NVML): the supervisor's lock is not held
            why = next((w for w in (backend.card_fault(task) for _, task in held) if w), None)
            if why is None:
                continue
            with ledger.lock:
                if health.mark(host, "faulty", why, source="check"):
                    log.warning("node %s is faulty: %s", host, why)
                    self._journal.node_alert(host, why)
                    for job in {j.id: j for j, _ in held}.values():
                        self._journal.notice(job, f"node {host} is faulty: {why}", alert=True)
        for host, silent in ages.items():
            if min(silent) > timeout:
                why = (
                    f"no node runner there has beaten for {min(silent):.0f} s (more than {timeout:g} s; "
                    f"{len(silent)} running)"
                )
                with ledger.lock:
                    if health.mark(host, "faulty", why, source="heartbeat"):
                        log.warning("node %s is faulty: %s", host, why)
                        self._journal.node_alert(host, why)

    def precheck(self, job: Job, placement: Placement, excluded: tuple[str, ...] = ()) -> Precheck:
        """The pre-check before every placement of a checkpoint-resume job (its first one too;
        seed 002), rules 6 to 8: said as an event of the job.  Looks at the folder's metadata, the
        disk's free space and the real cards' state only (it runs under the lock)."""
        first = job.attempt == 0
        prefix = "pre-check before the first placement" if first else "pre-check before resume"
        folder = job.outputs_folder
        try:
            run_as = self._backend.job_account(job.spec.creator)
        except InvalidSpec as exc:  # the host rules changed since the submit
            return Precheck(False, f"{prefix} failed: {exc}", fatal=True)
        account = "the service's account" if run_as is None else f"{run_as.name} (uid {run_as.uid})"
        readable = bool(folder) and _usable_by(folder, run_as)
        if not readable and not (first and folder and not os.path.lexists(folder)):
            return Precheck(
                False,
                f"{prefix} failed: the checkpoint folder {folder} (the job's outputs) is missing, or not "
                f"readable and writable by {account}, the account the job runs as; give the folder back "
                f"to that account (chmod u+rwx, or chown it)",
                fatal=True,
            )
        said = [
            f"checkpoint folder {folder} "
            + (f"readable and writable by {account}" if readable else "not made yet (first attempt)")
        ]
        nodes = {n.name: n for n in self._scheduler.nodes()}
        for host in dict.fromkeys(t.host for t in placement.tasks):
            node = nodes.get(host)
            if node is None:
                continue
            passed = []
            failed, source, _ = self._checked(node, passed)
            if failed is not None:
                self._judge_node(host, failed, source)
                return Precheck(False, f"{prefix} failed on {host}: {failed}; placing the job elsewhere")
            said.append(f"{host}: " + (", ".join(passed) or "nothing to check"))
        hosts = ", ".join(dict.fromkeys(t.host for t in placement.tasks))
        avoided = [f"{n} ({m.status})" for n, m in self._health.snapshot().items()]
        avoided += [f"{n} (slow for this job)" for n in excluded if n not in self._health.statuses]
        reason = f"{prefix} passed: {'; '.join(said)}; placed on {hosts}" + (
            f", avoiding {', '.join(avoided)}" if avoided else ""
        )
        if job.excluded_nodes and not excluded:
            reason += (
                f" (no other node can ever hold this job: {', '.join(job.excluded_nodes)}, "
                "which it was rescheduled away from, is not avoided)"
            )
        self._journal.notice(job, reason)
        return Precheck(True, reason)

    # ------------------------------------------------------------------ node checks

    def check_nodes(self) -> None:
        """Rule 5: every inventory node's checks, idle nodes too (a node marked by an admin or
        by its heartbeats is looked at as well, but its mark stays)."""
        for node in self._scheduler.nodes():
            if node.status == "down":
                continue
            failed, source, free = self._checked(node)
            if source == "disk" and self._end_disk_writer(node.name, free):
                continue  # a job's own writing explains the disk: not the node's fault
            self._judge_node(node.name, failed, source)

    def node_checks(self, node: Node) -> tuple[str | None, list[str]]:
        """(why ``node`` cannot run training now, or None; what passed, in words): the checks of
        :meth:`_checked`, in words."""
        failed, _, _ = self._checked(node, passed := [])
        return failed, passed

    def _checked(self, node: Node, passed: list[str] | None = None) -> tuple[str | None, str, int]:
        """(why ``node`` cannot run training now, or None; the mark's source: ``disk`` for the
        disk check, ``check`` for a card; the free bytes of its job folders' disk, -1 when not
        known); what passed is appended to ``passed``.

        1. the free space of the disk of its job folders (the folders every job there writes:
           logs, node files, default outputs) against ``[limits] node_disk_free_mb``, as the
           backend sees it on the node's machine (:meth:`Backend.job_folders_free`; a node
           that does not answer is not judged by it);
        2. its real cards, every one of them (:meth:`Backend.card_fault`): the device node is
           there and the driver does not report it lost; emulated cards have nothing to check;
        3. its network (:meth:`Backend.network_fault`): a job network can be made on its
           machine and its nodes reach each other (seed 002's inspection of the network card;
           the local backend makes, crosses and removes one as an attempt would).
        """
        passed = [] if passed is None else passed
        found = self._backend.job_folders_free(node.name)
        free = -1
        if found is not None:
            root, free = found
            floor = self._scheduler.cluster.limits.node_disk_free_mb
            if free < floor * MIB:
                why = (
                    f"the job folders' disk ({root}) has {free / MIB:.1f} MB free, under "
                    f"[limits] node_disk_free_mb = {floor:g}"
                )
                return why, "disk", free
            passed.append(f"job folders' disk {free / MIB:.0f} MB free (at least {floor:g})")
        if node.emulated is False and node.accelerators:
            cards = tuple(node.card_indices)
            task = TaskSlot(
                role="worker", index=0, host=node.name, devices=cards, card_type=node.accelerator_type
            )
            why = self._backend.card_fault(task)
            if why is not None:
                return f"card check: {why}", "check", free
            passed.append(f"{len(cards)} {node.accelerator_type} card(s) answering")
        why = self._backend.network_fault(node.name)
        if why is not None:
            return f"network check: {why}", "check", free
        return None, "check", free

    def _end_disk_writer(self, name: str, free: int) -> bool:
        """Rule 5's writer: end the running job on node ``name`` that wrote the most on its job
        folders' disk (``free`` bytes free) since the reserve's last look, if it wrote fast
        enough; True when one is being ended.  Only where that disk is this machine's jobs
        folder (the reserve measures there)."""
        found = self._backend.job_folders_free(name)
        if found is None or free < 0 or os.path.realpath(found[0]) != os.path.realpath(config.jobs_root()):
            return False
        floor = int(self._scheduler.cluster.limits.node_disk_free_mb * MIB)
        ledger = self._ledger
        with ledger.lock:
            there = {
                job_id
                for job_id, p in ledger.placements.items()
                if job_id not in ledger.finishing and any(t.host == name for t in p.tasks)
            }
            grown = {j: b for j, b in self._grown.items() if j in there}
            seconds = self._grown_seconds
            victim = policies.reserve_offender(grown, seconds, free, floor, config.DISK_FLOOD_RATE)
            if victim is None:
                return False
            job = self._store.get(victim)
            placement = ledger.placements.get(victim)
            if job.status is not JobStatus.running or placement is None:
                return False
            end = policies.on_node_disk(found[0], name, free, floor, grown[victim], seconds)
            log.warning("job %s: %s", victim, end.reason)
            self._grown.pop(victim, None)
            self._watching.finish(job, attempt_for(self._store, job, placement), end)
            return True

    def _judge_node(self, name: str, failed: str | None, source: str = "check") -> None:
        """Mark ``name`` faulty for ``failed`` (an alert to the jobs running there and to the
        notification hook; ``source`` ``disk``: the mark only holds new work off), or clear the
        mark a node check set once it passes."""
        with self._ledger.lock:
            if failed is None:
                if self._health.clear_checked(name) is not None:
                    log.warning("node %s passes its checks again: back in placement", name)
                    self._ledger.queue_changed()
                return
            if not self._health.mark(name, "faulty", failed, source=source):
                return
            log.warning("node %s is faulty: %s", name, failed)
            if source == "disk":
                failed += "; the jobs running there keep running, new work is held off the node"
            there = [
                job_id
                for job_id, p in self._ledger.placements.items()
                if any(t.host == name for t in p.tasks)
            ]
            self._journal.node_alert(name, failed)
            for job_id in there:
                try:
                    job = self._store.get(job_id)
                except NotFound:
                    continue
                self._journal.notice(job, f"node {name} is faulty: {failed}", alert=True)

    # ----------------------------------------------------------------- the disk reserve

    def reserve_loop(self) -> None:
        """The disk reserve's thread: a look every ``DISK_CHECK_EVERY`` seconds until the halt."""
        while not self._ledger.halt.wait(DISK_CHECK_EVERY):
            try:
                self.watch_reserve()
            except Exception:  # the next look tries again; the jobs' own disk checks still run
                log.exception("keeping the disk reserve failed")

    def watch_reserve(self) -> None:
        """Keep the jobs folder's disk reserve (:mod:`..policies`, "across running jobs"): under
        twice the reserve, measure what each running job holds there; under the reserve, end
        the one writing the most (:func:`..policies.on_reserve`)."""
        ledger = self._ledger
        now = time.monotonic()
        seconds, self._reserve_watched = now - self._reserve_watched, now
        limits = self._scheduler.cluster.limits
        reserve = int(limits.disk_reserve_mb * (1 << 20))
        root = config.jobs_root()
        free = free_bytes(root)
        # measured under the node check's floor too: rule 5 names the writer from it
        if free is None or free >= 2 * max(reserve, int(limits.node_disk_free_mb * MIB)):
            self._held, self._grown = {}, {}
            self._watching.disk_grown = None
            return
        device = os.stat(root).st_dev
        held: dict[str, int] = {}
        attempts: dict[str, Attempt] = {}
        for job in self._store.by_status(JobStatus.running):
            with ledger.lock:
                placement = ledger.placements.get(job.id)
                if placement is None or job.id in ledger.finishing:
                    continue
                attempts[job.id] = attempt = attempt_for(self._store, job, placement)
            folders = policies.disk_folders(attempt.spec, attempt.jobdir.root, attempt.jobdir.outputs)
            held[job.id] = disk_use(folders, device)
        before, self._held = self._held, held
        grown = {j: held[j] - before[j] for j in held if j in before}
        self._grown, self._grown_seconds = grown, seconds
        self._watching.disk_grown = grown
        if free >= reserve or free < FULL_BELOW:
            return  # outside the reserve; or full, where each job writing there ends ("disk full")
        victim = policies.reserve_offender(grown, seconds, free, reserve, config.DISK_FLOOD_RATE)
        if victim is None:
            return
        end = policies.on_reserve(root, free, reserve, grown[victim], seconds)
        with ledger.lock:
            job = self._store.get(victim)
            if job.status is JobStatus.running and victim not in ledger.finishing:
                log.warning("job %s: %s", victim, end.reason)
                self._held.pop(victim, None)
                self._watching.finish(job, attempts[victim], end)
