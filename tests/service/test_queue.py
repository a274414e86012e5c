"""The queue: its order, exact positions, restarts, and admission that reacts to events.

The service tests run a real service on the two-node cluster (``tiny`` holds one
``cpu.medium`` job): a blocker fills ``tiny`` and the jobs behind it wait.  The last test drives
a supervisor whose loop is not running, so that nothing but the test's own calls makes it act.
"""

from __future__ import annotations

import signal
import sys

import pytest

from ma_jupyter import config
from ma_jupyter.models import JobSpec, JobStatus, Priority
from ma_jupyter.service.scheduler import Scheduler
from ma_jupyter.service.store import Store
from ma_jupyter.service.supervisor import Supervisor
from ma_jupyter.service.supervisor import actions as supervisor_actions
from tests.fakes.backend import FakeBackend, runs_to
from tests.fixtures.service_api import job_of, submit, wait_status
from tests.fixtures.supervisor import tick_until
from tests.helpers import stop_every_job

PY = sys.executable
SLEEP = f'{PY} -c "import time; time.sleep(600)"'
# every waiting job takes the whole of tiny, so exactly one starts when the blocker stops
ON_TINY = {"command": SLEEP, "specs": ["cpu.medium"], "node_name": "tiny", "grace_period": 1}


def start_blocker(svc) -> dict:
    blocker = submit(svc, name="blocker", **ON_TINY)
    wait_status(svc, blocker["id"], {"running"})
    return blocker


def positions(svc, ids) -> dict[str, int | None]:
    """Each job's queue position as GET /jobs/{id} gives it, and checked against the listing."""
    shown = {job_id: job_of(svc, job_id)["queue_position"] for job_id in ids}
    page = svc.session().get(f"{svc.api}/jobs", params={"status": "queued", "limit": 500}, timeout=10).json()
    listed = {j["id"]: j["queue_position"] for j in page["items"]}
    assert {k: v for k, v in listed.items() if k in shown} == {
        k: v for k, v in shown.items() if v is not None
    }
    return shown


@pytest.mark.small_cluster
def test_the_order_and_exact_positions_survive_a_restart_and_a_kill_9(ma_service):
    start_blocker(ma_service)
    priorities = ["normal", "urgent", "normal", "very-urgent", "urgent", "normal"]
    ids = []
    for i, priority in enumerate(priorities):
        job = submit(ma_service, name=f"w{i}", priority=priority, **ON_TINY)
        # at submit, every earlier job of the same or a higher priority is ahead of it
        rank = Priority(priority).rank
        assert job["queue_position"] == sum(Priority(p).rank >= rank for p in priorities[:i])
        ids.append(job["id"])
    # priority first, then submit order
    order = sorted(range(len(ids)), key=lambda i: (-Priority(priorities[i]).rank, i))
    expected = {ids[i]: place for place, i in enumerate(order)}
    assert positions(ma_service, ids) == expected

    ma_service.proc.send_signal(signal.SIGTERM)  # an orderly restart
    ma_service.proc.wait(10)
    svc = ma_service.restart()
    assert positions(svc, ids) == expected

    svc.proc.send_signal(signal.SIGKILL)  # and a crash
    svc.proc.wait(10)
    svc = ma_service.restart()
    assert positions(svc, ids) == expected
    assert {job_of(svc, job_id)["status"] for job_id in ids} == {"queued"}


@pytest.mark.small_cluster
def test_a_priority_change_reorders_the_queue_and_a_stop_or_delete_closes_the_gap(ma_service):
    blocker = start_blocker(ma_service)
    a, b, c, d = (submit(ma_service, name=n, **ON_TINY)["id"] for n in "abcd")
    assert positions(ma_service, [a, b, c, d]) == {a: 0, b: 1, c: 2, d: 3}
    s = ma_service.session()

    assert s.patch(f"{ma_service.api}/jobs/{d}", json={"priority": "urgent"}, timeout=10).status_code == 200
    assert positions(ma_service, [a, b, c, d]) == {d: 0, a: 1, b: 2, c: 3}
    # back to normal: behind the older normal jobs again (its submit time is kept)
    assert s.patch(f"{ma_service.api}/jobs/{d}", json={"priority": "normal"}, timeout=10).status_code == 200
    assert positions(ma_service, [a, b, c, d]) == {a: 0, b: 1, c: 2, d: 3}
    assert s.patch(f"{ma_service.api}/jobs/{c}", json={"priority": "urgent"}, timeout=10).status_code == 200

    assert s.post(f"{ma_service.api}/jobs/{a}/stop", timeout=10).json()["status"] == "stopped"
    assert s.delete(f"{ma_service.api}/jobs/{b}", params={"force": "true"}, timeout=10).status_code == 204
    assert s.get(f"{ma_service.api}/jobs/{b}", timeout=10).status_code == 404
    assert positions(ma_service, [a, c, d]) == {a: None, c: 0, d: 1}

    # resources free: the head (c, urgent) starts, d stays first in line
    s.post(f"{ma_service.api}/jobs/{blocker['id']}/stop", timeout=10)
    assert wait_status(ma_service, c, {"running", "error"})["status"] == "running"
    assert job_of(ma_service, d)["status"] == "queued" and positions(ma_service, [d]) == {d: 0}


# ------------------------------------------------------------- admission without a timer


class CountingScheduler(Scheduler):
    """The real scheduler, counting placement attempts of queued jobs (not the dry runs)."""

    def __init__(self, cluster):
        super().__init__(cluster)
        self.tried: list[str] = []

    def place(self, job_id, spec, use, exclude=()):
        if job_id != "dry-run":
            self.tried.append(spec.name)
        return super().place(job_id, spec, use, exclude)


@pytest.fixture
def driven(ma_home):
    """A supervisor whose loop is not running: it acts only when the test calls it.  Admission
    and fair share are the supervisor's own rules: its nodes are the fake backend's, which run
    until stopped (the queue's end-to-end tests above run real ones through a real service)."""
    sup = Supervisor(
        Store(config.db_path()), CountingScheduler(config.load_cluster()), FakeBackend(runs_to(None))
    )
    yield sup
    stop_every_job(sup)


def spec(name: str, priority: str = "normal") -> JobSpec:
    return JobSpec(name=name, priority=priority, **ON_TINY)


@pytest.mark.small_cluster
def test_admission_reacts_to_events_and_costs_nothing_per_queued_job_on_a_tick(driven):
    sup = driven
    blocker = sup.submit(spec("blocker"), creator="me")
    sup.tick()
    assert sup.store.status(blocker.id) is JobStatus.running
    later = [sup.submit(spec(f"n{i}"), creator="me") for i in range(5)]
    head = sup.submit(spec("head", "urgent"), creator="me")
    assert sup.queue.ids() == [head.id] + [j.id for j in later]

    sup.scheduler.tried.clear()
    sup.tick()  # the submits asked for a pass: it tries the first job of the shape, which waits
    assert sup.scheduler.tried == ["head"]
    sup.scheduler.tried.clear()
    for _ in range(5):  # no event: the ticks watch the blocker and leave the queue alone
        sup.tick()
    assert sup.scheduler.tried == []

    sup.request_stop(later[0].id)  # a queued job stops: it leaves the queue at once
    assert later[0].id not in sup.queue and sup.queue.position(later[1].id) == 1
    sup.scheduler.tried.clear()
    sup.request_stop(blocker.id)
    sup.tick()  # the stop is carried out on its own thread; the pass after it is an event's
    assert sup.wait_idle()
    assert sup.store.status(blocker.id) is JobStatus.stopped
    sup.tick()  # resources freed: the head starts, the next in line is tried and waits
    assert sup.store.status(head.id) is JobStatus.running
    # the head was tried (perhaps first on the stop's own pass, while the blocker still held
    # the node) and started; after its start only the next in line (tried again on the start's
    # own event pass), never the queue behind it
    tried = sup.scheduler.tried
    assert set(tried) == {"head", "n1"}, tried
    started_at = len(tried) - 1 - tried[::-1].index("head")
    assert set(tried[started_at + 1 :]) == {"n1"}, tried
    assert sup.queue.ids() == [j.id for j in later[1:]] and sup.queue.position(later[1].id) == 0


@pytest.mark.small_cluster
def test_an_idle_tick_lists_no_running_jobs_again_until_the_store_was_written(driven, monkeypatch):
    sup = driven
    listings = []
    listed = sup.store.by_status

    def by_status(*statuses):
        if sys._getframe(1).f_code.co_name == "watch_running":
            listings.append(statuses)
        return listed(*statuses)

    monkeypatch.setattr(sup.store, "by_status", by_status)
    sup.tick()
    assert len(listings) == 1
    for _ in range(5):  # nothing written: no job can have started
        sup.tick()
    assert len(listings) == 1
    job = sup.submit(spec("one"), creator="me")
    sup.tick()  # the submit wrote: listed again (none running yet), then admitted and started
    assert sup.store.status(job.id) is JobStatus.running and len(listings) == 2
    sup.tick()  # the start wrote: the running job is seen and watched from now on
    [node] = sup.backend.running(job.id)
    sup.backend.end(job.id, node, 0)
    tick_until(sup, lambda: sup.store.status(job.id) is JobStatus.succeeded)
    sup.tick()
    settled = len(listings)
    for _ in range(5):  # idle again: nothing is listed until the next write
        sup.tick()
    assert len(listings) == settled


@pytest.mark.small_cluster
def test_a_submit_whose_random_id_is_taken_gets_another(driven, monkeypatch):
    sup = driven
    first = sup.submit(spec("same"), creator="me")
    ids = iter([first.id, "same-000001"])  # the random id comes out the same once
    monkeypatch.setattr(supervisor_actions, "new_job_id", lambda name: next(ids))
    second = sup.submit(spec("same"), creator="me")
    assert second.id == "same-000001" and sup.queue.ids() == [first.id, second.id]
    assert sup.store.get(first.id).created_at == first.created_at
    assert [e.reason for e in sup.store.events(second.id)] == ["submitted; 1 job(s) ahead in the queue"]


# ------------------------------------------------------------------------- fair share


@pytest.mark.small_cluster
def test_one_users_forty_jobs_do_not_hold_back_another_users_one_job(driven):
    """alice runs a blocker and fills the queue with forty one-minute jobs behind it; bob's one
    job goes first at its priority (alice has a job running, bob none: a fair share), with an
    estimated start, in the dry run and the submit's event too; when the blocker ends bob's job
    starts, not alice's next."""
    sup = driven
    minute = {**ON_TINY, "duration": 60}
    blocker = sup.submit(JobSpec(name="blocker", **{**ON_TINY, "duration": 3600}), creator="alice")
    sup.tick()
    assert sup.store.status(blocker.id) is JobStatus.running
    flood = [sup.submit(JobSpec(name=f"a{i}", **minute), creator="alice") for i in range(40)]
    assert sup.queue_position(flood[-1].id) == 39
    plan = sup.plan(JobSpec(name="b", **minute, creator="bob"))
    assert plan.queue_ahead == 0 and plan.estimated_start is not None
    bob = sup.submit(JobSpec(name="b", **minute), creator="bob")
    assert sup.queue_position(bob.id) == 0
    assert [e.reason for e in sup.store.events(bob.id)] == ["submitted; 0 job(s) ahead in the queue"]
    start = sup.estimated_start(bob.id)
    assert start is not None  # once the blocker's hour is over
    assert blocker.created_at.timestamp() + 3600 - 5 <= start.timestamp() < start.timestamp() + 3600 + 60
    carol = sup.submit(JobSpec(name="c", **minute), creator="carol")
    # every other user's next job goes before alice's, whose own keep their order
    assert sup.queue.ids() == [bob.id, carol.id] + [j.id for j in flood]
    assert sup.estimated_start(carol.id) is not None

    sup.request_stop(blocker.id)
    sup.tick()  # the stop is carried out on its own thread; the pass after it is an event's
    assert sup.wait_idle()
    sup.tick()  # tiny is free: bob's job starts
    assert sup.store.status(bob.id) is JobStatus.running
    assert sup.store.status(flood[0].id) is JobStatus.queued
    # bob runs one job; alice and carol none, but carol was never served: she goes first
    assert sup.queue.ids()[:3] == [carol.id, flood[0].id, flood[1].id]
    # an urgent job still goes before every normal one, whoever submits it
    urgent = sup.submit(JobSpec(name="u", **{**minute, "priority": "urgent"}), creator="alice")
    assert sup.queue_position(urgent.id) == 0 and sup.queue_position(carol.id) == 1
