"""Queue fairness on a real service: the head of the queue keeps what it reserved (EASY backfill).

Four nodes, each holding one job; three fillers run for an hour by their duration.  An urgent
2-node job cannot start (one node is free) and becomes the head: it reserves the free node and
the first node a filler frees.  A normal 1-node job behind it fits on the free node now, but
would delay the head, so it waits; one whose duration ends it before the head's estimated start
may pass.  The dry run predicts each case with the same rules.

The rule is tested on the fake backend (in this process, in milliseconds); the real service's
test keeps the end-to-end case: the head waits, the normal job with it, and the head starts
first on real nodes when a filler is stopped.
"""

from __future__ import annotations

import sys

import pytest

from ma_jupyter.models import JobSpec, JobStatus
from tests.fakes.backend import runs_to
from tests.fixtures.service_api import job_of, submit, wait_status
from tests.fixtures.supervisor import tick_until
from tests.helpers import wait_for

PY = sys.executable
SLEEP = f'{PY} -c "import time; time.sleep(600)"'
FOUR_NODES = """
[[spec]]
name = "cpu.node"
cpus = 2
memory_gb = 2
""" + "".join(f'\n[[node]]\nname = "n{i}"\ncpus = 2\nmemory_gb = 2\n' for i in range(1, 5))
ONE = {"command": SLEEP, "specs": ["cpu.node"], "grace_period": 1}


@pytest.fixture
def four_nodes(ma_home, request):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + FOUR_NODES)
    return request.getfixturevalue("ma_service")


def plan(svc, **fields) -> dict:
    reply = svc.session().post(f"{svc.api}/plan", json={"name": "p", **fields}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def events(svc, job_id) -> list[str]:
    reply = svc.session().get(f"{svc.api}/jobs/{job_id}/events", timeout=10)
    return [e["reason"] for e in reply.json()]


def test_a_normal_job_waits_behind_the_urgent_head_on_a_real_service(four_nodes):
    svc = four_nodes
    fillers = [submit(svc, name=f"filler{i}", duration=3600, **ONE)["id"] for i in range(3)]
    for job_id in fillers:
        wait_status(svc, job_id, {"running"})
    urgent = submit(svc, name="urgent", nodes=2, mode="pytorch", priority="urgent", **ONE)["id"]
    wait_for(lambda: any("first in the queue" in r for r in events(svc, urgent)))
    assert job_of(svc, urgent)["status"] == "queued"
    head_events = [r for r in events(svc, urgent) if "first in the queue" in r]
    assert "estimated start" in head_events[0] and "unknown" not in head_events[0]
    normal = submit(svc, name="normal", **ONE)["id"]
    wait_for(lambda: any("would delay" in r for r in events(svc, normal)))
    assert job_of(svc, normal)["status"] == "queued"
    assert job_of(svc, urgent)["queue_position"] == 0

    # resources freed: the head starts first, on the nodes it reserved; the normal job still waits
    svc.session().post(f"{svc.api}/jobs/{fillers[0]}/stop", timeout=10)
    started = wait_status(svc, urgent, {"running"})
    assert len(started["nodes"]) == 2
    assert job_of(svc, normal)["status"] == "queued"


@pytest.fixture
def four_fake_nodes(ma_home, request):
    """A supervisor on the fake backend (nodes run until stopped) over the four nodes."""
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + FOUR_NODES)
    sup = request.getfixturevalue("fake_sup")
    sup.backend.script = runs_to(None)
    return sup


def test_a_normal_job_cannot_overtake_the_urgent_head_but_a_short_one_may(four_fake_nodes):
    sup = four_fake_nodes

    def spec(name: str, **fields) -> JobSpec:
        return JobSpec(name=name, **{**ONE, **fields})

    def said(job_id: str) -> list[str]:
        return [e.reason for e in sup.store.events(job_id)]

    fillers = [sup.submit(spec(f"filler{i}", duration=3600), creator="me").id for i in range(3)]
    tick_until(sup, lambda: all(sup.store.status(j) is JobStatus.running for j in fillers))
    urgent = sup.submit(spec("urgent", nodes=2, mode="pytorch", priority="urgent"), creator="me").id
    head_events = tick_until(sup, lambda: [r for r in said(urgent) if "first in the queue" in r])
    assert sup.store.status(urgent) is JobStatus.queued
    assert "estimated start" in head_events[0] and "unknown" not in head_events[0]

    # the dry run already says the normal job would wait behind the head, and when it would start
    predicted = sup.plan(spec("p"))
    assert (predicted.can_start_now, predicted.queue_ahead) == (False, 1)
    assert predicted.estimated_start is not None
    normal = sup.submit(spec("normal"), creator="me").id
    tick_until(sup, lambda: any("would delay" in r for r in said(normal)))
    assert sup.store.status(normal) is JobStatus.queued
    assert sup.queue_position(urgent) == 0

    # a job that ends (by its duration) before the head's estimated start cannot delay it
    assert sup.plan(spec("p", duration=60)).can_start_now is True
    quick = sup.submit(spec("quick", duration=60), creator="me").id
    tick_until(sup, lambda: sup.store.status(quick) is JobStatus.running)
    assert sup.store.status(normal) is JobStatus.queued

    # resources freed: the head starts first, on the nodes it reserved; the normal job still waits
    sup.request_stop(quick)
    sup.request_stop(fillers[0])
    tick_until(sup, lambda: sup.store.status(urgent) is JobStatus.running)
    assert len(sup.store.get(urgent).nodes) == 2
    assert sup.store.status(normal) is JobStatus.queued
