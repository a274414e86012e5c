"""What one user's jobs make the service hold and send: the listing gives bounded summaries
however large the specs, and a user's queued jobs and spec bytes are capped at submit.

The jobs stay queued (every node drained), so no test starts a process of its own."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from ma_jupyter.client import Client

#: what one listed job may take on the wire, whatever its spec holds
SUMMARY_BYTES = 2048


def _drain_all(svc) -> None:
    s = svc.session()
    for node in s.get(f"{svc.api}/nodes", timeout=10).json():
        r = s.post(
            f"{svc.api}/nodes/{node['name']}/drain", json={"reason": "test: jobs stay queued"}, timeout=10
        )
        assert r.status_code == 200, r.text


@pytest.fixture
def limits_home(ma_home):
    """``ma_home`` with tight per-user bounds (set before the service starts)."""
    cluster = ma_home / "cluster.toml"
    cluster.write_text(
        cluster.read_text() + "[limits]\nmax_queued_jobs_per_user = 3\nmax_spec_bytes = 65536\n"
    )
    return ma_home


def test_the_listing_of_jobs_with_large_specs_stays_small(ma_service, tmp_path):
    """300 jobs of 100 variables of 900 bytes (90 KB each): a page of them all is their
    summaries, a few hundred bytes each; the job's own read has its variables."""
    _drain_all(ma_service)
    s = ma_service.session()
    env = {f"VAR_{i}": "x" * 900 for i in range(100)}

    def submit(k: int) -> str:
        r = s.post(
            f"{ma_service.api}/jobs", json={"name": f"big-{k}", "command": "true", "env": env}, timeout=60
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]

    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(submit, range(300)))
    reply = s.get(f"{ma_service.api}/jobs", params={"limit": 500}, timeout=60)
    assert reply.status_code == 200
    page = reply.json()
    assert page["total"] == 300 and {j["id"] for j in page["items"]} == set(ids)
    for item in page["items"]:
        text = json.dumps(item)
        assert len(text) < SUMMARY_BYTES, (item["id"], len(text))
        assert "env" not in item["spec"] and "command" not in item["spec"] and "VAR_" not in text
    assert len(reply.content) < 300 * SUMMARY_BYTES  # was 300 × 90 KB
    # the listing front ends still have what they show
    first = page["items"][0]
    assert first["spec"]["name"].startswith("big-") and first["spec"]["specs"] and first["status"] == "queued"
    assert first["queue_position"] is not None and "stop" in first["allowed"]
    whole = s.get(f"{ma_service.api}/jobs/{first['id']}", timeout=10).json()
    assert whole["spec"]["env"] == env
    # a client's listed handle has the summary, and its whole job when asked for it
    client = Client(url=ma_service.url, token=ma_service.token, local_logs=False)
    handle = client.jobs(name=first["spec"]["name"], limit=500)[0]
    assert handle.summary is not None and not hasattr(handle.summary.spec, "env")
    assert handle.info.spec.env == env


def test_a_hostile_user_is_held_to_its_queued_jobs_and_spec_bytes(limits_home, ma_service):
    _drain_all(ma_service)
    mallory = ma_service.user_session("mallory")
    api = ma_service.api

    def submit(session, name, key=None, **fields):
        headers = {"Idempotency-Key": key} if key else {}
        body = {"name": name, "command": "true", **fields}
        return session.post(f"{api}/jobs", json=body, headers=headers, timeout=30)

    # a spec larger than max_spec_bytes is refused, whoever submits it, saying the limit
    huge = submit(mallory, "huge", env={f"V{i}": "y" * 900 for i in range(100)})
    assert huge.status_code == 413, huge.text[:300]
    assert huge.json()["error"] == "payload_too_large" and "max_spec_bytes of 65536" in huge.json()["message"]
    kept = [submit(mallory, f"q{k}", key=f"k{k}") for k in range(3)]
    assert [r.status_code for r in kept] == [201] * 3
    flood = submit(mallory, "q3")
    assert flood.status_code == 429, flood.text[:300]
    body = flood.json()
    assert body["error"] == "limit_reached" and body["field"] == "max_queued_jobs_per_user"
    assert (
        "mallory has 3 queued jobs" in body["message"] and "max_queued_jobs_per_user is 3" in body["message"]
    )
    # a retried submit (same key) is the job it made, never refused; other users are not held back
    again = submit(mallory, "q0", key="k0")
    assert again.status_code == 201 and again.json()["id"] == kept[0].json()["id"]
    assert submit(ma_service.user_session("alice"), "other").status_code == 201
    # nothing was made of the refused ones
    mine = mallory.get(f"{api}/jobs", params={"creator": "mallory"}, timeout=10).json()
    assert sorted(j["spec"]["name"] for j in mine["items"]) == ["q0", "q1", "q2"]
    # a stopped queued job frees a place
    assert mallory.post(f"{api}/jobs/{kept[0].json()['id']}/stop", timeout=10).status_code == 200
    assert submit(mallory, "q4").status_code == 201
    assert submit(mallory, "q5").status_code == 429
