"""The supervisor in the orders that races produce, end to end on real node processes.

The decisions themselves are tested on plain values in tests/unit/test_policies.py.  Here a
supervisor whose loop is not running is driven through its public methods (``tick``,
``request_stop``, ``update``, ``recover``, ``wait_idle``), and a race is staged by running one
more action right after the store listed the jobs a tick is about to handle, or by holding the
thread that winds an attempt down.  No stale copy of a job may win: a finished job stays
finished, a stop requested while an attempt is being wound down is honoured, an update made
between a listing and the action on it is kept, and a launch cut short by a crash is cleaned up.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from ma_jupyter import config
from ma_jupyter.backends.base import Attempt
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.errors import DiskFull, NotFound
from ma_jupyter.models import JobSpec, JobStatus
from ma_jupyter.modes import plan_job
from ma_jupyter.service.scheduler import Scheduler
from ma_jupyter.service.store import Store
from ma_jupyter.service.store_schema import jobs_table
from ma_jupyter.service.supervisor import Supervisor
from tests.fakes.backend import FakeBackend, FakeNode
from tests.fixtures.supervisor import supervisor_on, tick_until_ended
from tests.fixtures.supervisor import tick_until as fixtures_tick_until
from tests.helpers import stop_every_job, wait_for

PY = sys.executable


class HeldBackend(LocalBackend):
    """The local backend, except that calls from any thread but the test's wait while ``held``:
    an attempt being wound down stays so until the test lets it go."""

    def __init__(self):
        super().__init__()
        self.released = threading.Event()
        self.released.set()

    def _wait(self):
        if threading.current_thread() is not threading.main_thread():
            assert self.released.wait(30), "the test never let the wind-down go on"

    def poll(self, attempt, run):
        self._wait()
        return super().poll(attempt, run)

    def stop(self, attempt, runs, grace):
        self._wait()
        super().stop(attempt, runs, grace)


def new_supervisor(backend=None) -> Supervisor:
    return Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), backend or LocalBackend())


@pytest.fixture
def ma_supervisor(ma_home):
    """A supervisor whose loop is not running: the test calls its steps itself."""
    sup = new_supervisor(HeldBackend())
    yield sup
    sup.backend.released.set()
    stop_every_job(sup)


def after_listing(sup: Supervisor, status: JobStatus, action) -> None:
    """Run ``action`` once, right after the next listing of jobs of ``status`` a tick then works
    through: the store's running jobs, or the first queued job of each shape (queue index)."""
    if status is JobStatus.queued:
        heads = sup.queue.heads

        def first_of_each_shape():
            listed = heads()
            del sup.queue.heads  # once
            action()
            return listed

        sup.queue.heads = first_of_each_shape
        return
    listing = sup.store.by_status

    def by_status(*statuses):
        jobs = listing(*statuses)
        if statuses == (status,):
            del sup.store.by_status  # once
            action()
        return jobs

    sup.store.by_status = by_status


def tick_until(sup: Supervisor, job_id: str, status: JobStatus, timeout: float = 30) -> None:
    def reached():
        sup.tick()
        sup.wait_idle()
        return sup.store.status(job_id) is status

    wait_for(reached, timeout=timeout)


def statuses(sup: Supervisor, job_id: str) -> list[JobStatus]:
    return [e.status for e in sup.store.events(job_id)]


def test_a_stale_running_copy_never_overrides_a_finished_job(ma_supervisor):
    sup = ma_supervisor
    job = sup.submit(JobSpec(name="ok", command=f"{PY} -c pass"), creator="me")
    sup.tick()
    assert sup.store.status(job.id) is JobStatus.running
    sup.backend.released.clear()  # the job's end will be held while being recorded
    wait_for(lambda: (sup.tick(), not sup.wait_idle(0))[1], timeout=30)  # its node exited: finishing

    def finish_completes():
        sup.backend.released.set()
        assert sup.wait_idle()

    # the next tick lists the job as running, and only then does its finish complete
    after_listing(sup, JobStatus.running, finish_completes)
    sup.tick()
    assert sup.wait_idle()
    sup.tick()
    final = sup.store.get(job.id)
    assert final.status is JobStatus.succeeded, final.reason
    assert final.exit_code == 0 and final.nodes[0].state == "exited"
    assert statuses(sup, job.id).count(JobStatus.succeeded) == 1


def test_a_stop_requested_while_a_fault_restart_winds_down_is_honoured(ma_supervisor):
    sup = ma_supervisor
    spec = JobSpec(
        name="bad", command=f"{PY} -c 'import time; time.sleep(60)'", fault_restart={"max_restarts": 2}
    )
    job = sup.submit(spec, creator="me")
    sup.tick()
    running = sup.store.get(job.id)
    assert running.status is JobStatus.running and running.nodes[0].pid
    sup.backend.released.clear()
    os.killpg(running.nodes[0].pid, signal.SIGKILL)  # the node dies: a fault
    wait_for(lambda: (sup.tick(), not sup.wait_idle(0))[1], timeout=30)  # winding down for a restart
    sup.request_stop(job.id)  # the user stops meanwhile
    sup.backend.released.set()
    assert sup.wait_idle()
    final = sup.store.get(job.id)
    assert final.status is JobStatus.stopped, final.reason
    assert final.reason == "stopped by user" and final.restarts == 0
    assert sup.store.desired(job.id) is None
    assert JobStatus.queued not in statuses(sup, job.id)[1:]  # never put back in the queue


def test_an_update_between_listing_and_launch_is_kept(ma_supervisor):
    sup = ma_supervisor
    job = sup.submit(JobSpec(name="d", command=f"{PY} -c 'import time; time.sleep(1)'"), creator="me")
    # an API call lands between the loop's listing of queued jobs and the launch
    after_listing(sup, JobStatus.queued, lambda: sup.update(job.id, duration=5.0))
    sup.tick()
    launched = sup.store.get(job.id)
    assert launched.status is JobStatus.running and launched.spec.duration == 5.0
    # and between the listing of running jobs and the node states saved when its node exited
    time.sleep(1.5)
    after_listing(sup, JobStatus.running, lambda: sup.update(job.id, duration=9.0))
    tick_until(sup, job.id, JobStatus.succeeded)
    final = sup.store.get(job.id)
    assert final.spec.duration == 9.0 and final.status is JobStatus.succeeded


def test_a_launch_interrupted_by_a_crash_is_cleaned_up_and_started_once(ma_supervisor):
    sup = ma_supervisor
    job = sup.submit(JobSpec(name="half", command=f"{PY} -c 'import time; time.sleep(60)'"), creator="me")
    placement = sup.backend.bind(sup.scheduler.place(job.id, job.spec, sup.usage()), reserve=True)
    attempt = Attempt(
        job_id=job.id,
        spec=job.spec,
        number=0,
        job_dir=config.jobdir(job.id).root,
        plans=tuple(plan_job(job.spec, placement)),
    )
    # what a launch does before it records the job as running ... and then the service dies
    sup.store.set_placement(job.id, placement.to_json())
    runs = sup.backend.launch(attempt, sup.backend.dryrun(attempt))
    assert sup.backend.poll(attempt, runs[0]).state == "running"

    again = new_supervisor()
    again.recover()
    assert LocalBackend().poll(attempt, runs[0]).state != "running"
    assert again.store.placement(job.id) is None
    assert again.store.status(job.id) is JobStatus.queued
    assert any("partly started nodes were stopped" in e.reason for e in again.store.events(job.id))
    again.tick()  # it starts again, once
    assert again.store.status(job.id) is JobStatus.running
    assert statuses(again, job.id).count(JobStatus.running) == 1
    again.request_stop(job.id)
    again.tick()
    assert again.wait_idle()
    assert again.store.status(job.id) is JobStatus.stopped


def test_the_first_start_read_of_a_folder_runs_off_the_lock(ma_supervisor, tmp_path, monkeypatch):
    """A folder used as is is read again at its job's first start (a writable code folder of a
    million files took over a second): that read runs off the supervisor's lock, so here, with
    the read held, another user's submit answers and the job waits queued; once read, it starts
    with the content it read (an edit made while it was queued)."""
    from ma_jupyter import algorithm_content

    sup = ma_supervisor
    folder = tmp_path / "algo"
    folder.mkdir()
    (folder / "train.py").write_text("print('first version')\n")
    job = sup.submit(JobSpec(name="reads", algorithm=str(folder), command=f"{PY} -c pass"), creator="me")
    at_submit = job.spec.algorithm_digest
    (folder / "train.py").write_text("print('second version')\n")  # edited while it waits
    reading, release = threading.Event(), threading.Event()
    real = algorithm_content.digest_bounded

    def held(*args, **kwargs):
        reading.set()
        assert release.wait(120), "the test never let the read go on"
        return real(*args, **kwargs)

    monkeypatch.setattr(algorithm_content, "digest_bounded", held)
    ticking = threading.Thread(target=sup.tick, daemon=True)
    ticking.start()
    try:
        assert reading.wait(60), "the first start never read the folder"
        submitted = []
        other = threading.Thread(
            target=lambda: submitted.append(
                sup.submit(JobSpec(name="other", command=f"{PY} -c pass"), creator="you")
            ),
            daemon=True,
        )
        other.start()
        other.join(30)
        assert submitted, "another user's submit waited for the first-start read of a folder"
        assert sup.store.status(job.id) is JobStatus.queued  # its placement is bound meanwhile
    finally:
        release.set()
        ticking.join(60)
    tick_until(sup, job.id, JobStatus.succeeded, timeout=120)
    final = sup.store.get(job.id)
    assert final.spec.algorithm_digest == algorithm_content.digest(folder) != at_submit
    assert any(
        f"algorithm folder {folder} changed since the submit" in e.reason for e in sup.store.events(job.id)
    )


class LaunchHeld(HeldBackend):
    """A backend whose launches from the supervisor's threads wait until the test lets them go."""

    def __init__(self):
        super().__init__()
        self.launching, self.go = threading.Event(), threading.Event()

    def launch(self, attempt, launches):
        if threading.current_thread() is not threading.main_thread():
            self.launching.set()
            assert self.go.wait(120), "the test never let the launch go on"
        return super().launch(attempt, launches)


def test_a_submit_never_waits_for_another_jobs_launch(ma_home):
    """The loop holds the supervisor's lock while it launches a job (a node's start takes
    ~0.1 s, far more on a loaded machine): a submit meanwhile answers at once, queued."""
    backend = LaunchHeld()
    sup = new_supervisor(backend)
    ticking = threading.Thread(target=sup.tick, daemon=True)
    try:
        first = sup.submit(JobSpec(name="first", command=f"{PY} -c pass"), creator="me")
        ticking.start()
        assert backend.launching.wait(60), "the first job was never launched"
        submitted = []
        other = threading.Thread(
            target=lambda: submitted.append(
                sup.submit(JobSpec(name="next", command=f"{PY} -c pass"), creator="me")
            ),
            daemon=True,
        )
        other.start()
        other.join(30)
        assert submitted, "a submit waited for another job's launch"
        assert sup.store.status(submitted[0].id) is JobStatus.queued
        assert sup.store.status(first.id) is JobStatus.queued  # still being launched
    finally:
        backend.go.set()
        ticking.join(60)
    tick_until(sup, submitted[0].id, JobStatus.succeeded, timeout=120)
    stop_every_job(sup)


def test_an_admins_stop_or_delete_between_a_submits_row_and_its_queue_place_leaves_no_queued_ghost(
    ma_supervisor,
):
    """A submit stores its row, then takes its place in the queue index, off the supervisor's
    lock: an admin's bulk stop or delete that lists the new row in between leaves an entry the
    next pass drops; the stopped job never starts, and the queue goes on to the next job."""
    sup = ma_supervisor
    insert = sup.store.insert
    acted: list[str] = []

    def then_the_admin_acts(job, *args, **kwargs):
        stored = insert(job, *args, **kwargs)
        if job.spec.name == "stopped":
            sup.request_stop(job.id, by="admin")
        elif job.spec.name == "deleted":
            sup.delete(job.id, force=True, by="admin")
        acted.append(job.id)
        return stored

    sup.store.insert = then_the_admin_acts
    stopped = sup.submit(JobSpec(name="stopped", command=f"{PY} -c pass"), creator="me")
    deleted = sup.submit(JobSpec(name="deleted", command=f"{PY} -c pass"), creator="me")
    after = sup.submit(JobSpec(name="after", command=f"{PY} -c pass"), creator="me")
    assert acted == [stopped.id, deleted.id, after.id]
    assert {stopped.id, deleted.id} <= set(sup.queue.ids())  # the ghosts the pass must drop
    sup.tick()
    sup.wait_idle()
    assert stopped.id not in sup.queue.ids() and deleted.id not in sup.queue.ids(), sup.queue.ids()
    assert sup.store.status(stopped.id) is JobStatus.stopped
    assert not sup.store.get(stopped.id).nodes  # never launched
    with pytest.raises(NotFound):
        sup.store.get(deleted.id)
    assert sup.queue.ahead(after.spec.priority, "me") <= 1  # only "after" itself, if still queued
    tick_until(sup, after.id, JobStatus.succeeded, timeout=120)


class DiesInItsStop(FakeBackend):
    """The fake backend, except that the first stop ends the nodes and then never returns to its
    caller: the service that called it died during the wind-down, before it recorded the end."""

    def __init__(self):
        super().__init__(lambda attempt, launch: FakeNode(exit_code=None))  # run until ended
        self.dying, self.buried = threading.Event(), threading.Event()

    def stop(self, attempt, runs, grace):
        super().stop(attempt, runs, grace)
        if not self.dying.is_set():
            self.dying.set()
            self.buried.wait(30)
            raise RuntimeError("the service that stopped these nodes is gone")


def test_an_end_a_service_began_is_the_end_the_next_service_records(ma_home):
    """A node is lost, so the attempt ends naming it; the service dies while it stops the other
    node.  The next service must not read that node's SIGTERM (143) as the first failure: it
    records the end the first one had decided, written ahead of the stop."""
    backend = DiesInItsStop()
    first = supervisor_on(backend)
    job = first.submit(JobSpec(name="two", command="true", nodes=2, mode="pytorch"), creator="me")
    fixtures_tick_until(first, lambda: first.store.status(job.id) is JobStatus.running)
    backend.lose(job.id, "worker-1")
    first.tick()  # the wind-down starts on its thread and dies in the stop
    assert backend.dying.wait(10)
    try:
        second = supervisor_on(backend)
        second.recover()
        final = tick_until_ended(second, job.id)
    finally:
        backend.buried.set()
    assert backend.running(job.id) == []
    assert final.status is JobStatus.error
    last = second.store.events(job.id)[-1]
    assert last.node == "worker-1" and "worker-1" in last.reason.splitlines()[0], last.reason
    assert "143" not in last.reason, last.reason
    assert [n.state for n in final.nodes] == ["exited", "lost"], final.nodes
    assert second.store.ending(job.id) is None  # cleared once recorded


def test_a_wind_down_that_fails_is_tried_again_with_the_same_end(ma_home):
    """The stop fails (an agent's error on Ray) after it ended the other node: the same service
    tries the wind-down again with the end it had decided, not one inferred from the node the
    failed try stopped (its 143)."""
    backend = DiesInItsStop()
    backend.buried.set()  # the first stop raises at once, and the service lives on
    sup = supervisor_on(backend)
    job = sup.submit(JobSpec(name="two", command="true", nodes=2, mode="pytorch"), creator="me")
    fixtures_tick_until(sup, lambda: sup.store.status(job.id) is JobStatus.running)
    backend.lose(job.id, "worker-1")
    final = tick_until_ended(sup, job.id)
    assert backend.dying.is_set()  # the first try failed
    assert final.status is JobStatus.error
    last = sup.store.events(job.id)[-1]
    assert last.node == "worker-1" and "143" not in last.reason, last.reason
    assert sup.store.ending(job.id) is None


class FullAtTheEnd(Store):
    """The store, except that its first write of a job's end finds the disk full midway (as a
    disk the job filled does): the attempt's notes are cleared in the transaction, then it fails
    and rolls back."""

    def __init__(self, path):
        super().__init__(path)
        self.refused = 0

    def save(self, job, event=None, **kwargs):
        if job.status.is_terminal() and not self.refused:
            self.refused += 1
            with self.writing() as conn:
                conn.execute(
                    jobs_table.update().where(jobs_table.c.id == job.id).values(placement=None, ending=None)
                )
                raise DiskFull("disk full under the service home: the job service cannot record anything")
        return super().save(job, event, **kwargs)


def test_an_end_the_full_disk_kept_from_being_recorded_is_recorded_whole_on_the_retry(ma_home):
    """The end's record fails for a full disk: nothing of the attempt's end may have happened
    then (its placement cleared, the supervisor's notes dropped), so the retry records the same
    end, not "the service has no record of where this job ran"."""
    backend = FakeBackend(lambda attempt, launch: FakeNode(exit_code=None))  # run until ended
    sup = Supervisor(FullAtTheEnd(config.db_path()), Scheduler(config.load_cluster()), backend)
    job = sup.submit(JobSpec(name="two", command="true", nodes=2, mode="pytorch"), creator="me")
    fixtures_tick_until(sup, lambda: sup.store.status(job.id) is JobStatus.running)
    backend.lose(job.id, "worker-1")
    final = tick_until_ended(sup, job.id)
    assert sup.store.refused == 1  # the first record failed
    assert final.status is JobStatus.error
    last = sup.store.events(job.id)[-1]
    assert last.node == "worker-1" and "worker-1" in last.reason.splitlines()[0], last.reason
    assert sup.store.placement(job.id) is None and sup.store.ending(job.id) is None
    assert backend.running(job.id) == []
    assert job.id not in sup.ledger.placements and not backend.held  # released, once recorded
    assert [e.node for e in sup.store.events(job.id)].count("worker-1") == 1  # one end event
