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


def test_a_slow_node_is_reported_once_per_attempt(sup):
    script = f'import time; print("{SLOW}"); print("{SLOW}", flush=True); time.sleep(1); print("{SLOW}")'
    spec = JobSpec(
        name="slow",
        command=f"{PY} -c '{script}'",
        checkpoint_resume={"max_resumes": 1, "perf_threshold": 0.5, "perf_policy": "alert"},
    )
    job = sup.submit(spec, creator="me")
    final = tick_until_ended(sup, job.id)
    assert final.status is JobStatus.succeeded, final.reason
    alerts = [e for e in sup.store.events(job.id) if e.reason.startswith("performance alert")]
    assert [e.reason for e in alerts] == [
        "performance alert on worker-0: hardware/e2e time 0.900 exceeds the threshold 0.5"
    ]
    assert alerts[0].alert and alerts[0].node == "worker-0"  # marked, for followers to show at once


def test_an_earlier_attempts_slow_line_does_not_reschedule_the_next_attempts(sup):
    """The node's log spans attempts: each attempt's scan starts where that attempt's lines do."""
    script = (
        "import os, time; "
        'first = os.environ["MA_ATTEMPT"] == "0"; '
        f'print("{SLOW}" if first else "resumed", flush=True); '
        "time.sleep(60 if first else 2)"
    )
    spec = JobSpec(
        name="once-slow",
        command=f"{PY} -c '{script}'",
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


def test_a_fault_restart_starts_the_next_attempt_then_ends_in_error(sup):
    spec = JobSpec(
        name="crash",
        command=f"{PY} -c 'import sys; print(\"boom\"); sys.exit(3)'",
        fault_restart={"max_restarts": 1},
    )
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
