"""The supervisor's decisions (ma_jupyter.service.policies), tested on plain values.

Among them the orders races produce, which the supervisor meets on fresh reads: a stale running
copy of a finished job, a stop requested while a restart winds down, an update made before the
launch, a launch cut short by a crash.
"""

from __future__ import annotations

import errno
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ma_jupyter.errors import Conflict, InvalidSpec
from ma_jupyter.models import Job, JobSpec, JobStatus, NodeRun, Priority
from ma_jupyter.service import policies, policy_texts
from ma_jupyter.service.policies import End, Settled

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def job(status: JobStatus = JobStatus.running, *, attempt: int = 0, restarts: int = 0, **spec) -> Job:
    spec.setdefault("name", "j")
    spec.setdefault("command", "python train.py")
    return Job(
        id="j-1",
        spec=JobSpec(**spec),
        status=status,
        attempt=attempt,
        restarts=restarts,
        started_at=T0 if status is JobStatus.running else None,
    )


def run(name: str = "worker-0", state: str = "running", exit_code: int | None = None, primary: bool = True):
    return NodeRun(name=name, state=state, exit_code=exit_code, primary=primary)


# ------------------------------------------------------------------------------ recovery


def test_a_queued_job_with_a_placement_was_a_launch_cut_short():
    assert policies.recovery(job(JobStatus.queued), has_placement=True) == "stop_partial_launch"


def test_a_running_job_with_a_placement_is_reattached():
    assert policies.recovery(job(JobStatus.running), has_placement=True) == "reattach"


@pytest.mark.parametrize(
    "status, placed",
    [
        (JobStatus.queued, False),
        (JobStatus.running, False),
        (JobStatus.succeeded, True),
        (JobStatus.stopped, False),
    ],
)
def test_recovery_leaves_the_other_jobs_alone(status, placed):
    assert policies.recovery(job(status), has_placement=placed) == "none"


# --------------------------------------------------------------------- stop and delete


def test_a_stop_ends_a_queued_job_now_and_asks_a_running_one():
    assert policies.stop_action(job(JobStatus.queued), None) == "now"
    assert policies.stop_action(job(JobStatus.running), None) == "request"
    assert policies.stop_action(job(JobStatus.running), "stop") == "request"


def test_a_stop_does_not_undo_a_pending_delete_nor_touch_a_finished_job():
    assert policies.stop_action(job(JobStatus.running), "delete") == "none"
    assert policies.stop_action(job(JobStatus.succeeded), None) == "none"


@pytest.mark.parametrize(
    "status, force, action",
    [
        (JobStatus.succeeded, False, "remove"),
        (JobStatus.error, True, "remove"),
        (JobStatus.running, False, "refuse"),
        (JobStatus.queued, False, "refuse"),
        (JobStatus.running, True, "mark"),
        (JobStatus.queued, True, "stop_then_remove"),
    ],
)
def test_delete_action(status, force, action):
    assert policies.delete_action(job(status), force) == action


# ------------------------------------------------------------------------------- update


def test_an_update_before_the_launch_changes_priority_and_duration():
    spec, changes = policies.updated_spec(job(JobStatus.queued), Priority.urgent, 5.0)
    assert spec.priority is Priority.urgent and spec.duration == 5.0
    assert changes == ["priority set to urgent", "duration set to 5 s"]
    assert spec.name == "j"  # the rest of the spec is kept


def test_a_running_job_takes_a_new_duration_but_not_a_new_priority():
    spec, changes = policies.updated_spec(job(JobStatus.running, duration=5), None, 9.0)
    assert spec.duration == 9.0 and changes == ["duration set to 9 s"]
    with pytest.raises(Conflict, match="only a queued job's priority"):
        policies.updated_spec(job(JobStatus.running), Priority.urgent, None)


def test_a_finished_job_cannot_be_updated_and_an_empty_update_is_refused():
    with pytest.raises(Conflict, match="queued or running"):
        policies.updated_spec(job(JobStatus.succeeded), None, 9.0)
    with pytest.raises(InvalidSpec, match="nothing to update"):
        policies.updated_spec(job(JobStatus.queued), None, None)


# --------------------------------------------------------------- refused files, errors


@pytest.mark.parametrize(
    "status, finishing, placed, action",
    [
        (JobStatus.running, False, True, "finish"),
        (JobStatus.running, True, True, "none"),
        (JobStatus.running, False, False, "none"),
        (JobStatus.queued, False, False, "error"),
        (JobStatus.stopped, False, False, "none"),
    ],
)
def test_on_refused_file(status, finishing, placed, action):
    assert policies.on_refused_file(job(status), finishing, placed) == action


@pytest.mark.parametrize(
    "status, finishing, placed, action",
    [
        (JobStatus.running, False, True, "finish"),
        (JobStatus.running, False, False, "error"),
        (JobStatus.running, True, True, "none"),
        (JobStatus.queued, False, False, "error"),
        (JobStatus.succeeded, False, False, "none"),
    ],
)
def test_on_supervise_error(status, finishing, placed, action):
    assert policies.on_supervise_error(job(status), finishing, placed) == action


def test_launch_failure_names_a_full_disk_or_the_error():
    full = OSError(errno.ENOSPC, "No space left on device", "/data/jobs/j-1/logs/worker-0.log")
    assert policies.launch_failure(full, Path("/data/jobs/j-1")) == "disk full under /data/jobs/j-1/logs"
    nameless = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert policies.launch_failure(nameless, Path("/data/jobs/j-1")) == "disk full under /data/jobs/j-1"
    assert policies.launch_failure(InvalidSpec("no such image"), Path("/x")) == "no such image"
    assert policies.launch_failure(ValueError("bad"), Path("/x")) == "ValueError: bad"


# ------------------------------------------------------------------------------ attempts


def test_attempt_env_tells_the_attempt_and_resume_only_with_checkpoint_resume():
    assert policies.attempt_env(job()) == {"MA_ATTEMPT": "0"}
    assert policies.attempt_env(job(attempt=2, fault_restart={"max_restarts": 3})) == {"MA_ATTEMPT": "2"}
    resume = {"max_resumes": 3}
    assert policies.attempt_env(job(checkpoint_resume=resume)) == {"MA_ATTEMPT": "0", "MA_RESUME": "0"}
    assert policies.attempt_env(job(attempt=1, checkpoint_resume=resume)) == {
        "MA_ATTEMPT": "1",
        "MA_RESUME": "1",
    }


def test_disk_folders_with_and_without_outputs():
    root = Path("/jobs/j-1")
    assert policies.disk_folders(JobSpec(name="j", command="python train.py"), root, root / "outputs") == [
        root,
        root / "outputs",
    ]
    spec = JobSpec(
        name="j", command="python train.py", outputs="/data/out", volumes=[{"name": "v", "path": "/data/vol"}]
    )
    assert policies.disk_folders(spec, root, root / "outputs") == [root, Path("/data/out"), Path("/data/vol")]


def test_the_reserve_ends_the_job_writing_the_most_and_only_a_flood():
    mb = 1 << 20
    reserve = 256 * mb

    def offender(grown, seconds, free):
        return policies.reserve_offender(grown, seconds, free, reserve, mb)  # 1 MB/s

    assert offender({"a": 3 * mb, "b": 40 * mb, "c": 0}, 2.0, 250 * mb) == "b"
    # just under the reserve, writing slower than the flood rate (a job printing lines) ends nobody
    assert offender({"a": mb // 2, "b": 100}, 1.0, 250 * mb) is None
    # deeper into it, a slower writer is ended; near full, whoever writes the most
    assert offender({"a": mb // 2, "b": 100}, 1.0, 100 * mb) == "a"
    assert offender({"a": 0, "b": 100}, 1.0, 0) == "b"
    # nothing written (or files removed) ends nobody, however full the disk
    assert offender({"a": -5 * mb, "b": 0}, 1.0, 0) is None
    assert offender({}, 1.0, 0) is None
    end = policies.on_reserve(Path("/srv/ma/jobs"), 20 * mb, 256 * mb, 12 * mb, 1.0)
    assert end.status is JobStatus.error and end.pending and not end.requeue
    assert end.reason.startswith(
        "disk nearly full under /srv/ma/jobs: 20.0 MB free, under the reserve of 256 MB"
    )
    assert "[limits] disk_reserve_mb" in end.reason and "wrote the most there (12.0 MB" in end.reason


def test_disk_use_counts_each_file_once_on_its_own_disk(tmp_path):
    import os

    from ma_jupyter.service.disk import disk_use

    job = tmp_path / "job"
    (job / "outputs").mkdir(parents=True)
    (job / "outputs" / "a.bin").write_bytes(b"x" * (1 << 20))
    (job / "log").write_bytes(b"y" * (1 << 20))
    (job / "elsewhere").symlink_to("/usr")  # never followed
    device = os.stat(tmp_path).st_dev
    once = disk_use([job], device)
    assert 2 << 20 <= once < 3 << 20
    assert disk_use([job, job / "outputs"], device) == once  # the outputs inside the job folder
    assert disk_use([job], device + 1) == 0  # another disk: nothing counted
    assert disk_use([tmp_path / "missing"], device) == 0


# ---------------------------------------------------------------------------- each poll


def poll(j: Job, *, desired=None, pending_end=None, disk_full=None, now=T0):
    return policies.before_poll(j, desired=desired, pending_end=pending_end, disk_full=disk_full, now=now)


def test_nothing_ends_a_healthy_job_before_its_nodes_are_polled():
    assert poll(job(duration=60), now=T0 + timedelta(seconds=30)) is None
    assert poll(job(), now=T0 + timedelta(days=30)) is None  # no duration: no limit


def test_a_stop_request_ends_the_job_with_its_grace_period():
    assert poll(job(grace_period=7), desired="stop") == End(JobStatus.stopped, "stopped by user", 7.0)
    assert poll(job(grace_period=7), desired="delete") == End(
        JobStatus.stopped, "stopped by user to delete it", 7.0
    )


def test_expiry_is_strictly_past_the_duration():
    j = job(duration=60, grace_period=3)
    assert poll(j, now=T0 + timedelta(seconds=60)) is None
    end = poll(j, now=T0 + timedelta(seconds=60.5))
    assert end == End(JobStatus.expired, "ran past its duration of 60 s", 3.0)


def test_a_full_disk_ends_the_job_in_error_and_the_reason_is_kept():
    end = poll(job(), disk_full=Path("/data/out"))
    assert end == End(
        JobStatus.error,
        "disk full under /data/out: the job was stopped; free space there and submit it again",
        policies.WIND_DOWN_GRACE,
        pending=True,
    )


def test_the_checks_before_a_poll_come_in_their_order():
    late = T0 + timedelta(seconds=100)
    j = job(duration=60)
    everything = poll(j, desired="stop", pending_end="disk full under /x", disk_full=Path("/y"), now=late)
    assert everything.status is JobStatus.stopped
    pending = poll(j, pending_end="disk full under /x", disk_full=Path("/y"), now=late)
    assert pending == End(JobStatus.error, "disk full under /x", policies.WIND_DOWN_GRACE, pending=True)
    full = poll(j, disk_full=Path("/y"), now=late)
    assert full.status is JobStatus.error and full.reason.startswith("disk full under /y")
    assert poll(j, now=late).status is JobStatus.expired


def test_first_failure_is_the_first_lost_or_non_zero_node():
    ok, bad, lost = run("a", "exited", 0), run("b", "exited", 3), run("c", "lost")
    assert policies.first_failure([ok, run("d"), bad, lost]) == bad
    assert policies.first_failure([lost, bad]) == lost
    assert policies.first_failure([ok, run("d"), run("e", "pending")]) is None


def test_a_failure_without_restarts_ends_in_error_with_the_exit_code():
    bad = run(state="exited", exit_code=3)
    end = policies.on_failure(job(), bad, "node worker-0 exited with code 3")
    assert end == End(
        JobStatus.error, "node worker-0 exited with code 3", policies.WIND_DOWN_GRACE, exit_code=3, failed=bad
    )


def test_a_fault_restart_requeues_with_the_job_grace_until_none_is_left():
    bad = run(state="lost")
    spec = {"fault_restart": {"max_restarts": 2}, "grace_period": 4}
    end = policies.on_failure(job(restarts=1, **spec), bad, lambda: "node worker-0 was lost")
    assert end.status is JobStatus.queued and end.requeue and end.grace == 4.0 and end.failed == bad
    assert end.reason() == "fault restart 2 of 2: node worker-0 was lost"  # built on the finishing thread
    last = policies.on_failure(job(restarts=2, **spec), bad, "node worker-0 was lost")
    assert last.status is JobStatus.error and not last.requeue and last.grace == policies.WIND_DOWN_GRACE


def test_a_checkpoint_resume_requeues_with_the_resume_grace():
    bad = run(state="exited", exit_code=1)
    j = job(checkpoint_resume={"max_resumes": 1, "grace_period": 30}, grace_period=4)
    end = policies.on_failure(j, bad, "why")
    assert end == End(JobStatus.queued, "checkpoint resume 1 of 1: why", 30.0, requeue=True, failed=bad)
    assert policies.on_failure(j.model_copy(update={"restarts": 1}), bad, "why").status is JobStatus.error


def test_a_failure_on_a_full_disk_names_the_disk_and_is_not_restarted():
    bad = run(state="exited", exit_code=1)
    end = policies.on_failure(job(fault_restart={"max_restarts": 2}), bad, "why", Path("/data/out"))
    assert end == End(
        JobStatus.error,
        "disk full under /data/out: node worker-0 failed",
        policies.WIND_DOWN_GRACE,
        exit_code=1,
        failed=bad,
        pending=True,
    )


# ----------------------------------------------------------------- performance detection


def test_perf_samples_reads_every_timing_line():
    text = (
        "epoch 1\n"
        "this iteration hardware time is 2201.521 and e2e time is 3317.794921875 ms.\n"
        "hardware time is 10 and e2e time is 20\n"
    )
    assert policies.perf_samples(text) == [(2201.521, 3317.794921875), (10.0, 20.0)]
    assert policies.perf_samples("nothing here") == []


def perf_job(policy: str = "alert", restarts: int = 0) -> Job:
    resume = {"max_resumes": 2, "grace_period": 20, "perf_threshold": 0.5, "perf_policy": policy}
    return job(restarts=restarts, checkpoint_resume=resume)


def test_a_slow_sample_is_alerted_once():
    alert, end = policies.on_perf(perf_job(), "worker-0", [(1, 4), (9, 10)], alerted=False)
    assert alert == "performance alert on worker-0: hardware/e2e time 0.900 exceeds the threshold 0.5"
    assert end is None
    assert policies.on_perf(perf_job(), "worker-0", [(9, 10)], alerted=True) == (None, None)


def test_samples_at_or_under_the_threshold_or_without_e2e_are_ignored():
    assert policies.on_perf(perf_job(), "worker-0", [(5, 10), (1, 0), (1, -1)], alerted=False) == (None, None)
    assert policies.on_perf(job(), "worker-0", [(9, 10)], alerted=False) == (None, None)  # no threshold


def test_the_reschedule_policy_requeues_while_resumes_are_left_then_alerts():
    slow = perf_job("reschedule", restarts=1)
    alert, end = policies.on_perf(slow, "worker-0", [(9, 10)], alerted=True, host="node-0")
    assert alert is None
    assert end == End(
        JobStatus.queued,
        "checkpoint resume 2 of 2: rescheduled away from node-0: performance alert on worker-0: "
        "hardware/e2e time 0.900 exceeds the threshold 0.5",
        20.0,
        requeue=True,
        exclude=("node-0",),
    )
    # the next attempt's record carries the exclusion, added to the ones before
    settled = policies.settle(end, "x", None)
    before = slow.model_copy(update={"excluded_nodes": ["node-2"]})
    updates = policies.record_updates(before, settled, [], None, T0, exclude=end.exclude)
    assert updates["excluded_nodes"] == ["node-2", "node-0"]
    alert, end = policies.on_perf(perf_job("reschedule", restarts=2), "worker-0", [(9, 10)], alerted=False)
    assert end is None and alert.startswith("performance alert on worker-0")


# -------------------------------------------------------------------------------- success


def test_success_needs_every_primary_node_exited_with_zero():
    assert policies.on_success([run("a", "exited", 0), run("b")]) is None
    assert policies.on_success([run("a", "exited", 0), run("b", "exited", 1)]) is None
    assert policies.on_success([run("ps-0", primary=False)]) is None  # no primary node
    end = policies.on_success([run("a", "exited", 0), run("b", "exited", 0)])
    assert end == End(
        JobStatus.succeeded, "every node exited with code 0", policies.WIND_DOWN_GRACE, exit_code=0
    )


def test_success_names_the_other_nodes_it_stops():
    end = policies.on_success([run("worker-0", "exited", 0), run("ps-0", primary=False)])
    assert end.reason == (
        "every primary node (worker-0) exited with code 0; then stopped ps-0, "
        "which run until stopped (their exit code is the stop's)"
    )


def test_a_finished_job_can_change_no_more():
    # the supervisor re-reads a job before each poll and only polls a running one: a stale
    # running copy of a finished job could not be recorded over it anyway
    for status in (JobStatus.succeeded, JobStatus.error, JobStatus.stopped, JobStatus.expired):
        assert not any(status.can_become(other) for other in JobStatus)


# --------------------------------------------------------------------------- winding down


def test_live_nodes_are_the_running_and_pending_ones():
    runs = [run("a"), run("b", "pending"), run("c", "exited", 0), run("d", "lost"), run("e", "stopped")]
    assert [r.name for r in policies.live_nodes(runs)] == ["a", "b"]


def test_final_node_states_keep_lost_only_for_the_failed_node():
    runs = [run("a", "lost"), run("b", "lost"), run("c", "exited", 0)]
    final = policies.final_node_states(runs, failed=runs[1])
    assert [r.state for r in final] == ["stopped", "lost", "exited"]
    assert [r.state for r in policies.final_node_states(runs, failed=None)] == [
        "stopped",
        "stopped",
        "exited",
    ]


def test_a_stop_requested_while_a_restart_winds_down_wins():
    restart = End(JobStatus.queued, "fault restart 1 of 2: why", 10.0, requeue=True)
    assert policies.settle(restart, "fault restart 1 of 2: why", desired="stop") == Settled(
        JobStatus.stopped, "stopped by user", requeue=False, remove=False
    )
    assert policies.settle(restart, "fault restart 1 of 2: why", desired="delete") == Settled(
        JobStatus.stopped, "stopped by user", requeue=False, remove=True
    )
    assert policies.settle(restart, "fault restart 1 of 2: why", desired=None) == Settled(
        JobStatus.queued, "fault restart 1 of 2: why", requeue=True, remove=False
    )


def test_settle_keeps_an_end_that_is_not_a_requeue():
    stopped = End(JobStatus.stopped, "stopped by user to delete it", 10.0)
    assert policies.settle(stopped, "stopped by user to delete it", "delete") == Settled(
        JobStatus.stopped, "stopped by user to delete it", requeue=False, remove=True
    )
    failed = End(JobStatus.error, "why", 5.0, exit_code=2)
    assert policies.settle(failed, "node worker-0 exited with code 2", "stop") == Settled(
        JobStatus.error, "node worker-0 exited with code 2", requeue=False, remove=False
    )


def test_record_updates_start_the_next_attempt_or_record_the_end():
    current = job(attempt=1, restarts=1)
    nodes = [run("a", "stopped")]
    requeued = Settled(JobStatus.queued, "again", requeue=True, remove=False)
    assert policies.record_updates(current, requeued, nodes, None, T0) == {
        "nodes": nodes,
        "attempt": 2,
        "restarts": 2,
    }
    ended = Settled(JobStatus.error, "why", requeue=False, remove=False)
    assert policies.record_updates(current, ended, nodes, 3, T0) == {
        "nodes": nodes,
        "exit_code": 3,
        "finished_at": T0,
    }


def test_an_elastic_scale_up_starts_the_next_attempt_without_using_a_resume():
    requeued = Settled(JobStatus.queued, "again", requeue=True, remove=False)
    updates = policies.record_updates(job(attempt=1, restarts=1), requeued, [], None, T0, counted=False)
    assert (updates["attempt"], updates["restarts"]) == (2, 1)


# --------------------------------------------------------------------------- node health

MARKS = {"n1": ("drained", "drained by admin: maintenance"), "n2": ("faulty", "no heartbeat for 12 s")}


def on(host: str, state: str = "running") -> NodeRun:
    return NodeRun(name="worker-0", host=host, state=state)


def test_a_job_on_healthy_nodes_or_ended_on_a_marked_one_is_left_alone():
    assert policies.on_unhealthy(job(), [on("n3")], MARKS) == (None, None)
    assert policies.on_unhealthy(job(), [on("n1", "exited")], MARKS) == (None, None)


def test_checkpoint_resume_checkpoints_away_from_a_drained_or_faulty_node_while_resumes_last():
    j = job(checkpoint_resume={"max_resumes": 2, "grace_period": 30})
    for host, status in (("n1", "drained"), ("n2", "faulty")):
        notice, end = policies.on_unhealthy(j, [on(host)], MARKS)
        assert "sends SIGTERM" in notice and "30 s" in notice and f"away from {host}" in notice
        assert end.status is JobStatus.queued and end.requeue and end.grace == 30.0 and end.counted
        assert end.reason.startswith(f"checkpoint resume 1 of 2: node {host} is {status}")
    # no resume left: a drained node keeps it, a faulty one ends it in error
    spent = j.model_copy(update={"restarts": 2})
    assert policies.on_unhealthy(spent, [on("n1")], MARKS)[1] is None
    assert policies.on_unhealthy(spent, [on("n2")], MARKS)[1].status is JobStatus.error


def test_without_resume_a_drain_keeps_the_job_and_a_fault_restarts_or_ends_it():
    notice, end = policies.on_unhealthy(job(), [on("n1")], MARKS)
    assert end is None and "keeps running" in notice
    _, end = policies.on_unhealthy(job(), [on("n2")], MARKS)
    assert end.status is JobStatus.error and "node n2 is faulty (no heartbeat for 12 s)" in end.reason
    _, end = policies.on_unhealthy(job(fault_restart={"max_restarts": 1}, grace_period=4), [on("n2")], MARKS)
    assert (
        end.status is JobStatus.queued and end.grace == 4.0 and end.reason.startswith("fault restart 1 of 1")
    )


def test_an_elastic_job_scales_up_only_when_more_fit_it_waited_and_no_job_is_queued():
    resume = {"elastic_min_nodes": 1, "grace_period": 9, "allow_scale_up": True}
    elastic = job(mode="pytorch", nodes=3, checkpoint_resume=resume)
    end = policies.on_scale_up(elastic, 1, 3, shrunk_for=60, interval=60, queued=0)
    assert end.requeue and not end.counted and end.grace == 9.0
    assert end.reason.startswith("elastic scale-up: 3 of 3 nodes fit now (it ran on 1)")
    assert policies.on_scale_up(elastic, 1, 1, 60, 60, 0) is None  # nothing more fits
    assert policies.on_scale_up(elastic, 1, 3, 59, 60, 0) is None  # not flapping
    assert policies.on_scale_up(elastic, 1, 3, 60, 60, 1) is None  # a waiting job comes first
    assert policies.on_scale_up(elastic, 3, 3, 60, 60, 0) is None  # already whole
    assert policies.on_scale_up(job(nodes=1), 0, 1, 60, 60, 0) is None  # not elastic
    # the switch off (the default): an elastic job keeps the nodes it started with
    fixed = job(mode="pytorch", nodes=3, checkpoint_resume={**resume, "allow_scale_up": False})
    assert policies.on_scale_up(fixed, 1, 3, 60, 60, 0) is None


def test_record_updates_count_from_the_fresh_copy():
    # an update (e.g. a new duration) made while the attempt wound down is on the fresh copy;
    # only the listed fields are replaced, so the rest of it is kept
    fresh = job(attempt=0, duration=9)
    updates = policies.record_updates(fresh, Settled(JobStatus.succeeded, "ok", False, False), [], 0, T0)
    assert set(updates) == {"nodes", "exit_code", "finished_at"}
    assert fresh.model_copy(update=updates).spec.duration == 9


def test_failure_reason_in_words():
    lost = run(state="lost")
    assert policy_texts.failure_reason(lost, [], None) == (
        "node worker-0 was lost (its process is gone and left no exit code)"
    )
    bad = run(state="exited", exit_code=2)
    assert policy_texts.failure_reason(bad, ["a", "b"], (3, 7)) == (
        "node worker-0 exited with code 2 (rank 3 exited with code 7)\nlast log lines:\na\nb"
    )
    assert policy_texts.failure_reason(bad, [], "the job left a FIFO at failure.json") == (
        "node worker-0 exited with code 2; the job left a FIFO at failure.json"
    )


# ---------------------------------------------------------------------------------- purity


@pytest.mark.parametrize("module", [policies, policy_texts], ids=["policies", "policy_texts"])
def test_policies_read_no_store_backend_clock_or_file(module):
    import ast

    tree = ast.parse(Path(module.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is None:  # from . import policy_texts
            imported |= {"." * node.level + a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + node.module)
    allowed = {
        "__future__",
        "re",
        "errno",
        "collections.abc",
        "dataclasses",
        "datetime",
        "pathlib",
        "typing",
        "signal",
    }  # signal: its names only
    # the decisions' words: .policy_texts; a full disk's message: .guard
    assert imported <= allowed | {"..errors", "..models", ".guard", ".policy_texts"}, imported - allowed
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"open", "time", "os", "utcnow"}, names & {"open", "time", "os", "utcnow"}
    assert not attributes & {"now", "utcnow", "exists", "is_dir", "read_text", "stat"}


def test_exit_texts_name_the_signal_that_ended_a_process():
    assert policy_texts.exit_text(3) == "exited with code 3"
    assert policy_texts.exit_text(137) == "exited with code 137: killed by signal 9 (SIGKILL)"
    assert policy_texts.exit_text(-15) == "was killed by signal 15 (SIGTERM)"
    assert policy_texts.exit_text(128 + 99) == "exited with code 227"  # no such signal: just the code
    assert policy_texts.exit_text(None) == "exited without an exit code"
    run = NodeRun(name="worker-0", state="exited", exit_code=139)
    assert policy_texts.failure_reason(run, [], (1, 134)) == (
        "node worker-0 exited with code 139: killed by signal 11 (SIGSEGV) "
        "(rank 1 exited with code 134: killed by signal 6 (SIGABRT))"
    )


def test_disk_use_of_a_job_holding_a_deep_chain_counts_it(tmp_path):
    """A job's 1,100-deep chain in its outputs made the reserve's measure raise RecursionError
    every second (the reserve was never kept, the disk filled): the chain is walked to its
    bottom, and what lies there counts."""
    import os

    from ma_jupyter.foldersize import remove_tree
    from ma_jupyter.service.disk import disk_use

    job = tmp_path / "job"
    job.mkdir()
    fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    bottom = os.open("big.bin", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(bottom, b"x" * (1 << 20))
    os.close(bottom)
    os.close(fd)
    try:
        assert disk_use([job], os.stat(tmp_path).st_dev) >= 1 << 20
    finally:
        assert remove_tree(job).complete  # pytest's own clean-up would recurse


def test_a_node_out_of_placement_for_its_disk_keeps_every_job_running_there():
    disk = {
        "n4": ("faulty", "the job folders' disk (/j) has 1.0 MB free, under [limits] node_disk_free_mb = 4")
    }
    resumable = job(checkpoint_resume={"max_resumes": 2, "grace_period": 30})
    for j in (job(), resumable, job(fault_restart={"max_restarts": 1})):
        notice, end = policies.on_unhealthy(j, [on("n4")], disk, only_new_work={"n4"})
        assert end is None and "keeps running there" in notice and "node_disk_free_mb" in notice
    # a node of the job on a node with another mark still moves it
    _, end = policies.on_unhealthy(job(), [on("n4"), on("n2")], {**disk, **MARKS}, only_new_work={"n4"})
    assert end.status is JobStatus.error and "node n2 is faulty" in end.reason


def test_a_full_jobs_disk_ends_the_writer_and_spares_the_others_while_it_writes():
    assert policies.full_disk_ends(5 << 20, True, others_grew=True, full_before=False)  # the writer
    assert not policies.full_disk_ends(0, True, others_grew=True, full_before=True)  # another writes
    assert not policies.full_disk_ends(None, True, others_grew=False, full_before=False)  # one look
    assert policies.full_disk_ends(0, True, others_grew=False, full_before=True)  # stays full
    assert policies.full_disk_ends(None, False, others_grew=False, full_before=False)  # not measured


# --------------------------------------------------------------------------- rule 9: hangs


def test_a_quiet_spell_is_told_once_and_any_activity_starts_a_new_one():
    window = 60.0
    spell, hung = policies.on_quiet(None, 100, 5.0, 0.0, 0.0, window)  # the first look starts a spell
    assert not hung and spell == policies.QuietSpell(0.0, 100, 5.0)
    # a lock's polling loop: 1 % of a core, no output; not yet the window, then hung, told once
    spell, hung = policies.on_quiet(spell, 100, 5.3, 0.0, 30.0, window)
    assert not hung
    spell, hung = policies.on_quiet(spell, 100, 5.6, 0.0, 60.0, window)
    assert hung and spell.told and spell.since == 0.0
    for now in (90.0, 600.0, 6000.0):  # the same quiet spell: never told again
        spell, hung = policies.on_quiet(spell, 100, 5.6 + now / 1000, 0.0, now, window)
        assert not hung and spell.told
    # a log line ends the spell; the next quiet one is told again
    spell, hung = policies.on_quiet(spell, 101, 12.0, 0.0, 6010.0, window)
    assert not hung and not spell.told and spell.since == 6010.0
    spell, hung = policies.on_quiet(spell, 101, 12.0, 0.0, 6070.0, window)
    assert hung
    # CPU work (more than 5 % of a core over the spell) or a busy card is activity too
    busy, hung = policies.on_quiet(policies.QuietSpell(0.0, 1, 0.0), 1, 4.0, 0.0, 60.0, window)
    assert not hung and busy.since == 60.0
    busy, hung = policies.on_quiet(policies.QuietSpell(0.0, 1, 0.0), 1, 0.0, 80.0, 60.0, window)
    assert not hung and busy.since == 60.0


def test_the_hang_alert_names_each_nodes_processes_and_the_stop_policy_ends_the_job():
    looks = {
        "worker-0": [(41, "python3", "sleeping", "hrtimer_nanosleep"), (40, "torchrun", "sleeping", "")],
        "worker-1": [],
    }
    text = policy_texts.hang_alert("j-1", 0.5, 0.2, looks, stop=False)
    assert text.startswith(
        "looks hung: no log output and almost no CPU (0.2 s) for 0.5 min ([limits] hang_minutes)"
    )
    assert "worker-0: python3 (pid 41) sleeping in hrtimer_nanosleep, torchrun (pid 40) sleeping;" in text
    assert "worker-1: no process" in text and "ma-jupyter stop j-1" in text
    assert "backend cannot tell" in policy_texts.hang_alert("j-1", 30, 0, None, stop=False)
    assert policies.on_hang(job(), 30) is None
    end = policies.on_hang(job(hang_policy="stop", grace_period=7), 30)
    assert end.status is JobStatus.error and end.grace == 7 and "--hang-policy stop" in end.reason
    assert policy_texts.hang_alert("j-1", 30, 0, looks, stop=True).endswith(
        "Stopping it (--hang-policy stop)"
    )
    # a dev environment's kernel waits for its user in silence: never watched
    assert policies.watches_hangs(job())
    assert not policies.watches_hangs(job(devenv_of={"job_id": "j-0", "node": "worker-0"}))


def test_an_end_written_ahead_comes_back_whole_for_its_attempt_only():
    import json

    lost = NodeRun(name="worker-1", state="lost")
    end = End(
        JobStatus.queued, "worker-1 is slow", 30.0, requeue=True, failed=lost, counted=False, exclude=("n2",)
    )
    record = json.loads(json.dumps(policies.end_record(end, attempt=2)))
    assert policies.carried_end(job(attempt=2), record, lambda run: "unused") == end
    # a record left from an earlier attempt (its end was recorded, its clearing was not) is stale
    assert policies.carried_end(job(attempt=3), record, lambda run: "unused") is None
    assert policies.carried_end(job(attempt=2), None, lambda run: "unused") is None


def test_a_failed_nodes_end_written_ahead_is_decided_again_from_that_node():
    # its reason reads the node's files (slow on another machine): not read before the stop
    lost = NodeRun(name="worker-1", state="lost")
    failing = job(attempt=1, restarts=1, fault_restart={"max_restarts": 2})
    end = policies.on_failure(failing, lost, lambda: pytest.fail("read before the stop"))
    record = policies.end_record(end, attempt=1)
    assert record["reason"] is None and record["failed"]["name"] == "worker-1"
    carried = policies.carried_end(failing, record, lambda run: f"node {run.name} was lost")
    assert carried is not None and carried.requeue and carried.failed == lost
    assert carried.reason() == "fault restart 2 of 2: node worker-1 was lost"
    with pytest.raises(ValueError):
        policies.carried_end(failing, {**record, "failed": None}, lambda run: "")
