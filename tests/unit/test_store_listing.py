"""A listing's page read in one query with its jobs given to ``each`` as the rows come, and the
parsed jobs it keeps: a job changed since the last listing is never shown as it was, the kept
jobs stay bounded, and a count of a user's jobs over every priority is one query's answer."""

from __future__ import annotations

from ma_jupyter.models import Event, Job, JobSpec, JobStatus, Priority, utcnow
from ma_jupyter.service import store as store_module
from ma_jupyter.service.store import Store


def _add(store: Store, i: int, priority: Priority = Priority.normal) -> Job:
    job = Job(
        id=f"j-{i:03d}",
        spec=JobSpec(name=f"n{i}", command="true", creator="ann", priority=priority),
        status=JobStatus.queued,
        created_at=utcnow(),
    )
    store.insert(job, Event(job_id=job.id, status=JobStatus.queued, reason="submitted"))
    return job


def test_listing_pages_fresh_jobs_and_bounds_what_it_keeps(tmp_path, monkeypatch):
    store = Store(tmp_path / "jobs.db")
    try:
        jobs = [_add(store, i) for i in range(25)]
        plain, total = store.list(limit=50)
        seen, total_each = store.list(limit=50, each=lambda job: (job.id, job.status))
        assert total == total_each == 25
        assert seen == [(j.id, j.status) for j in plain]  # same order, one query
        page, _ = store.list(offset=5, limit=12, each=lambda job: job.id)
        assert page == [j.id for j in plain][5:17]

        # a job that changed since it was listed is listed as it is now, not as it was kept
        store.save(jobs[3].model_copy(update={"status": JobStatus.running}))
        again = dict(store.list(limit=50, each=lambda job: (job.id, job.status))[0])
        assert again[jobs[3].id] is JobStatus.running
        assert again[jobs[4].id] is JobStatus.queued

        # what is kept stays within its bounds however many jobs are listed
        monkeypatch.setattr(store_module, "LISTED_KEPT", 4)
        store.save(jobs[5].model_copy(update={"reason": "changed"}))  # a job parsed anew
        store.list(limit=50, each=lambda job: job.id)
        assert len(store._listed) == 4
        monkeypatch.setattr(store_module, "LISTED_KEPT_CHARS", 4 * 1000)
        big = jobs[0].model_copy(update={"reason": "x" * 2000})  # over a kept job's share
        store.save(big)
        assert [j.reason for j in store.list(limit=50, each=lambda job: job)[0] if j.id == big.id] == [
            big.reason
        ]
        assert not any(big.reason in text for text in store._listed)  # not kept
        assert store._listed_chars == sum(len(text) for text in store._listed) <= 4 * 1000

        # the queued quota's count: every priority in one query
        _add(store, 100, Priority.urgent)
        queued = [JobStatus.queued]
        assert store.count_jobs("ann", queued, priority=None) == 25
        assert store.count_jobs("ann", queued, Priority.urgent.rank) == 1
    finally:
        store.engine.dispose()
