"""The words of the supervisor's decisions: every reason, notice and message a user reads about
a job's life, as pure functions of the facts they name.

:mod:`.policies` decides (which end, which status, which grace period, which text applies);
this module only says it.  Nothing here decides, reads the store, looks at a clock or touches
a file: each function formats what it is given, so a wording changes here without touching a
rule, and a rule's tests read its outcome while the words' tests read the words.

The texts follow the rules' order (the numbers of :mod:`.policies`' docstring): requests, each
poll (rules 2-9, the disk reserve), winding down, then how a node ended and why a job waits.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .guard import disk_full_message

if TYPE_CHECKING:
    from ..models import Job, NodeRun, Priority

# --------------------------------------------------------------------------- requests

#: an update that names nothing to change
NOTHING_TO_UPDATE = "nothing to update: give priority or duration"


def priority_refused(job: Job) -> str:
    """The priority of a job that is not queued cannot change."""
    return f"only a queued job's priority can change; {job.id} is {job.status.value}"


def duration_refused(job: Job) -> str:
    """The duration of a finished job cannot change."""
    return f"only a queued or running job's duration can change; {job.id} is {job.status.value}"


def priority_set(priority: Priority) -> str:
    """An update's change of priority, in words."""
    return f"priority set to {priority.value}"


def duration_set(duration: float) -> str:
    """An update's change of duration, in words."""
    return f"duration set to {duration:g} s"


def launch_disk_full(exc: OSError, job_dir: Path) -> str:
    """A launch failed on a full disk: the folder of the file it could not write (else the job's)."""
    return disk_full_message(Path(exc.filename).parent if exc.filename else job_dir)


def error_text(exc: BaseException) -> str:
    """An error as one line: a typed error's message, else its type and text."""
    return exc.message if hasattr(exc, "message") else f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------ each poll


def stopped_by_user(delete: bool = False) -> str:
    """Rule 2 (and a stop that wins over a requeue): the user's stop, or the stop before a delete."""
    return "stopped by user" + (" to delete it" if delete else "")


def disk_full_stopped(folder: Path) -> str:
    """Rule 4: a full folder the job writes to stopped it."""
    return disk_full_message(folder, "the job was stopped; free space there and submit it again")


def expired(duration: float) -> str:
    """Rule 5: the job ran past its duration."""
    return f"ran past its duration of {duration:g} s"


def reserve_reason(path: Path, free: int, reserve: int, grown: int, seconds: float) -> str:
    """The disk reserve ended the job writing the most under ``path`` (the jobs folder): the
    disk, the reserve and what the job wrote."""
    mb = 1 << 20
    return (
        f"disk nearly full under {path}: {free / mb:.1f} MB free, under the reserve of {reserve / mb:g} MB "
        f"([limits] disk_reserve_mb); this job wrote the most there ({grown / mb:.1f} MB in the last "
        f"{seconds:.1f} s) and was stopped so that the other jobs keep their room"
    )


def node_disk_reason(root: str | Path, node: str, free: int, floor: int, grown: int, seconds: float) -> str:
    """A node's job folders' disk under ``[limits] node_disk_free_mb`` ended the job writing the
    most there: the disk, the threshold and what the job wrote."""
    mb = 1 << 20
    return (
        f"the job folders' disk ({root}) of node {node} has {free / mb:.1f} MB free, under [limits] "
        f"node_disk_free_mb = {floor / mb:g}; this job wrote the most there ({grown / mb:.1f} MB in the "
        f"last {seconds:.1f} s) and was stopped so that the other jobs there keep running"
    )


def node_failed_disk_full(folder: Path, node: str) -> str:
    """Rule 6 with a full folder: the folder is named as the likely cause of the node's failure."""
    return disk_full_message(folder, f"node {node} failed")


def fault_restart_prefix(restarts: int, max_restarts: int) -> str:
    """The head of a reason that puts the job back in the queue on a fault restart."""
    return f"fault restart {restarts + 1} of {max_restarts}: "


def resume_prefix(restarts: int, max_resumes: int) -> str:
    """The head of a reason that puts the job back in the queue on a checkpoint resume."""
    return f"checkpoint resume {restarts + 1} of {max_resumes}: "


def unhealthy_node(host: str, status: str, why: str) -> str:
    """Rule 5a: the inventory node marked drained or faulty, and why."""
    return f"node {host} is {status} ({why})"


def keeps_running(what: str) -> str:
    """Rule 5a, a mark that only keeps new work off (a drain, a node's disk): the job stays."""
    return f"{what}: this job keeps running there; only new placements avoid the node"


def unhealthy_resume_notice(what: str, grace: float, host: str) -> str:
    """Rule 5a with checkpoint resume: what the platform does, said as it begins."""
    return (
        f"{what}: the platform sends SIGTERM to the job and waits up to {grace:g} s "
        f"for its checkpoint, then resumes it away from {host}"
    )


def unhealthy_resume_reason(what: str, restarts: int, max_resumes: int, grace: float) -> str:
    """Rule 5a with checkpoint resume: the reason of the attempt's end."""
    return (
        f"{resume_prefix(restarts, max_resumes)}{what}; the job was sent "
        f"SIGTERM and given {grace:g} s to save its checkpoint; it waits to resume "
        f"on other nodes"
    )


def unhealthy_stopped(what: str, node: str) -> str:
    """Rule 5a on a faulty node with nothing left to restart or resume: the job ends."""
    return f"{what}: its node {node} ran there; the job was stopped (no checkpoint resume left)"


def scale_up_reason(possible: int, nodes: int, running: int, grace: float) -> str:
    """An elastic job scales up: how many nodes fit now, and the checkpoint's grace period."""
    return (
        f"elastic scale-up: {possible} of {nodes} nodes fit now (it ran on {running}); the "
        f"job was sent SIGTERM and given {grace:g} s to save its checkpoint, and "
        "resumes with more nodes"
    )


def perf_alert(node: str, ratio: float, threshold: float) -> str:
    """Rule 7: a performance sample of ``node`` over the threshold."""
    return f"performance alert on {node}: hardware/e2e time {ratio:.3f} exceeds the threshold {threshold:g}"


def perf_rescheduled(head: str, alert: str, host: str | None) -> str:
    """Rule 7's reschedule: away from ``host`` (the slow node's inventory node) when known."""
    if host is None:
        return f"{head}{alert}; rescheduling"
    return f"{head}rescheduled away from {host}: {alert}"


def hang_alert(
    job_id: str,
    minutes: float,
    cpu_seconds: float,
    processes: dict[str, list[tuple[int, str, str, str]]] | None,
    stop: bool,
) -> str:
    """The text of a hang alert: how long the job was quiet, what each node's processes are doing
    (``(pid, name, state, wait channel)`` by node; None: the backend cannot tell), what to do."""
    if processes is None:
        doing = "the backend cannot tell what its processes are doing"
    elif not any(processes.values()):
        doing = "no process of the job was found"
    else:
        parts = []
        for node, looks in processes.items():
            said = ", ".join(
                f"{name} (pid {pid}) {state}" + (f" in {wait}" if wait else "")
                for pid, name, state, wait in looks
            )
            parts.append(f"{node}: {said or 'no process'}")
        doing = "; ".join(parts)
    head = (
        f"looks hung: no log output and almost no CPU ({cpu_seconds:.1f} s) for {minutes:g} min "
        f"([limits] hang_minutes); its processes: {doing}"
    )
    if stop:
        return f"{head}. Stopping it (--hang-policy stop)"
    return (
        f"{head}. A lock left by a killed job, a rendezvous waiting for a node that never comes or a "
        f"dead peer look like this: stop it with `ma-jupyter stop {job_id}` if it does not move on "
        "(--hang-policy stop ends such a job by itself)"
    )


def hang_stopped(minutes: float) -> str:
    """Rule 9's end with ``hang_policy = stop``."""
    return (
        f"stopped: it looked hung for {minutes:g} min (no log output, almost no CPU; --hang-policy "
        "stop); the alert before says what its processes were waiting on"
    )


def batch_failed(tasks: int, failed: Sequence[str], first_reason: str) -> str:
    """A batch job's end with failed tasks: every failed task named, the first one's details."""
    done = tasks - len(failed)
    head = f"{len(failed)} of {tasks} task(s) failed ({', '.join(failed)}); {done} succeeded"
    return f"{head}: {first_reason}"


#: rule 8, every node a primary one
ALL_SUCCEEDED = "every node exited with code 0"


def primaries_succeeded(primaries: Sequence[str], others: Sequence[str]) -> str:
    """Rule 8 with other nodes (parameter servers): they were stopped, their exit code is the stop's."""
    return (
        f"every primary node ({', '.join(primaries)}) exited with code 0; then stopped {', '.join(others)}, "
        "which run until stopped (their exit code is the stop's)"
    )


# ---------------------------------------------------------------- how a node ended


def exit_text(code: int | None) -> str:
    """How a process ended, in words: ``exited with code 3``; a death by a signal names it,
    whether it comes as a negative code (Python's) or as 128 + N (a shell's, a launcher's):
    ``exited with code 137: killed by signal 9 (SIGKILL)``, ``was killed by signal 15 (SIGTERM)``."""
    if code is None:
        return "exited without an exit code"
    number = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        name = signal.Signals(number).name if number else ""
    except ValueError:
        name = ""
    if not name:
        return f"exited with code {code}"
    if code < 0:
        return f"was killed by signal {number} ({name})"
    return f"exited with code {code}: killed by signal {number} ({name})"


def failure_reason(
    run: NodeRun,
    tail: Sequence[str],
    rank_failure: tuple[int, int] | str | None,
    hint: str | None = None,
) -> str:
    """Why a node failed, in words: lost or its exit code, the rank its launcher reported failing
    first (or what the job left instead of that report), the backend's explanation of its log
    (a write to a read-only mount...) on the same first line, then its last log lines."""
    what = (
        "was lost (its process is gone and left no exit code)"
        if run.state == "lost"
        else exit_text(run.exit_code)
    )
    if isinstance(rank_failure, str):
        rank = f"; {rank_failure}"
    else:
        rank = f" (rank {rank_failure[0]} {exit_text(rank_failure[1])})" if rank_failure else ""
    reason = f"node {run.name} {what}{rank}"
    if hint:
        reason += f": {hint}"
    if tail:
        reason += "\nlast log lines:\n" + "\n".join(tail)
    return reason


# ---------------------------------------------------------------------- the queue


def start_text(start: float | None) -> str:
    """An estimated start as people read it: a UTC time, or why there is none."""
    if start is None or start == float("inf"):
        return "unknown (running jobs without a duration hold what it needs)"
    return datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def waiting_reason(kind: str, head) -> str:
    """Why a queued job waits (the event said once per kind): ``head``, the first job that does
    not fit (``head`` is then its own reservation, or None if it can never be placed now);
    ``blocked``, it does not fit; ``held``, it fits but would delay the head; ``declined``, it
    fits but the backend cannot hold its nodes now (resources in use outside this service)."""
    if kind == "head":
        if head is None:
            return "waiting for resources: no spec of this job fits the cluster's nodes that are up"
        nodes = ", ".join(dict.fromkeys(t.host for t in head.placement.tasks))
        return (
            f"waiting for resources, first in the queue: {nodes} reserved for it; "
            f"estimated start {start_text(head.start)}"
        )
    if kind == "held":
        return (
            "waiting: it fits now but would delay the first job in the queue, whose "
            f"resources are reserved (estimated start {start_text(head.start)}); a duration that "
            "ends it before then lets it pass"
        )
    if kind == "declined":
        return (
            "waiting for resources: the backend cannot hold the nodes chosen for it now (the cluster's "
            "resources are in use outside this service); trying again every few seconds"
        )
    return "waiting for resources: no spec of this job fits the free capacity now"
