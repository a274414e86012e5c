"""The supervisor carrying out its policies end to end, on real node processes.

The decisions are tested on plain values in tests/unit/test_policies.py; these tests check that
the supervisor feeds them what the nodes do (their log lines, their attempt) and records what
they decide.  The loop is not running: the test calls ``tick`` and ``wait_idle`` itself.
"""

from __future__ import annotations

import sys

import pytest

from ma_jupyter import config
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.models import JobSpec, JobStatus
from ma_jupyter.service.scheduler import Scheduler
from ma_jupyter.service.store import Store
from ma_jupyter.service.supervisor import Supervisor
from tests.fakes.backend import FakeNode
from tests.fixtures.supervisor import tick_until
from tests.helpers import stop_every_job, wait_for

PY = sys.executable
SLOW = "hardware time is 9 and e2e time is 10"  # hardware/e2e 0.9


@pytest.fixture
def sup(ma_home):
    """A supervisor whose loop is not running; what it left running is stopped afterwards."""
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), LocalBackend())
    yield sup
    stop_every_job(sup)


def tick_until_ended(sup: Supervisor, job_id: str, timeout: float = 30):
    def ended():
        sup.tick()
        sup.wait_idle()
        return sup.store.status(job_id).is_terminal()

    wait_for(ended, timeout=timeout)
    return sup.store.get(job_id)


def test_a_slow_node_is_reported_once_per_attempt(fake_sup):
    # a rule of the supervisor: the fake node prints two slow lines, then a third once the first
    # alert was given, then ends
    sup = fake_sup
    sup.backend.script = lambda attempt, launch: FakeNode([SLOW, SLOW], exit_code=None)
    spec = JobSpec(
        name="slow",
        command="true",
        checkpoint_resume={"max_resumes": 1, "perf_threshold": 0.5, "perf_policy": "alert"},
    )
    job = sup.submit(spec, creator="me")
    alerted = lambda: [e for e in sup.store.events(job.id) if e.reason.startswith("performance alert")]  # noqa: E731
    tick_until(sup, alerted)
    sup.backend.write(job.id, "worker-0", SLOW)
    for _ in range(3):  # the third line is read
        sup.tick()
        sup.wait_idle()
    sup.backend.end(job.id, "worker-0", 0)
    final = tick_until_ended(sup, job.id)
    assert final.status is JobStatus.succeeded, final.reason
    alerts = [e for e in sup.store.events(job.id) if e.reason.startswith("performance alert")]
    assert [e.reason for e in alerts] == [
        "performance alert on worker-0: hardware/e2e time 0.900 exceeds the threshold 0.5"
    ]
    assert alerts[0].alert and alerts[0].node == "worker-0"  # marked, for followers to show at once


def test_an_earlier_attempts_slow_line_does_not_reschedule_the_next_attempts(fake_sup):
    """The node's log spans attempts: each attempt's scan starts where that attempt's lines do.
    (A rule of the supervisor: the first attempt is slow and runs until rescheduled, the next
    one says "resumed" and ends; the real nodes' reschedule is the test below.)"""
    sup = fake_sup
    sup.backend.script = lambda attempt, launch: (
        FakeNode([SLOW], exit_code=None) if attempt.number == 0 else FakeNode(["resumed"], exit_code=0)
    )
    spec = JobSpec(
        name="once-slow",
        command="true",
        checkpoint_resume={
            "max_resumes": 3,
            "grace_period": 1,
            "perf_threshold": 0.5,
            "perf_policy": "reschedule",
        },
    )
    job = sup.submit(spec, creator="me")
    final = tick_until_ended(sup, job.id)
    assert final.status is JobStatus.succeeded, final.reason
    assert (final.attempt, final.restarts) == (1, 1)
    assert final.nodes[0].log_start > 0  # the second attempt began after the first one's lines


def test_a_slow_node_is_rescheduled_and_resumes(sup):
    script = (
        "import os, sys, time; "
        'first = os.environ["MA_ATTEMPT"] == "0"; '
        f'print("{SLOW}" if first else "resumed", flush=True); '
        'first and time.sleep(60); sys.exit(0 if os.environ["MA_RESUME"] == ("0" if first else "1") else 7)'
    )
    spec = JobSpec(
        name="resched",
        command=f"{PY} -c '{script}'",
        checkpoint_resume={
            "max_resumes": 1,
            "grace_period": 1,
            "perf_threshold": 0.5,
            "perf_policy": "reschedule",
        },
    )
    job = sup.submit(spec, creator="me")
    final = tick_until_ended(sup, job.id)
    assert final.status is JobStatus.succeeded, final.reason
    assert (final.attempt, final.restarts, final.exit_code) == (1, 1, 0)
    said = [e.reason for e in sup.store.events(job.id) if e.status is JobStatus.queued]
    # the pre-check runs before each placement (the first one too), and is said last while queued
    first = next(r for r in said if r.startswith("pre-check before the first placement passed"))
    slow = first.split("placed on ")[1].split(",")[0]
    assert said[-1].startswith("pre-check before resume passed: checkpoint folder ")
    reasons = [r for r in said if not r.startswith("pre-check")]
    assert reasons[-1] == (
        f"checkpoint resume 1 of 1: rescheduled away from {slow}: performance alert on worker-0: "
        "hardware/e2e time 0.900 exceeds the threshold 0.5"
    )
    # the next attempt avoided the slow node (this machine's default cluster has several)
    assert final.excluded_nodes == [slow] and final.nodes[0].host != slow
    assert f"{slow} (slow for this job)" in said[-1]


def test_a_fault_restart_starts_the_next_attempt_then_ends_in_error(fake_sup):
    # a rule of the supervisor: every attempt's node says boom and exits with 3 (real nodes'
    # fault restarts: tests/service/test_faults.py)
    sup = fake_sup
    sup.backend.script = lambda attempt, launch: FakeNode(["boom"], exit_code=3)
    spec = JobSpec(name="crash", command="true", fault_restart={"max_restarts": 1})
    job = sup.submit(spec, creator="me")
    final = tick_until_ended(sup, job.id)
    assert final.status is JobStatus.error
    assert (final.attempt, final.restarts, final.exit_code) == (1, 1, 3)
    assert final.nodes[0].state == "exited"
    events = [(e.status, e.reason.splitlines()[0]) for e in sup.store.events(job.id)]
    assert (JobStatus.queued, "fault restart 1 of 1: node worker-0 exited with code 3") in events
    assert events[-1] == (JobStatus.error, "node worker-0 exited with code 3")
    last = sup.store.events(job.id)[-1]
    assert last.node == "worker-0" and last.exit_code == 3 and "boom" in last.reason


def test_a_shrunk_elastic_job_says_whether_it_scales_up(sup):
    """The start event of a job that got fewer nodes than asked tells what happens next: it grows
    back only with allow_scale_up (the seed's switch), else it keeps the nodes it got."""
    nodes = len(sup.scheduler.cluster.nodes) + 1  # one more than the cluster has: it shrinks
    said = {}
    for allow in (False, True):
        spec = JobSpec(
            name=f"elastic-{allow}",
            mode="pytorch",
            nodes=nodes,
            command=f"{PY} -c pass",  # an interpreter path: each node runs it once, untouched
            checkpoint_resume={"elastic_min_nodes": 1, "allow_scale_up": allow},
        )
        job = sup.submit(spec, creator="me")
        final = tick_until_ended(sup, job.id)
        assert final.status is JobStatus.succeeded, final.reason
        said[allow] = next(e.reason for e in sup.store.events(job.id) if e.reason.startswith("started with"))
    running = nodes - 1
    assert said[False] == (
        f"started with {running} of {nodes} nodes (elastic, at least 1): it keeps them until it ends "
        "(allow_scale_up is off)"
    )
    assert (
        said[True]
        == f"started with {running} of {nodes} nodes (elastic, at least 1): it scales up when nodes free"
    )


def test_the_pre_check_tests_the_checkpoint_folder_as_the_jobs_account(sup):
    """A job that takes its own outputs folder away (chmod 000) fails the pre-check before its
    resume: root, the service, could still use the folder, the job's account could not."""
    script = (
        "import os, time; "
        'first = os.environ["MA_ATTEMPT"] == "0"; '
        'first and os.chmod("/workspace/outputs", 0); '
        f'print("{SLOW}", flush=True); '
        "time.sleep(60)"
    )
    spec = JobSpec(
        name="locked-out",
        command=f"{PY} -c '{script}'",
        checkpoint_resume={
            "max_resumes": 1,
            "grace_period": 1,
            "perf_threshold": 0.5,
            "perf_policy": "reschedule",
        },
    )
    job = sup.submit(spec, creator="me")
    final = tick_until_ended(sup, job.id)
    assert final.status is JobStatus.error, final.reason
    account = sup.backend.job_account("me")
    who = "the service's account" if account is None else f"{account.name} (uid {account.uid})"
    assert final.reason.startswith("pre-check before resume failed: the checkpoint folder "), final.reason
    assert f"not readable and writable by {who}, the account the job runs as" in final.reason


def test_a_restarted_attempt_gets_its_outputs_on_its_nodes_off_the_lock_or_fails_saying_why(fake_sup):
    """Contract rule 30 (``service/preparation.py`` rule 7): a backend that carries the job's
    outputs folder to its nodes' machines is asked for the restarted attempt only, off the
    supervisor's lock, with the attempt's hosts and the disk reserve; its lines are the job's
    events, and a copy that fails is the job's error with the reason (never a start without)."""
    import threading

    from ma_jupyter.errors import RefusedFile

    sup = fake_sup
    sup.backend.script = lambda attempt, launch: FakeNode(["boom"], exit_code=3)
    asked: list = []

    def seed_outputs(job_id, hosts, account, reserve, cancel, say):
        asked.append((hosts, reserve, threading.current_thread().name))  # data preparation's
        say("outputs: 2 file(s) of the service's copy written")
        raise RefusedFile("the copy of the outputs folder to Ray node n1 failed: ckpt is a link")

    sup.backend.seeds_outputs = lambda job: job.attempt > 0
    sup.backend.seed_outputs = seed_outputs
    job = sup.submit(JobSpec(name="moves", command="true", fault_restart={"max_restarts": 1}), creator="me")
    final = tick_until_ended(sup, job.id)
    assert final.status is JobStatus.error and final.attempt == 1
    reserve = int(sup.scheduler.cluster.limits.disk_reserve_mb * (1 << 20))
    assert asked == [(["node-0"], reserve, f"ma-prepare-{job.id}")]
    reasons = [e.reason for e in sup.store.events(job.id)]
    assert "outputs: 2 file(s) of the service's copy written" in reasons
    assert (
        reasons[-1]
        == "could not start: outputs: the copy of the outputs folder to Ray node n1 failed: ckpt is a link"
    )
