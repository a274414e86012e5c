"""The supervisor's decisions, as pure functions of a job's state and its nodes' states.

Nothing here reads the store, calls a backend, looks at a clock or touches a file: the
supervisor gathers the facts (the job on a fresh read, the desired action, the node states, the
first full folder, ``now``) and carries out what a function here returns.  Each decision can so
be tested with plain values.

The order of the checks is itself a decision.  Each poll of a running job:

1. a job that is not ``running`` (a stale copy, or one that finished meanwhile) or that is
   already being wound down is left alone;
2. a stop or delete request ends it as ``stopped`` (the job's grace period);
3. an end decided earlier that the store could not record (its disk was full) is recorded now;
4. a full folder among those the job writes to ends it in ``error`` (:func:`disk_folders`),
   but on the jobs folder's disk a job that wrote nothing there lately is spared while another
   job did, or for one look (:func:`full_disk_ends`);
5. running past its duration (strictly more than ``duration`` seconds) ends it as ``expired``;

then the nodes are polled, and:

5a. a node running on an inventory node that is drained or faulty (:mod:`.health`) moves the
   job away (:func:`on_unhealthy`): with checkpoint resume left the platform sends SIGTERM,
   waits the resume's grace period for the checkpoint and puts the job back in the queue (a
   pre-check runs before it starts again, and placement avoids the node); on a faulty node
   without it, a fault restart left does the same, else the job ends in ``error`` naming the
   node; on a drained node without it, the job keeps running (a drain only stops new
   placements), and so does every job on a node out of placement for its disk (whose own
   writing did not explain the disk's use, see "across running jobs" below);
6. the first failed node (lost, or exited with a code other than 0) fails the job: it is put
   back in the queue while fault restarts or checkpoint resumes remain, else it ends in
   ``error``; a full folder at that moment is named as the likely cause instead;
7. a performance sample over the checkpoint-resume threshold reschedules the job (policy
   ``reschedule`` with resumes left) away from the slow node, otherwise it is reported once
   per node and attempt;
8. every primary node having exited with code 0 ends it as ``succeeded`` (other nodes, such as
   parameter servers, are stopped).
9. a job that wrote nothing to its logs and used almost no CPU (:data:`HANG_CPU_SHARE` of one
   core over the spell) and none of its cards for ``[limits] hang_minutes`` looks hung
   (:func:`on_quiet`): it is told once per quiet spell in an alert naming what each node's
   processes wait on (:func:`hang_alert`), and with ``hang_policy = stop`` it also ends in
   ``error`` (:func:`on_hang`).  Any log output, CPU or card use starts a new spell.  A dev
   environment is never watched (:func:`watches_hangs`): its kernel waits for its user.

A batch job's tasks are independent runs, so rules 6 and 8 become one (:func:`on_batch`): the
job ends once every task has ended, failed if any task failed, naming them all.

Across running jobs, once a second while the jobs folder's disk has less than twice the reserve
(``[limits] disk_reserve_mb``) free, the supervisor measures what each running job holds there
(its job folder, its outputs and volumes on that disk); under the reserve, the job that grew
the most since the previous look ends in ``error`` (:func:`on_reserve`) if it wrote fast enough
(:func:`reserve_offender`: 1 MB/s just under the reserve, less the fuller the disk): one job's writing ends that job, before the disk is full for every job and every
submit.  None writing ends nobody (a disk full of finished jobs' files is not a running job's
doing), nor does a disk already full (rule 4 ends each job writing there).  The node runner
applies the same rate to the job's logs at each of its samples (every 0.2 s), so a log flood
is ended sooner than the supervisor's look would.

When an attempt has been wound down (:func:`settle`), a stop or delete requested meanwhile wins
over putting the job back in the queue.  The end is written to the store before the wind-down
starts (:func:`end_record`): a service restarted meanwhile carries out that end first, before
rule 2 (:func:`carried_end`), since stopping the nodes changes what a fresh poll would infer
(a node the wind-down stopped would read as the first failure).

What a user reads of these decisions (every reason, notice and message) is worded in
:mod:`.policy_texts`; a function here picks the text and gives it the facts.  The module stays
one (about 680 lines): its rules are one ordered sequence, numbered above, read side by side.

Why one module (over 600 lines): it is the supervisor's decision table, numbered above: each
function is one pure step of that order, and the text of an end (its reason, an alert) is part
of what the step decides (the same facts choose both), so the steps and their texts stay
together; the supervisor's rooms only carry them out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from ..errors import Conflict, DiskFull, InvalidSpec
from ..models import Job, JobSpec, JobStatus, NodeRun, Priority
from . import policy_texts as texts

#: seconds the remaining nodes get to stop when the job ends by itself (success or error)
WIND_DOWN_GRACE = 5.0
# The per-iteration timing line the platform's performance detection reads, e.g.
# "this iteration hardware time is 2201.521 and e2e time is 3317.794921875 ms."
PERF_LINE = re.compile(r"hardware time is ([0-9.]+) and e2e time is ([0-9.]+)")

Reason = str | Callable[[], str]


@dataclass(frozen=True)
class End:
    """How to end a job's current attempt.

    Attributes:
        status: the status to record once the nodes have stopped (``queued`` with ``requeue``).
        reason: the event's text, or a function giving it (called on the finishing thread, as it
            may read files the job wrote).
        grace: seconds the nodes get between SIGTERM and SIGKILL.
        exit_code: recorded as the job's exit code (when the job does not go back to the queue).
        requeue: the job goes back to the queue for another attempt.
        failed: the node whose failure ended the attempt (its final state stays ``lost``).
        pending: the disk is full: keep the reason in memory until it could be recorded.
        counted: a requeue that uses one of the job's restarts or resumes (an elastic scale-up
            does not).
        exclude: inventory nodes the job's next placements avoid (a slow node, rule 7).
    """

    status: JobStatus
    reason: Reason
    grace: float
    exit_code: int | None = None
    requeue: bool = False
    failed: NodeRun | None = None
    pending: bool = False
    counted: bool = True
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settled:
    """What is recorded once an attempt has been wound down."""

    status: JobStatus
    reason: str
    requeue: bool
    remove: bool


# --------------------------------------------------------------------------- requests


def recovery(job: Job, has_placement: bool) -> Literal["stop_partial_launch", "reattach", "none"]:
    """What a starting service does with a job a previous one left.

    A queued job with a stored placement was being launched when the service stopped: its
    partly started nodes are stopped and it waits in the queue.  A running job with a placement
    is re-attached to.  Anything else needs nothing.
    """
    if not has_placement:
        return "none"
    if job.status is JobStatus.queued:
        return "stop_partial_launch"
    if job.status is JobStatus.running:
        return "reattach"
    return "none"


def stop_action(job: Job, desired: str | None) -> Literal["now", "request", "none"]:
    """A stop request: a queued job stops now; a running one is asked to (unless it is already
    being stopped to be deleted); a finished one is left as it is."""
    if job.status is JobStatus.queued:
        return "now"
    if job.status is JobStatus.running and desired != "delete":
        return "request"
    return "none"


def delete_action(job: Job, force: bool) -> Literal["remove", "refuse", "mark", "stop_then_remove"]:
    """A delete request: a finished job is removed; a live one only with ``force``, a running
    one once its nodes have stopped (``mark``), a queued one at once (``stop_then_remove``)."""
    if job.status.is_terminal():
        return "remove"
    if not force:
        return "refuse"
    if job.status is JobStatus.running:
        return "mark"
    return "stop_then_remove"


def updated_spec(job: Job, priority: Priority | None, duration: float | None) -> tuple[JobSpec, list[str]]:
    """The spec after an update, and the changes said in words.

    Raises:
        Conflict: the priority of a job that is not queued, or the duration of a finished job.
        InvalidSpec: nothing to change.
    """
    spec = job.spec
    changes = []
    if priority is not None:
        if job.status is not JobStatus.queued:
            raise Conflict(texts.priority_refused(job))
        spec = spec.model_copy(update={"priority": priority})
        changes.append(texts.priority_set(priority))
    if duration is not None:
        if job.status not in (JobStatus.queued, JobStatus.running):
            raise Conflict(texts.duration_refused(job))
        spec = spec.model_copy(update={"duration": duration})
        changes.append(texts.duration_set(duration))
    if not changes:
        raise InvalidSpec(texts.NOTHING_TO_UPDATE)
    return spec, changes


def on_refused_file(job: Job, finishing: bool, has_placement: bool) -> Literal["finish", "error", "none"]:
    """A live job did something the service refuses (e.g. planted a file it will not read): a
    running one is wound down, a queued one ends at once; one already ending is left alone."""
    if job.status.is_terminal() or finishing:
        return "none"
    if job.status is JobStatus.running and has_placement:
        return "finish"
    if job.status is JobStatus.queued:
        return "error"
    return "none"


def on_supervise_error(job: Job, finishing: bool, has_placement: bool) -> Literal["finish", "error", "none"]:
    """Supervising a job failed unexpectedly: a running job is wound down (its grace period), or
    ends at once without a placement; a queued one ends at once; one already ending is left."""
    if job.status is JobStatus.queued:
        return "error"
    if job.status is JobStatus.running and not finishing:
        return "finish" if has_placement else "error"
    return "none"


def is_disk_full(exc: BaseException) -> bool:
    """Whether an error says the disk (or the user's quota) is full."""
    from errno import EDQUOT, ENOSPC

    return isinstance(exc, DiskFull) or (isinstance(exc, OSError) and exc.errno in (ENOSPC, EDQUOT))


def launch_failure(exc: BaseException, job_dir: Path) -> str:
    """Why a job could not start, from the error its launch raised."""
    if isinstance(exc, OSError) and is_disk_full(exc):
        return texts.launch_disk_full(exc, job_dir)
    return texts.error_text(exc)


def attempt_env(job: Job) -> dict[str, str]:
    """Variables telling the training code which attempt it is, so a resumed or restarted
    attempt can load its checkpoint (``MA_RESUME`` only with checkpoint resume)."""
    env = {"MA_ATTEMPT": str(job.attempt)}
    if job.spec.checkpoint_resume:
        env["MA_RESUME"] = "1" if job.attempt else "0"
    return env


# ------------------------------------------------------------------------ each poll


def reserve_offender(
    grown: dict[str, int], seconds: float, free: int, reserve: int, flood_rate: float
) -> str | None:
    """The job to end for the disk reserve: the one that wrote the most (``grown``: job id ->
    bytes its folders grew by in the last ``seconds``), if it wrote fast enough.

    Fast enough is ``flood_rate`` (bytes per second, :data:`ma_jupyter.config.DISK_FLOOD_RATE`)
    just under the reserve, less the deeper the disk is into it (``flood_rate * free /
    reserve``): a slow flood is ended too before the disk is full, and only once it is nearly
    full is a job writing a little the one ended (a job printing lines is not ended for
    another's flood).
    """
    if not grown or seconds <= 0 or reserve <= 0:
        return None
    job_id = max(grown, key=lambda j: grown[j])
    rate = grown[job_id] / seconds
    return job_id if rate > 0 and rate >= flood_rate * max(free, 0) / reserve else None


def on_reserve(path: Path, free: int, reserve: int, grown: int, seconds: float) -> End:
    """End the job writing the most while the disk of ``path`` (the jobs folder) has less than
    ``reserve`` bytes ``free``; the reason names the disk, the reserve and what the job wrote."""
    reason = texts.reserve_reason(path, free, reserve, grown, seconds)
    return End(JobStatus.error, reason, WIND_DOWN_GRACE, pending=True)


def on_node_disk(root: str | Path, node: str, free: int, floor: int, grown: int, seconds: float) -> End:
    """End the job writing the most on node ``node`` while its job folders' disk (``root``) has
    less than ``floor`` bytes (``[limits] node_disk_free_mb``) ``free``: the job's own writing,
    not the node, is the cause, so the job ends and the node stays in placement; the reason
    names the disk, the threshold and what the job wrote."""
    reason = texts.node_disk_reason(root, node, free, floor, grown, seconds)
    return End(JobStatus.error, reason, WIND_DOWN_GRACE, pending=True)


def full_disk_ends(grown: int | None, measured: bool, others_grew: bool, full_before: bool) -> bool:
    """Rule 4: whether a full folder of a running job ends it now.

    1. a full folder the disk reserve does not measure (``measured`` False: outputs or a volume
       on another disk, no reserve) ends it, as does a jobs disk the job itself wrote on between
       the reserve's last two looks (``grown`` bytes > 0; None: not measured yet);
    2. a job that wrote nothing there keeps running while another running job did
       (``others_grew``): the writer is the one ended, and a log overflow cut at its end gives
       the room back (another user's job is not ended for that user's flood);
    3. otherwise it ends once the disk was full at its previous look too (``full_before``): a
       disk that stays full with no writer to blame is every job's end, as before.
    """
    if not measured or (grown is not None and grown > 0):
        return True
    if others_grew:
        return False
    return full_before


def disk_folders(spec: JobSpec, job_dir: Path, default_outputs: Path) -> list[Path]:
    """The folders a job writes to, looked at for a full disk: its job folder, its outputs
    (``default_outputs``, the job folder's own, unless it names one) and its volumes, in that order."""
    folders = [job_dir]
    folders += [Path(spec.outputs)] if spec.outputs else [default_outputs]
    folders += [Path(v.path) for v in spec.volumes]
    return folders


def before_poll(
    job: Job, *, desired: str | None, pending_end: str | None, disk_full: Path | None, now: datetime
) -> End | None:
    """Rules 2-5 of the module docstring, in that order: how a running job ends before its
    nodes are polled, or None to poll them."""
    if desired in ("stop", "delete"):
        return End(JobStatus.stopped, texts.stopped_by_user(desired == "delete"), job.spec.grace_period)
    if pending_end is not None:
        return End(JobStatus.error, pending_end, WIND_DOWN_GRACE, pending=True)
    if disk_full is not None:
        return End(JobStatus.error, texts.disk_full_stopped(disk_full), WIND_DOWN_GRACE, pending=True)
    if job.spec.duration and job.started_at:
        if (now - job.started_at).total_seconds() > job.spec.duration:
            return End(JobStatus.expired, texts.expired(job.spec.duration), job.spec.grace_period)
    return None


def first_failure(runs: Sequence[NodeRun]) -> NodeRun | None:
    """The first node that failed: lost, or exited with a code other than 0."""
    for run in runs:
        if run.state == "lost" or (run.state == "exited" and run.exit_code != 0):
            return run
    return None


def on_failure(job: Job, run: NodeRun, reason: Reason, disk_full: Path | None = None) -> End:
    """A node failed (rule 6).

    A full folder is named as the cause (and the job ends in error).  Otherwise a fault restart
    left puts the job back in the queue after the job's grace period, else a checkpoint resume
    left after the resume's grace period; else the job ends in error with the node's exit code.
    """
    if disk_full is not None:
        text = texts.node_failed_disk_full(disk_full, run.name)
        return End(JobStatus.error, text, WIND_DOWN_GRACE, exit_code=run.exit_code, failed=run, pending=True)
    spec = job.spec
    if spec.fault_restart and job.restarts < spec.fault_restart.max_restarts:
        prefix = texts.fault_restart_prefix(job.restarts, spec.fault_restart.max_restarts)
        return End(JobStatus.queued, _prefixed(prefix, reason), spec.grace_period, requeue=True, failed=run)
    if spec.checkpoint_resume and job.restarts < spec.checkpoint_resume.max_resumes:
        prefix = texts.resume_prefix(job.restarts, spec.checkpoint_resume.max_resumes)
        return End(
            JobStatus.queued,
            _prefixed(prefix, reason),
            spec.checkpoint_resume.grace_period,
            requeue=True,
            failed=run,
        )
    return End(JobStatus.error, reason, WIND_DOWN_GRACE, exit_code=run.exit_code, failed=run)


def on_unhealthy(
    job: Job,
    runs: Sequence[NodeRun],
    marks: dict[str, tuple[str, str]],
    only_new_work: Collection[str] = (),
) -> tuple[str | None, End | None]:
    """Rule 5a: a live node of the job runs on an inventory node marked drained or faulty
    (``marks``: node name -> (status, why)).  Returns (the event saying what the platform does,
    the end of the attempt); (None, None) when no live node is on a marked one.

    0. the marks of ``only_new_work`` (a node whose job folders' disk is under its threshold,
       :attr:`.health.Mark.only_new_work`) only keep new work off: a job running there keeps
       running (the event only), unless another of its nodes is on a node of rules 1-4;
    1. checkpoint resume with resumes left: SIGTERM, the resume's grace period for the
       checkpoint, back to the queue (the next placement avoids the node);
    2. faulty, fault restart left: back to the queue after the job's grace period;
    3. faulty: the job ends in ``error`` naming the node;
    4. drained: the job keeps running (the event only, which the caller says once).
    """
    bad = [r for r in runs if r.state in ("running", "pending") and r.host in marks]
    if not bad:
        return None, None
    moving = [r for r in bad if r.host not in only_new_work]
    if not moving:
        status, why = marks[bad[0].host]
        return texts.keeps_running(texts.unhealthy_node(bad[0].host, status, why)), None
    run = moving[0]
    status, why = marks[run.host]
    what = texts.unhealthy_node(run.host, status, why)
    spec = job.spec
    resume = spec.checkpoint_resume
    if resume and job.restarts < resume.max_resumes:
        notice = texts.unhealthy_resume_notice(what, resume.grace_period, run.host)
        reason = texts.unhealthy_resume_reason(what, job.restarts, resume.max_resumes, resume.grace_period)
        return notice, End(JobStatus.queued, reason, resume.grace_period, requeue=True)
    if status == "faulty":
        if spec.fault_restart and job.restarts < spec.fault_restart.max_restarts:
            reason = texts.fault_restart_prefix(job.restarts, spec.fault_restart.max_restarts) + what
            return None, End(JobStatus.queued, reason, spec.grace_period, requeue=True)
        return None, End(JobStatus.error, texts.unhealthy_stopped(what, run.name), WIND_DOWN_GRACE)
    return texts.keeps_running(what), None


def workers(tasks) -> int:
    """How many worker tasks a placement has (an elastic job's size)."""
    return sum(1 for t in tasks if t.role == "worker")


def on_scale_up(
    job: Job, running: int, possible: int, shrunk_for: float, interval: float, queued: int
) -> End | None:
    """An elastic job running on ``running`` of its ``nodes`` workers could have ``possible``
    now: it scales up the seed's way (SIGTERM, the resume's grace period for the checkpoint,
    back to the queue, resumed with more nodes; the requeue uses none of its resumes) when

    0. it allows scale-up (``checkpoint_resume.allow_scale_up``, the seed's switch);
    1. more workers fit now than it has;
    2. it has run shrunk for at least ``interval`` seconds (the admin's bound: no flapping);
    3. no job waits in the queue (``queued``): freed nodes go to waiting jobs first.
    """
    resume = job.spec.checkpoint_resume
    if not resume or not resume.elastic_min_nodes or not resume.allow_scale_up:
        return None
    if running >= job.spec.nodes:
        return None
    if possible <= running or shrunk_for < interval or queued:
        return None
    reason = texts.scale_up_reason(possible, job.spec.nodes, running, resume.grace_period)
    return End(JobStatus.queued, reason, resume.grace_period, requeue=True, counted=False)


def _prefixed(prefix: str, reason: Reason) -> Reason:
    if callable(reason):
        return lambda: prefix + reason()
    return prefix + reason


def perf_samples(text: str) -> list[tuple[float, float]]:
    """The (hardware, e2e) times of every performance line in a piece of log."""
    return [(float(m.group(1)), float(m.group(2))) for m in PERF_LINE.finditer(text)]


def on_perf(
    job: Job, node: str, samples: Sequence[tuple[float, float]], alerted: bool, host: str | None = None
) -> tuple[str | None, End | None]:
    """Performance detection on one node's new samples (rule 7): (alert text, reschedule).

    The first sample whose hardware/e2e ratio exceeds the threshold decides: with the
    ``reschedule`` policy and resumes left the job goes back to the queue (the resume's grace
    period) and its next placements avoid ``host``, the inventory node the slow ``node`` ran
    on (:attr:`End.exclude`; the scheduler lifts it only when no other node could ever hold the
    job); otherwise the alert is reported, once (``alerted``: it already was for this node and
    attempt).  (None, None) when no sample exceeds the threshold or there is no threshold.
    """
    resume = job.spec.checkpoint_resume
    if not resume or not resume.perf_threshold:
        return None, None
    for hardware, e2e in samples:
        if e2e <= 0 or hardware / e2e <= resume.perf_threshold:
            continue
        what = texts.perf_alert(node, hardware / e2e, resume.perf_threshold)
        if resume.perf_policy.value == "reschedule" and job.restarts < resume.max_resumes:
            head = texts.resume_prefix(job.restarts, resume.max_resumes)
            reason = texts.perf_rescheduled(head, what, host)
            if host is None:
                return None, End(JobStatus.queued, reason, resume.grace_period, requeue=True)
            return None, End(JobStatus.queued, reason, resume.grace_period, requeue=True, exclude=(host,))
        return (None if alerted else what), None
    return None, None


#: share of one core a job's processes may use, averaged over a quiet spell, and still look hung
#: (a launcher's or a lock's polling loop uses about 2 %)
HANG_CPU_SHARE = 0.05
#: card use (percent) above which a job is busy, whatever its CPU
HANG_CARD_PERCENT = 1.0


@dataclass(frozen=True)
class QuietSpell:
    """A running attempt's quiet spell so far (rule 9): when it began (the supervisor's clock,
    seconds), the job's log bytes and CPU seconds then, and whether it was told."""

    since: float
    log_bytes: int
    cpu_seconds: float
    told: bool = False


def watches_hangs(job: Job) -> bool:
    """Whether rule 9 applies to ``job``: not to a dev environment, whose kernel waits for its
    user in silence by design."""
    return job.spec.devenv_of is None


def on_quiet(
    spell: QuietSpell | None,
    log_bytes: int,
    cpu_seconds: float,
    card_percent: float,
    now: float,
    window: float,
) -> tuple[QuietSpell, bool]:
    """Rule 9 at one look: the spell after it, and whether the job looks hung now (True once a
    spell: ``told`` then stays set until activity starts a new one).

    ``log_bytes`` and ``cpu_seconds`` are the attempt's totals now (all nodes), ``card_percent``
    its busiest card's use (0 without cards), ``window`` the seconds of ``[limits] hang_minutes``.
    """
    if spell is None:
        return QuietSpell(now, log_bytes, cpu_seconds), False
    elapsed = max(0.0, now - spell.since)
    busy = (
        log_bytes != spell.log_bytes
        or card_percent > HANG_CARD_PERCENT
        or cpu_seconds - spell.cpu_seconds > HANG_CPU_SHARE * elapsed
    )
    if busy:
        return QuietSpell(now, log_bytes, cpu_seconds), False
    if spell.told or elapsed < window:
        return spell, False
    return QuietSpell(spell.since, spell.log_bytes, spell.cpu_seconds, told=True), True


def on_hang(job: Job, minutes: float) -> End | None:
    """Rule 9's end: with ``hang_policy = stop`` the job ends in ``error`` (its grace period),
    else None (the alert alone)."""
    if job.spec.hang_policy.value != "stop":
        return None
    return End(JobStatus.error, texts.hang_stopped(minutes), job.spec.grace_period)


def on_batch(job: Job, runs: Sequence[NodeRun], reason: Callable[[NodeRun], str]) -> End | None:
    """Rules 6 and 8 for a batch job, whose tasks are independent runs: a failing task leaves its
    siblings running, and the job ends once every task has ended (None while one still runs).

    Every task succeeded: the job succeeded.  Otherwise the failure names every failed task
    (``reason`` gives the first one's details); a fault restart or checkpoint resume left puts
    the job back in the queue, where its next attempt runs the failed tasks only (the tasks that
    succeeded keep their result); else the job ends in ``error`` with the first failed task's
    exit code.
    """
    if any(r.state in ("running", "pending") for r in runs):
        return None
    failed = [r for r in runs if r.state == "lost" or (r.state == "exited" and r.exit_code != 0)]
    if not failed:
        return on_success(runs)
    first = failed[0]

    def text() -> str:
        return texts.batch_failed(len(runs), [r.name for r in failed], reason(first))

    return on_failure(job, first, text)


def on_success(runs: Sequence[NodeRun]) -> End | None:
    """Every primary node exited with code 0 (rule 8): the job succeeded, its other nodes are
    stopped.  None while a primary node has not, or when there is no primary node."""
    primaries = [r for r in runs if r.primary]
    if not primaries or not all(r.state == "exited" and r.exit_code == 0 for r in primaries):
        return None
    others = [r.name for r in runs if not r.primary]
    if not others:
        return End(JobStatus.succeeded, texts.ALL_SUCCEEDED, WIND_DOWN_GRACE, exit_code=0)
    # a parameter server never ends by itself: its exit code after this stop (143) is no failure
    reason = texts.primaries_succeeded([r.name for r in primaries], others)
    return End(JobStatus.succeeded, reason, WIND_DOWN_GRACE, exit_code=0)


# ---------------------------------------------------------------------- winding down


def live_nodes(runs: Sequence[NodeRun]) -> list[NodeRun]:
    """The nodes to stop when an attempt ends."""
    return [r for r in runs if r.state in ("running", "pending")]


def final_node_states(runs: Sequence[NodeRun], failed: NodeRun | None) -> list[NodeRun]:
    """The node states recorded after the wind-down: a node gone without an exit code was
    stopped by it, except the node whose loss ended the attempt (it stays ``lost``)."""
    keep = failed.name if failed else None
    return [
        r.model_copy(update={"state": "stopped"}) if r.state == "lost" and r.name != keep else r for r in runs
    ]


def end_record(end: End, attempt: int) -> dict:
    """``end`` of attempt ``attempt`` as the store keeps it ahead of its wind-down (JSON values):
    a service restarted before the end was recorded carries out the same end
    (:func:`carried_end`) rather than one it would infer from the nodes the wind-down stopped.

    A reason given as text is kept as it is.  One given as a function (a failed node's: it reads
    the node's log and report, which may take a while on another machine) is not called here,
    so the other nodes' stop is not delayed: the record keeps the failed node, and
    :func:`carried_end` builds that failure's end again (the node's files are the same after
    the stop)."""
    return {
        "attempt": attempt,
        "status": end.status.value,
        "reason": None if callable(end.reason) else end.reason,
        "grace": end.grace,
        "exit_code": end.exit_code,
        "requeue": end.requeue,
        "failed": end.failed.model_dump(mode="json") if end.failed else None,
        "counted": end.counted,
        "exclude": list(end.exclude),
    }


def carried_end(job: Job, record: dict | None, failure_reason: Callable[[NodeRun], str]) -> End | None:
    """The end a previous service began for the job's current attempt (:func:`end_record`).

    None when there is none, or when the record is of an earlier attempt (the end's record clears
    it in the same write; a store an older version wrote may still hold one an ended attempt
    left): only a job put back in the queue runs again (with the next attempt's number), and a
    job that ended otherwise is never re-attached to.  A record without a reason is a failed
    node's end: it is decided again by :func:`on_failure` from that node, with
    ``failure_reason(node)`` as its details.

    Raises:
        ValueError, KeyError, TypeError: the record is not one :func:`end_record` made.
    """
    if not record or record.get("attempt") != job.attempt:
        return None
    failed = NodeRun.model_validate(record["failed"]) if record.get("failed") else None
    if record.get("reason") is None:
        if failed is None:
            raise ValueError("an end written ahead without a reason names no failed node")
        return on_failure(job, failed, lambda: failure_reason(failed))
    return End(
        JobStatus(record["status"]),
        str(record["reason"]),
        float(record["grace"]),
        exit_code=record.get("exit_code"),
        requeue=bool(record.get("requeue")),
        failed=failed,
        counted=bool(record.get("counted", True)),
        exclude=tuple(record.get("exclude") or ()),
    )


def settle(end: End, reason_text: str, desired: str | None) -> Settled:
    """What to record once the attempt has been wound down: a stop or delete requested
    meanwhile wins over going back to the queue; a delete removes the job once recorded."""
    status, reason, requeue = end.status, reason_text, end.requeue
    if requeue and desired in ("stop", "delete"):
        status, reason, requeue = JobStatus.stopped, texts.stopped_by_user(), False
    return Settled(status, reason, requeue, remove=desired == "delete")


def record_updates(
    current: Job,
    settled: Settled,
    nodes: list[NodeRun],
    exit_code: int | None,
    now: datetime,
    counted: bool = True,
    exclude: Sequence[str] = (),
) -> dict:
    """The job's fields to update with the settled end: its nodes, and either the next attempt
    (one more restart, unless not ``counted``; the nodes in ``exclude`` added to those its
    placements avoid) or its exit code and end time."""
    updates: dict = {"nodes": nodes}
    if settled.requeue:
        updates.update(attempt=current.attempt + 1, restarts=current.restarts + int(counted))
        if exclude:
            updates["excluded_nodes"] = list(dict.fromkeys([*current.excluded_nodes, *exclude]))
    else:
        updates.update(exit_code=exit_code, finished_at=now)
    return updates


def estimated_end(job: Job) -> float | None:
    """When a running job will end at the latest (epoch seconds): its start plus its duration;
    None when it has no duration."""
    if job.spec.duration is None or job.started_at is None:
        return None
    return job.started_at.timestamp() + job.spec.duration
