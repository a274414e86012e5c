"""How long a job without a duration probably runs, from similar jobs (service/history.py), on
a real store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ma_jupyter.models import Event, Job, JobSpec, JobStatus
from ma_jupyter.service import history
from ma_jupyter.service.store import Store

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _add(store: Store, job_id: str, seconds: float | None, *, name="exp", creator="alice", status=None):
    started = T0 + timedelta(hours=len(job_id))
    job = Job(
        id=job_id,
        spec=JobSpec(name=name, command="python train.py", creator=creator),
        status=status or JobStatus.succeeded,
        started_at=started,
        finished_at=None if seconds is None else started + timedelta(seconds=seconds),
    )
    store.insert(job, Event(job_id=job_id, status=job.status, reason="x"))
    return job


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "jobs.db")


def test_the_typical_runtime_is_the_median_of_similar_succeeded_runs_with_a_confidence(store):
    running = _add(store, "r", None, status=JobStatus.running)
    assert history.typical_runtime(store, running) is None  # no history: unknown
    for i, seconds in enumerate((600, 620, 640)):
        _add(store, f"a{i}", seconds)
    _add(store, "other-name", 5, name="bert")  # not similar
    _add(store, "other-user", 5, creator="bob")
    _add(store, "failed", 5, status=JobStatus.error)
    typical = history.typical_runtime(store, running)
    assert (typical.seconds, typical.samples, typical.confidence) == (620, 3, "medium")
    assert typical.text() == "10m (median of 3 runs)"
    for i, seconds in enumerate((610, 630)):
        _add(store, f"b{i}", seconds)
    assert history.typical_runtime(store, running).confidence == "high"  # 5 runs, tight
    _add(store, "c", 5000)
    _add(store, "d", 20)
    assert history.typical_runtime(store, running).confidence == "low"  # spread out


def test_a_running_job_ends_at_its_start_plus_the_typical_runtime_or_now_once_past_it(store):
    for i, seconds in enumerate((100, 100, 100)):
        _add(store, f"a{i}", seconds)
    running = _add(store, "run", None, status=JobStatus.running)
    start = running.started_at.timestamp()
    end, typical = history.estimated_end(store, running, now=start + 10)
    assert end == start + 100 and typical.confidence == "medium"
    end, late = history.estimated_end(store, running, now=start + 500)
    assert end == start + 500 and late.confidence == "low"  # already past: it may end any moment
    assert history.weakest(["high", "low", "medium"]) == "low" and history.weakest([]) == "high"
