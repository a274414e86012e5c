"""Prepared data with real processes: a second job naming an unchanged source reuses the first
one's copy (no copy again), a changed source gets a fresh copy, an unused copy expires after
the admin's retention but never while a job uses it, and it can be removed early."""

from __future__ import annotations

import json
import os
import time

from tests.helpers import wait_for
from tests.service.test_service import full_log, pycmd, submit, wait_status

READ = "print('read', open('/workspace/dataset/private/d/x.txt').read(), flush=True)"


def _events(svc, job_id) -> list[str]:
    return [e["reason"] for e in svc.session().get(f"{svc.api}/jobs/{job_id}/events", timeout=10).json()]


def _data(svc) -> list[dict]:
    r = svc.session().get(f"{svc.api}/data", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _run(svc, data, script=READ, **extra) -> dict:
    job = submit(
        svc,
        command=pycmd(script),
        data_preparation=True,
        datasets=[{"name": "d", "path": str(data)}],
        **extra,
    )
    return job


def _dataset(tmp_path, size=1_500_000):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("hello")
    (data / "blob.bin").write_bytes(os.urandom(size))
    return data


def test_second_job_reuses_the_copy_and_a_change_makes_a_new_one(ma_service, ma_cli, tmp_path):
    data = _dataset(tmp_path)
    first = _run(ma_service, data)
    final = wait_status(ma_service, first["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    assert "read hello" in full_log(ma_service, first["id"])
    assert any("dataset d: prepared 1.5 MB in" in r for r in _events(ma_service, first["id"]))
    [entry] = _data(ma_service)
    assert entry["bytes"] == 1_500_005 and entry["files"] == 2 and entry["source"] == str(data.resolve())
    assert entry["jobs"] == []  # the job ended: nobody holds it
    copy = entry["path"]
    before = os.stat(os.path.join(copy, "blob.bin"))

    second = _run(ma_service, data)
    final = wait_status(ma_service, second["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    assert "read hello" in full_log(ma_service, second["id"])
    reasons = _events(ma_service, second["id"])
    assert any("dataset d: prepared data reused (1.5 MB)" in r for r in reasons), reasons
    assert not any("prepared 1.5 MB in" in r for r in reasons)
    after = os.stat(os.path.join(copy, "blob.bin"))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not copied again
    assert [e["key"] for e in _data(ma_service)] == [entry["key"]]

    # a job cannot name a copy itself to skip the rules on its source: the copy is in the home
    direct = ma_service.session().post(
        f"{ma_service.api}/jobs",
        json={"name": "peek", "command": "true", "datasets": [{"name": "d", "path": copy}]},
        timeout=10,
    )
    assert direct.status_code == 400 and "home" in direct.text, direct.text

    # the CLI lists it with its size
    listed = ma_cli("data", "list").stdout
    assert entry["key"] in listed and "1.5 MB" in listed and str(data.resolve()) in listed

    # a changed source is a new state: copied afresh, the old copy stays until it expires
    (data / "x.txt").write_text("changed")
    third = _run(ma_service, data)
    final = wait_status(ma_service, third["id"], {"succeeded", "error"}, timeout=120)
    assert "read changed" in full_log(ma_service, third["id"])
    assert any("dataset d: prepared 1.5 MB in" in r for r in _events(ma_service, third["id"]))
    assert len(_data(ma_service)) == 2

    # removed early by its key
    gone = json.loads(ma_cli("data", "rm", entry["key"], "--json").stdout)
    assert gone["key"] == entry["key"] and not os.path.exists(copy)
    assert entry["key"] not in [e["key"] for e in _data(ma_service)]
    missing = ma_service.session().delete(f"{ma_service.api}/data/{entry['key']}", timeout=10)
    assert missing.status_code == 404 and "data list" in missing.text


def test_retention_expires_unused_copies_but_never_one_in_use(ma_home, ma_service, tmp_path):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + "\n[data]\nretention = 2\n")  # re-read on each sweep
    data = _dataset(tmp_path, size=1000)
    # a job that keeps using the copy well past the retention
    slow = _run(ma_service, data, script=READ + "; import time; time.sleep(8)")
    wait_for(lambda: _data(ma_service) and _data(ma_service)[0]["jobs"] == [slow["id"]], timeout=120)
    [entry] = _data(ma_service)
    time.sleep(4)  # longer than the retention
    assert [e["key"] for e in _data(ma_service)] == [entry["key"]]  # held: kept
    busy = ma_service.session().delete(f"{ma_service.api}/data/{entry['key']}", timeout=10)
    assert busy.status_code == 409 and slow["id"] in busy.text
    final = wait_status(ma_service, slow["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    assert os.path.isdir(entry["path"])
    # unused now: gone once the retention has passed since its last use
    wait_for(lambda: _data(ma_service) == [], timeout=30, interval=0.5)
    assert not os.path.exists(entry["path"])


def test_a_bad_retention_is_named(ma_home, ma_service, tmp_path):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + '\n[data]\nretention = "soon"\n')
    r = ma_service.session().get(f"{ma_service.api}/data", timeout=10)
    assert r.status_code == 400 and "[data] retention" in r.text


def test_a_link_inside_a_dataset_is_copied_as_a_link_never_followed(tmp_path):
    from ma_jupyter.service.prepared import PreparedStore, source_key

    secret = tmp_path / "private" / "notes.txt"
    secret.parent.mkdir()
    secret.write_text("not for the job")
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.bin").write_bytes(b"a" * 10)
    (data / "x").symlink_to(secret)
    (data / "linked-dir").symlink_to(secret.parent)
    store = PreparedStore(tmp_path / "store")
    got = store.acquire("job-1", str(data), "bob")
    copy = got.path
    assert (copy / "sub" / "a.bin").read_bytes() == b"a" * 10
    # the links are links in the copy: nothing behind them was read with the service's rights
    assert (copy / "x").is_symlink() and os.readlink(copy / "x") == str(secret)
    assert (copy / "linked-dir").is_symlink()
    assert got.bytes == 10
    # what a link points to changes the key; what lies behind it does not
    before = source_key(str(data))[0]
    secret.write_text("changed behind the link")
    assert source_key(str(data))[0] == before
    (data / "x").unlink()
    (data / "x").symlink_to(tmp_path / "elsewhere")
    assert source_key(str(data))[0] != before
