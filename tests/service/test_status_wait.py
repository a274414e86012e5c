"""The status long-poll ``GET /api/v1/jobs/{id}/status`` and ``JobHandle.wait`` built on it.

A real service process runs real jobs; the long-poll must answer as soon as the status changes
and must not hold up the service's other requests while it waits.
"""

from __future__ import annotations

import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ma_jupyter.models import JobStatus
from tests.helpers import wait_for

PY = sys.executable
SLEEPER = f"{PY} -c {shlex.quote('import time; print(1, flush=True); time.sleep(300)')}"


def _submit(svc, command: str) -> dict:
    r = svc.session().post(f"{svc.api}/jobs", json={"name": "waited", "command": command}, timeout=10)
    assert r.status_code == 201, r.text
    return r.json()


def _status(svc, job_id: str, **params) -> tuple[dict, float]:
    """One long-poll; (answer, seconds it took)."""
    started = time.monotonic()
    r = svc.session().get(f"{svc.api}/jobs/{job_id}/status", params=params, timeout=90)
    assert r.status_code == 200, r.text
    return r.json(), time.monotonic() - started


def test_status_long_poll_answers_at_the_change_without_blocking_the_service(ma_module_service):
    job = _submit(ma_module_service, SLEEPER)
    s = ma_module_service.session()
    # from queued: the answer comes when the job starts running
    if job["status"] == "queued":
        started, _ = _status(ma_module_service, job["id"], since="queued", wait=30)
        assert started["status"] == "running"
    wait_for(
        lambda: s.get(f"{ma_module_service.api}/jobs/{job['id']}", timeout=5).json()["status"] == "running"
    )

    # a status that does not change: the wait runs out and the job comes back unchanged
    same, took = _status(ma_module_service, job["id"], since="running", wait=1)
    assert same["status"] == "running" and same["id"] == job["id"]
    assert 0.9 <= took < 5
    # without ``since`` and without ``wait``: the job at once, like GET /jobs/{id}
    now, took = _status(ma_module_service, job["id"])
    assert now["status"] == "running" and took < 5

    with ThreadPoolExecutor(max_workers=2) as pool:
        until_changed = pool.submit(_status, ma_module_service, job["id"], since="running", wait=40)
        until_terminal = pool.submit(_status, ma_module_service, job["id"], wait=40)
        time.sleep(0.5)
        # the service answers other requests meanwhile
        for _ in range(5):
            started = time.monotonic()
            assert s.get(f"{ma_module_service.api}/specs", timeout=5).status_code == 200
            assert time.monotonic() - started < 2
        assert not until_changed.done() and not until_terminal.done()
        stop_sent = time.monotonic()
        assert s.post(f"{ma_module_service.api}/jobs/{job['id']}/stop", timeout=5).status_code == 200
        changed, _ = until_changed.result(timeout=60)
        terminal, _ = until_terminal.result(timeout=60)
        answered = time.monotonic()
    assert changed["status"] == terminal["status"] == "stopped"
    assert terminal["finished_at"] is not None
    # the answer follows the stop closely (the stop itself has a grace period, well below this)
    assert answered - stop_sent < 20

    # a terminal job answers at once whatever ``since`` says
    done, took = _status(ma_module_service, job["id"], since="stopped", wait=30)
    assert done["status"] == "stopped" and took < 5


def test_status_long_poll_errors_are_typed(ma_module_service):
    s = ma_module_service.session()
    missing = s.get(f"{ma_module_service.api}/jobs/no-such-job/status", params={"wait": 1}, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    job = _submit(ma_module_service, f"{PY} -c pass")
    too_long = s.get(f"{ma_module_service.api}/jobs/{job['id']}/status", params={"wait": 3600}, timeout=10)
    assert too_long.status_code == 400 and too_long.json()["field"] == "wait"
    bogus = s.get(f"{ma_module_service.api}/jobs/{job['id']}/status", params={"since": "sleepy"}, timeout=10)
    assert bogus.status_code == 400 and bogus.json()["field"] == "since"
    private = _submit(ma_module_service, f"{PY} -c pass")
    other = ma_module_service.user_session("someone-else")
    assert other.get(f"{ma_module_service.api}/jobs/{private['id']}/status", timeout=10).status_code == 200
    hidden = s.post(
        f"{ma_module_service.api}/jobs",
        json={"name": "hidden", "command": f"{PY} -c pass", "access": "none"},
        timeout=10,
    ).json()
    assert other.get(f"{ma_module_service.api}/jobs/{hidden['id']}/status", timeout=10).status_code == 404


def test_job_handle_wait_long_polls_the_status(ma_module_client, monkeypatch):
    calls: list[float] = []
    real = ma_module_client.wait_status

    def counted(job_id, since=None, wait=0):
        calls.append(wait)
        return real(job_id, since=since, wait=wait)

    monkeypatch.setattr(ma_module_client, "wait_status", counted)

    def no_log_reads(*args, **kwargs):
        raise AssertionError("wait() must not read the log")

    monkeypatch.setattr(ma_module_client, "read_log", no_log_reads)

    job = ma_module_client.submit(
        name="short", command=f"{PY} -c {shlex.quote('import time; time.sleep(2)')}"
    )
    started = time.monotonic()
    final = job.wait(timeout=60)
    took = time.monotonic() - started
    assert final.status is JobStatus.succeeded and job.info.status is JobStatus.succeeded
    # a couple of long-polls, not a busy loop
    assert 1 <= len(calls) <= 4, calls
    assert took < 30

    sleeper = ma_module_client.submit(name="sleeper", command=SLEEPER)
    wait_for(lambda: sleeper.status is JobStatus.running, timeout=30)
    calls.clear()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still running"):
        sleeper.wait(timeout=1.5)
    took = time.monotonic() - started
    assert 1.4 <= took < 5 and calls and max(calls) <= 1.5
    sleeper.stop()
    assert sleeper.wait(timeout=30).status is JobStatus.stopped
    # a terminal job needs no wait at all
    calls.clear()
    assert ma_module_client.job(sleeper.id).wait(timeout=0).status is JobStatus.stopped
    assert calls == []
