"""The supervisor acting in the orders that races produce, run in-process on real node processes.

Each test drives the supervisor's steps by hand in the order a race would interleave them and
checks that no stale copy of a job wins: a finished job stays finished, a stop requested while
an attempt is being wound down is honoured, and an update made between a listing and the action
on it is kept.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from ma_jupyter import config
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.models import JobSpec, JobStatus
from ma_jupyter.service.scheduler import Scheduler
from ma_jupyter.service.store import Store
from ma_jupyter.service.supervisor import Supervisor
from tests.helpers import wait_for

PY = sys.executable


@pytest.fixture
def ma_supervisor(ma_home):
    """A supervisor whose loop is not running: the test calls its steps itself."""
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), LocalBackend())
    yield sup
    for job in sup.store.by_status(JobStatus.running, JobStatus.queued):
        sup.request_stop(job.id)
        sup.tick()
    _join_finishers()
    for job in sup.store.by_status(JobStatus.running):
        placement = sup._placements.get(job.id)
        if placement:
            sup.backend.stop(sup._attempt(job, placement), job.nodes, 1.0)


def _join_finishers():
    for thread in threading.enumerate():
        if thread.name.startswith("finish-"):
            thread.join(30)


def _exited(sup, job_id):
    job = sup.store.get(job_id)
    attempt = sup._attempt(job, sup._placements[job_id])
    return all(sup.backend.poll(attempt, r).state == "exited" for r in job.nodes)


def test_a_stale_running_copy_never_overrides_a_finished_job(ma_supervisor):
    sup = ma_supervisor
    job = sup.submit(JobSpec(name="ok", command=f"{PY} -c pass"), creator="me")
    sup._admit()
    wait_for(lambda: _exited(sup, job.id), timeout=30)
    stale = sup.store.by_status(JobStatus.running)[0]  # a tick lists the job as running...
    sup._watch(sup.store.get(job.id))  # ...while its finish completes
    _join_finishers()
    assert sup.store.status(job.id) is JobStatus.succeeded
    sup._watch(stale)  # the tick then gets to its stale copy
    _join_finishers()
    assert sup.store.status(job.id) is JobStatus.succeeded


def test_a_stop_requested_while_a_fault_restart_winds_down_is_honoured(ma_supervisor):
    sup = ma_supervisor
    spec = JobSpec(
        name="bad", command=f"{PY} -c 'import time; time.sleep(60)'", fault_restart={"max_restarts": 2}
    )
    job = sup.submit(spec, creator="me")
    sup._admit()
    running = wait_for(lambda: (j := sup.store.get(job.id)).nodes and j.nodes[0].pid and j, timeout=30)
    os.killpg(running.nodes[0].pid, signal.SIGKILL)  # the node dies: a fault
    wait_for(
        lambda: (
            sup.backend.poll(sup._attempt(running, sup._placements[job.id]), running.nodes[0]).state
            != "running"
        ),
        timeout=10,
    )
    sup._watch(running)  # starts winding the attempt down for a restart
    sup.request_stop(job.id)  # the user stops meanwhile
    _join_finishers()
    final = sup.store.get(job.id)
    assert final.status is JobStatus.stopped, final.reason
    assert sup.store.desired(job.id) is None


def test_an_update_between_listing_and_launch_is_kept(ma_supervisor):
    sup = ma_supervisor
    job = sup.submit(JobSpec(name="d", command=f"{PY} -c 'import time; time.sleep(1)'"), creator="me")
    sup.store.by_status(JobStatus.queued)  # the loop's listing
    sup.update(job.id, duration=5.0)  # an API call lands in between
    sup._admit()
    assert sup.store.get(job.id).spec.duration == 5.0
    sup.update(job.id, duration=9.0)
    time.sleep(1.5)  # the node exits; watching saves node states on a fresh copy
    sup._watch(sup.store.get(job.id))
    _join_finishers()
    final = sup.store.get(job.id)
    assert final.spec.duration == 9.0 and final.status is JobStatus.succeeded


def test_a_launch_interrupted_by_a_crash_is_cleaned_up_and_started_once(ma_supervisor):
    sup = ma_supervisor
    job = sup.submit(JobSpec(name="half", command=f"{PY} -c 'import time; time.sleep(60)'"), creator="me")
    placement = sup._place(job.id, job.spec, sup._usage(), reserve=True)
    attempt = sup._attempt(job, placement)
    # what _launch does before it records the job as running ... and then the service dies
    sup.store.set_placement(job.id, placement.to_json())
    runs = sup.backend.launch(attempt)
    assert sup.backend.poll(attempt, runs[0]).state == "running"

    again = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), LocalBackend())
    again._reattach()
    assert LocalBackend().poll(attempt, runs[0]).state != "running"
    assert again.store.placement(job.id) is None
    assert again.store.status(job.id) is JobStatus.queued
    assert any("partly started nodes were stopped" in e.reason for e in again.store.events(job.id))
    again._admit()  # it starts again, once
    assert again.store.status(job.id) is JobStatus.running
    again.request_stop(job.id)
    again.tick()
    _join_finishers()
    assert again.store.status(job.id) is JobStatus.stopped
