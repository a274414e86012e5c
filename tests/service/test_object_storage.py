"""Object storage (``s3://``) as a job's dataset and outputs, against a real S3-compatible server
(moto's, a process of its own on a free loopback port, one for the module): the objects are
downloaded into the prepared store before the job starts and read inside the job; the user's
credentials never show in the job, its listing, events, logs or dry run; a missing prefix is
refused at the submit, naming the bucket; outputs are uploaded and a later job finds them."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import requests

from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import parse_spec
from tests.fixtures.service_api import full_log, job_of, pycmd, wait_status
from tests.helpers import wait_for

SECRET = "s3cr3t-Value-9f2e"
KEY_ID = "AKIDSTORAGETEST"


def _moto_server() -> list[str]:
    here = Path(sys.executable).parent / "moto_server"
    found = str(here) if here.exists() else shutil.which("moto_server")
    if found is None:
        pytest.fail("moto_server is missing: ./dev setup installs it (the test extra's moto[server])")
    return [found]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """The URL of an S3-compatible server for this module's tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen(
        [*_moto_server(), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return requests.get(f"{url}/moto-api/", timeout=2).status_code == 200
        except requests.RequestException:
            return proc.poll() is not None and pytest.fail("moto_server exited")

    wait_for(up, timeout=60)
    # the tests' own calls of objectstore: moto on loopback is trusted as allow_endpoints makes it
    from ma_jupyter import objectstore

    objectstore.trust_endpoints((url,))
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def _store(endpoint: str, bucket: str):
    from obstore.store import S3Store

    requests.put(f"{endpoint}/{bucket}", timeout=10).raise_for_status()
    return S3Store(
        bucket,
        config={
            "access_key_id": KEY_ID,
            "secret_access_key": SECRET,
            "endpoint": endpoint,
            "region": "us-east-1",
        },
        client_options={"allow_http": True},
    )


def allow(home: Path, endpoint: str) -> None:
    """The administrator's opt-in to a loopback endpoint: ``[storage] allow_endpoints``."""
    cluster = home / "cluster.toml"
    cluster.write_text(
        (cluster.read_text() if cluster.exists() else "") + f'\n[storage]\nallow_endpoints = ["{endpoint}"]\n'
    )


def _credentials(endpoint: str) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": endpoint}


READ = (
    "import os\n"
    "ckpt = '/workspace/outputs/ckpt/step.txt'\n"
    "print('found checkpoint:', open(ckpt).read() if os.path.exists(ckpt) else None, flush=True)\n"
    "os.makedirs(os.path.dirname(ckpt), exist_ok=True)\n"
    "open(ckpt, 'w').write(os.environ['STEP'])\n"
    "root = '/workspace/dataset/private/d'\n"
    "print('got', open(root + '/sub/a.txt').read(), len(os.listdir(root + '/many')), flush=True)\n"
    "print('env has secret:', any('s3cr3t' in v for v in os.environ.values()), flush=True)\n"
    "open(root + '/w', 'w')\n"
)


def test_s3_dataset_is_downloaded_read_and_its_credentials_never_shown(ma_service, s3_endpoint, tmp_path):
    import obstore

    store = _store(s3_endpoint, "data")
    obstore.put(store, "set/sub/a.txt", b"hello-from-s3")
    for i in range(40):
        obstore.put(store, f"set/many/{i}.bin", os.urandom(1000))
    # the moto server is on loopback: the administrator's opt-in lets the service reach it
    allow(Path(os.environ["MA_JUPYTER_HOME"]), s3_endpoint)
    s = ma_service.session()
    body = {
        "name": "s3read",
        "command": pycmd(READ),
        "datasets": [{"name": "d", "path": "s3://data/set"}],
        "outputs": "s3://out/run",
        "env": {"STEP": "step-1"},
        "storage_credentials": _credentials(s3_endpoint),
    }
    out = _store(s3_endpoint, "out")

    missing = s.post(
        f"{ma_service.api}/jobs",
        json={**body, "datasets": [{"name": "d", "path": "s3://data/nope"}]},
        timeout=60,
    )
    assert missing.status_code == 400, missing.text
    assert "bucket data" in missing.text and "s3://data/nope" in missing.text
    assert SECRET not in missing.text
    # a user's endpoint on the service's own network (the cloud's metadata, another loopback
    # port) is refused at the submit, before any request is sent there
    for hostile in ("http://169.254.169.254", "http://127.0.0.1:1", "http://10.0.0.1:9000"):
        ssrf = s.post(
            f"{ma_service.api}/jobs",
            json={**body, "storage_credentials": {**_credentials(s3_endpoint), "AWS_ENDPOINT_URL": hostile}},
            timeout=60,
        )
        assert ssrf.status_code == 400 and "allow_endpoints" in ssrf.text, ssrf.text
    region = {**_credentials(s3_endpoint), "AWS_REGION": "x.evil.example#"}
    bad = s.post(f"{ma_service.api}/jobs", json={**body, "storage_credentials": region}, timeout=60)
    assert bad.status_code == 400 and "is not a region" in bad.text, bad.text
    copied = s.post(  # a job copied from its JSON does not carry the credentials
        f"{ma_service.api}/jobs",
        json={**body, "storage_credentials": {**_credentials(s3_endpoint), "AWS_SECRET_ACCESS_KEY": "***"}},
        timeout=60,
    )
    assert copied.status_code == 400 and "storage_credentials" in copied.text, copied.text
    plan = s.post(f"{ma_service.api}/plan", json=body, timeout=60)
    assert plan.status_code == 200, plan.text
    assert "s3://data/set" in plan.text and SECRET not in plan.text

    job = s.post(f"{ma_service.api}/jobs", json=body, timeout=60)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    final = wait_status(ma_service, job_id, {"succeeded", "failed", "error"}, timeout=120)
    log = full_log(ma_service, job_id)
    assert "got hello-from-s3 40" in log, (final, log)
    assert "env has secret: False" in log  # only the data steps had them
    assert "found checkpoint: None" in log
    assert final["status"] == "error", final  # the job's last line writes to its read-only dataset
    assert bytes(obstore.get(out, "run/ckpt/step.txt").bytes()) == b"step-1"  # uploaded at its end
    assert "Read-only file system" in log  # mounted read-only
    events = s.get(f"{ma_service.api}/jobs/{job_id}/events", timeout=10).text
    assert "downloading s3://data/set" in events and "41 of 41 objects" in events, events
    shown = [
        events,
        log,
        s.get(f"{ma_service.api}/jobs/{job_id}", timeout=10).text,
        s.get(f"{ma_service.api}/jobs", timeout=10).text,
        s.get(f"{ma_service.api}/jobs/{job_id}/export", timeout=10).text,
    ]
    for text in shown:
        assert SECRET not in text and KEY_ID not in text
    assert job_of(ma_service, job_id)["spec"]["storage_credentials"]["AWS_SECRET_ACCESS_KEY"] == "***"

    # a second job of the same state reuses the download; --storage-env gives the job its credentials
    # and a later job of the same outputs prefix starts with its checkpoint
    body = {**body, "storage_env": True, "env": {"STEP": "step-2"}}
    again = s.post(f"{ma_service.api}/jobs", json=body, timeout=60).json()
    wait_status(ma_service, again["id"], {"succeeded", "failed", "error"}, timeout=120)
    log = full_log(ma_service, again["id"])
    assert "env has secret: True" in log and "found checkpoint: step-1" in log, log
    assert bytes(obstore.get(out, "run/ckpt/step.txt").bytes()) == b"step-2"
    reasons = s.get(f"{ma_service.api}/jobs/{again['id']}/events", timeout=10).text
    assert "dataset d: prepared data reused" in reasons, reasons
    # a dev environment of a job with storage credentials (its stored spec has them masked)
    dev = s.post(f"{ma_service.api}/jobs/{again['id']}/devenv", json={}, timeout=60)
    assert dev.status_code == 201, dev.text
    s.post(f"{ma_service.api}/jobs/{dev.json()['id']}/stop", timeout=30)
    wait_status(ma_service, dev.json()["id"], {"succeeded", "failed", "error", "stopped"}, timeout=120)

    # a job whose outputs cannot be uploaded at its end fails with the reason, though its command succeeded
    gate = tmp_path / "gate"
    gate.mkdir(mode=0o777)
    gate.chmod(0o777)
    wait_gate = (
        "import os, time\n"
        "open('/workspace/outputs/result.txt', 'w').write('r')\n"
        "deadline = time.time() + 120\n"
        "while not os.path.exists('/workspace/volume/g/go') and time.time() < deadline: time.sleep(0.05)\n"
    )
    gated = {
        "name": "s3gone",
        "command": pycmd(wait_gate),
        "outputs": "s3://gone/run",
        "volumes": [{"name": "g", "path": str(gate)}],
        "storage_credentials": _credentials(s3_endpoint),
    }
    _store(s3_endpoint, "gone")
    job = s.post(f"{ma_service.api}/jobs", json=gated, timeout=60).json()
    wait_status(ma_service, job["id"], {"running"}, timeout=120)
    requests.delete(f"{s3_endpoint}/gone", timeout=10).raise_for_status()  # the bucket goes away
    (gate / "go").write_text("")
    final = wait_status(ma_service, job["id"], {"succeeded", "failed", "error"}, timeout=120)
    assert final["status"] == "error", final
    assert "succeeded, but its outputs could not be uploaded to s3://gone/run" in final["reason"], final
    assert "bucket gone" in final["reason"] and SECRET not in final["reason"]


def test_download_resumes_and_never_takes_a_partial_object(s3_endpoint, tmp_path):
    import obstore

    from ma_jupyter import objectstore

    store = _store(s3_endpoint, "resume")
    for i in range(6):
        obstore.put(store, f"p/{i}.bin", bytes([i]) * (1000 + i))
    creds, uri = _credentials(s3_endpoint), objectstore.ObjectURI.parse("s3://resume/p")
    objects = objectstore.listing(uri, creds, s3_endpoint)
    into = tmp_path / "into"
    obstore.delete(store, "p/5.bin")  # gone after the listing: this download fails
    with pytest.raises(objectstore.StorageError, match="bucket resume"):
        objectstore.download(uri, objects, creds, s3_endpoint, into, parallel=1)
    assert not (into / "5.bin").exists()  # a failed object is never left as if complete
    kept = {p.name: p.stat().st_ino for p in into.glob("*.bin")}
    assert set(kept) == {f"{i}.bin" for i in range(5)}
    (into / "4.bin").write_bytes(b"cut")  # a partial object from an older download
    (into / "3.bin.part").write_bytes(b"half")
    obstore.put(store, "p/5.bin", bytes([5]) * 1005)
    seen = []
    objectstore.download(
        uri, objects, creds, s3_endpoint, into, progress=lambda s: seen.append(s.done_objects)
    )
    for i in range(6):
        assert (into / f"{i}.bin").read_bytes() == bytes([i]) * (1000 + i)
    assert (into / "0.bin").stat().st_ino == kept["0.bin"]  # complete ones were not fetched again
    assert seen[-1] == 6 and not list(into.glob("*.part"))


STOPPED = (
    "import os, signal, time\n"
    "out = '/workspace/outputs'\n"
    "ckpt = out + '/ckpt/last.txt'\n"
    "attempt = os.environ.get('MA_ATTEMPT')\n"
    "print('attempt', attempt, 'found', open(ckpt).read() if os.path.exists(ckpt) else None, flush=True)\n"
    "if attempt != '0': raise SystemExit(0)\n"
    "open(out + '/progress.txt', 'w').write('p')\n"
    "def save(signum, frame):\n"
    "    os.makedirs(os.path.dirname(ckpt), exist_ok=True)\n"
    "    open(ckpt, 'w').write('saved-on-sigterm')\n"
    "    print('checkpoint written', flush=True)\n"
    "signal.signal(signal.SIGTERM, save)\n"
    "deadline = time.time() + 300\n"  # it lives on in the grace period until the test's gate
    "while not os.path.exists('/workspace/volume/g/go') and time.time() < deadline: time.sleep(0.05)\n"
    "print('leaving', flush=True)\n"
)


def test_outputs_are_uploaded_while_running_and_in_the_grace_period_then_resumed(
    request, ma_home, s3_endpoint, tmp_path
):
    """Rules 4 and 5 of ``service/storage.py``: the periodic upload (a tiny ``upload_interval``)
    puts a file while the job runs; a checkpoint resume's requeue (its node drained) sends
    SIGTERM, and the checkpoint the job writes then is in the bucket while the job is still in
    its grace period; the machine's copy lost, the resumed attempt starts with the bucket's."""
    import obstore

    from tests.fixtures.service_api import service_with

    svc = service_with(
        request, ma_home, f'\n[storage]\nupload_interval = 0.3\nallow_endpoints = ["{s3_endpoint}/"]\n'
    )
    out = _store(s3_endpoint, "ckpt")
    gate = tmp_path / "gate"
    gate.mkdir(mode=0o777)
    gate.chmod(0o777)
    s = svc.session()
    job = s.post(
        f"{svc.api}/jobs",
        json={
            "name": "s3resume",
            "command": pycmd(STOPPED),
            "outputs": "s3://ckpt/run",
            "volumes": [{"name": "g", "path": str(gate)}],
            "checkpoint_resume": {"grace_period": 300},
            "storage_credentials": _credentials(s3_endpoint),
        },
        timeout=60,
    )
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    host = wait_status(svc, job_id, {"running"}, timeout=120)["nodes"][0]["host"]

    def in_bucket(key: str) -> bytes | None:
        try:
            return bytes(obstore.get(out, key).bytes())
        except FileNotFoundError:
            return None

    wait_for(lambda: in_bucket("run/progress.txt") == b"p", timeout=60)  # the periodic upload
    assert job_of(svc, job_id)["status"] == "running"

    drained = s.post(f"{svc.api}/nodes/{host}/drain", json={"reason": "test"}, timeout=10)
    assert drained.status_code == 200, drained.text
    try:
        wait_for(lambda: "checkpoint written" in full_log(svc, job_id), timeout=120)
        # uploaded during the grace period: the job still runs (it leaves only through the gate)
        wait_for(lambda: in_bucket("run/ckpt/last.txt") == b"saved-on-sigterm", timeout=60)
        assert "leaving" not in full_log(svc, job_id)
        # the machine is lost: its copy of the checkpoint is gone, the bucket's remains
        local = ma_home / "jobs" / job_id / "outputs" / "ckpt" / "last.txt"
        assert local.read_text() == "saved-on-sigterm"
        local.unlink()
        (gate / "go").write_text("")
        wait_for(lambda: (j := job_of(svc, job_id))["status"] == "queued" and j["attempt"] == 1, timeout=120)
    finally:
        (gate / "go").write_text("")  # never left waiting, whatever failed
        assert s.post(f"{svc.api}/nodes/{host}/undrain", timeout=10).status_code == 200
    final = wait_status(svc, job_id, {"succeeded", "failed", "error"}, timeout=120)
    assert final["status"] == "succeeded", final
    assert "attempt 1 found saved-on-sigterm" in full_log(svc, job_id)


def test_the_submits_listing_stands_for_the_start_only_briefly_and_for_its_credentials(
    s3_endpoint, monkeypatch
):
    """objectstore rule 1a: the submit's complete listing is reused at the start (no second
    listing: an object deleted in between is still listed), only with the same credentials and
    only within ``LISTING_REUSE``; a prefix past the submit's one page is not remembered."""
    import obstore

    from ma_jupyter import objectstore

    monkeypatch.setattr(objectstore, "LISTING_REUSE", 3600.0)  # never stale under any load
    store = _store(s3_endpoint, "reuse")
    for i in range(3):
        obstore.put(store, f"p/{i}.bin", b"x")
    creds, uri = _credentials(s3_endpoint), objectstore.ObjectURI.parse("s3://reuse/p")
    objectstore.check_readable(uri, creds, s3_endpoint, "dataset d")
    obstore.delete(store, "p/2.bin")
    names = [o.relative for o in objectstore.listing(uri, creds, s3_endpoint, reuse=True)]
    assert names == ["0.bin", "1.bin", "2.bin"]  # the submit's
    other = {**creds, "AWS_SESSION_TOKEN": "another-user"}  # moto ignores it; the listing differs
    assert len(objectstore.listing(uri, other, s3_endpoint, reuse=True)) == 2
    assert len(objectstore.listing(uri, creds, s3_endpoint)) == 2  # reuse is asked for, never implied
    monkeypatch.setattr(objectstore, "LISTING_REUSE", 0.0)
    assert len(objectstore.listing(uri, creds, s3_endpoint, reuse=True)) == 2  # expired
    monkeypatch.setattr(objectstore, "LISTING_REUSE", 3600.0)
    monkeypatch.setattr(objectstore, "_PAGE", 2)  # a prefix past one page: listed again at the start
    # 0.bin is not known here, so the check waits for its listing (rule 1b would return after
    # a HEAD, and the first submit's listing would stand until that listing ends: a race)
    objectstore._known.clear()
    objectstore.check_readable(uri, creds, s3_endpoint, "dataset d")  # 2 objects: more than 1
    obstore.delete(store, "p/1.bin")
    assert len(objectstore.listing(uri, creds, s3_endpoint, reuse=True)) == 1


def test_a_known_prefixs_check_waits_for_one_head_and_the_start_for_its_listing(s3_endpoint, monkeypatch):
    """objectstore rule 1b: a prefix listed before with the same credentials is checked at the
    submit by a HEAD of its first object, not by waiting for the listing (held here until the
    check returned: waiting for it would fail the check); the start takes a listing that still
    stands, else waits for that submit's listing and takes it, listing nothing itself; a prefix
    emptied since is still refused."""
    import threading

    import obstore

    from ma_jupyter import objectstore

    monkeypatch.setattr(objectstore, "LISTING_REUSE", 3600.0)  # never stale under any load
    monkeypatch.setattr(objectstore, "CHECK_TIMEOUT", 5.0)  # a check that waited fails sooner
    store = _store(s3_endpoint, "known")
    for i in range(3):
        obstore.put(store, f"p/{i}.bin", b"x")
    creds, uri = _credentials(s3_endpoint), objectstore.ObjectURI.parse("s3://known/p")
    objectstore.check_readable(uri, creds, s3_endpoint, "dataset d")  # listed: 0.bin is known

    held, listed = threading.Event(), []
    real = objectstore.listing

    def held_listing(*args, **kwargs):
        if not kwargs.get("reuse"):
            listed.append(args[0])
            held.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(objectstore, "listing", held_listing)
    objectstore.check_readable(uri, creds, s3_endpoint, "dataset d")  # returns with its listing held
    obstore.delete(store, "p/2.bin")
    # the first submit's listing stands (rule 1a): the start waits for nothing
    names = [o.relative for o in objectstore.listing(uri, creds, s3_endpoint, reuse=True)]
    assert names == ["0.bin", "1.bin", "2.bin"], names
    # none stands: the start waits for the held one (it never lists by itself meanwhile)
    objectstore._recent.clear()
    got: list = []
    start = threading.Thread(target=lambda: got.append(real(uri, creds, s3_endpoint, reuse=True)))
    start.start()
    start.join(0.5)
    assert start.is_alive() and not got, got
    held.set()
    start.join(60)
    assert [o.relative for o in got[0]] == ["0.bin", "1.bin"] and len(listed) == 1, (got, listed)

    monkeypatch.setattr(objectstore, "listing", real)
    for i in range(2):
        obstore.delete(store, f"p/{i}.bin")
    with pytest.raises(InvalidSpec, match="does not exist"):  # the HEAD fails: the listing decides
        objectstore.check_readable(uri, creds, s3_endpoint, "dataset d")


def test_the_grace_periods_upload_rounds_never_run_on_without_bound(s3_endpoint, tmp_path, monkeypatch):
    """``service/storage.py`` rule 5's bound: a stop that never reaches its final upload (it
    failed before) leaves no upload rounds running past the grace period and the margin; the
    rounds up to then put what the job wrote."""
    import threading
    from types import SimpleNamespace

    import obstore

    from ma_jupyter.service import storage

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
    allow(tmp_path, s3_endpoint)
    monkeypatch.setattr(storage, "GRACE_MARGIN", 0.0)
    bucket = _store(s3_endpoint, "rounds")
    job = SimpleNamespace(id="rounds-job", spec=SimpleNamespace(outputs="s3://rounds/run"))
    folder = tmp_path / "jobs" / job.id / "outputs"
    folder.mkdir(parents=True)
    (folder / "ckpt").write_text("c")
    uploads = storage.Uploads(lambda job_id: _credentials(s3_endpoint))
    uploads.stopping(job, 0.5)
    wait_for(lambda: not any(t.name == f"ma-upload-stop-{job.id}" for t in threading.enumerate()), timeout=60)
    assert bytes(obstore.get(bucket, "run/ckpt").bytes()) == b"c"
    assert uploads.final(job) is None  # nothing changed since: the final upload still answers


def test_a_hostile_jobs_links_and_a_hostile_endpoint_never_reach_the_hosts_files(
    s3_endpoint, tmp_path, monkeypatch
):
    """The job (attempt 1) leaves links in its outputs folder and the user's bucket names them:
    the resume's download (as root) writes through none of them, and its chown follows none; an
    upload never reads through a folder the job swapped for a link after the walk; an endpoint
    that sends more than it listed is cut off at the listed size."""
    import obstore

    from ma_jupyter import objectstore
    from ma_jupyter.service import storage

    store = _store(s3_endpoint, "hostile")
    for key in ("out/x", "out/y", "out/d/evil", "out/big"):
        obstore.put(store, key, b"from-the-bucket" * (70_000 if key == "out/big" else 1))
    creds, uri = _credentials(s3_endpoint), objectstore.ObjectURI.parse("s3://hostile/out")
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    victim, preload = host / "shadow", host / "ld.so.preload"
    victim.write_text("host-secret")
    preload.write_text("host")
    out = tmp_path / "job" / "outputs"
    out.mkdir(parents=True)
    (out / "x.part").symlink_to(preload)  # ln -s /etc/ld.so.preload outputs/x.part
    (out / "y").symlink_to(victim)
    (out / "d").symlink_to(host / "etc")  # ln -s /etc outputs/d
    (out / "l").symlink_to(victim)
    objects = objectstore.listing(uri, creds, s3_endpoint)
    by = {o.relative: o for o in objects}
    objectstore.download(uri, [by["x"], by["y"]], creds, s3_endpoint, out)
    assert preload.read_text() == "host" and victim.read_text() == "host-secret"
    assert (out / "x").read_bytes() == (out / "y").read_bytes() == b"from-the-bucket"
    assert not (out / "y").is_symlink()
    with pytest.raises(objectstore.StorageError, match="link or not a folder"):
        objectstore.download(uri, [by["d/evil"]], creds, s3_endpoint, out)
    assert list((host / "etc").iterdir()) == []

    # an endpoint that sends more than it listed: cut off at the listed size, not after the stream
    short = objectstore.Obj("big", 10, "", "", "out/big")
    with pytest.raises(objectstore.StorageError, match="more than the 10 bytes listed"):
        objectstore.download(uri, [short], creds, s3_endpoint, out)
    assert (out / "big.part").stat().st_size <= 10

    # the chown of download_outputs: through no link (the job's account gets its folder's files)
    monkeypatch.setattr(storage.config, "outputs_folder", lambda job_id, outputs: str(out))
    monkeypatch.setattr(storage, "endpoint", lambda uri, credentials: s3_endpoint)
    spec = parse_spec({"name": "h", "command": "true", "outputs": "s3://hostile/out/x"})
    account = types.SimpleNamespace(uid=4321, gid=4321)
    storage.download_outputs("j1", spec, creds, account)
    assert victim.stat().st_uid == 0 and (host / "etc").stat().st_uid == 0
    assert (out / "x").stat().st_uid == 4321 and out.stat().st_uid == 4321

    # the upload: the job swaps a folder for a link to the host's between the walk and the open
    (out / "sub").mkdir()
    (out / "sub" / "shadow").write_text("job's own")
    walk = objectstore._files

    def swapped(folder):
        found = walk(folder)
        (out / "sub" / "shadow").unlink()
        (out / "sub").rmdir()
        (out / "sub").symlink_to(host)
        return found

    monkeypatch.setattr(objectstore, "_files", swapped)
    sent: dict = {}
    objectstore.upload(out, objectstore.ObjectURI.parse("s3://hostile/up"), creds, s3_endpoint, sent)
    assert "sub/shadow" not in sent and "x" in sent
    listed = {
        o.relative
        for o in objectstore.listing(objectstore.ObjectURI.parse("s3://hostile/up"), creds, s3_endpoint)
    }
    assert "sub/shadow" not in listed and "x" in listed


def test_the_final_upload_is_never_overwritten_by_an_older_periodic_one(s3_endpoint, tmp_path, monkeypatch):
    """A periodic upload whose put of an older checkpoint is still in flight when the attempt
    ends: the final upload waits for it and puts no earlier, so the bucket ends with the newest."""
    import threading
    from types import SimpleNamespace

    import obstore

    from ma_jupyter.service import storage

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
    allow(tmp_path, s3_endpoint)
    bucket = _store(s3_endpoint, "final")
    job = SimpleNamespace(id="final-job", spec=SimpleNamespace(outputs="s3://final/run"))
    folder = tmp_path / "jobs" / job.id / "outputs"
    folder.mkdir(parents=True)
    (folder / "ckpt").write_text("old")
    real_put, gate, started, order = obstore.put, threading.Event(), threading.Event(), []

    def put(store, key, f, **kw):
        data = f.read()
        if data == b"old":
            started.set()
            gate.wait(60)  # the older put is slow (a large checkpoint on a slow link)
        order.append(data)
        return real_put(store, key, data, **kw)

    monkeypatch.setattr(obstore, "put", put)
    uploads = storage.Uploads(lambda job_id: _credentials(s3_endpoint))
    periodic = threading.Thread(target=uploads.upload, args=(job,))
    periodic.start()
    assert started.wait(60)
    (folder / "ckpt").write_text("newest")  # written on the stop signal
    answer: list = []
    final = threading.Thread(target=lambda: answer.append(uploads.final(job)))
    final.start()

    def final_waits() -> bool:  # the final upload began (or, wrongly, ended) while the old put runs
        cancel = getattr(uploads, "_cancel", {}).get(job.id)
        return not final.is_alive() or (cancel is not None and cancel.is_set())

    wait_for(final_waits, timeout=60)
    gate.set()
    final.join(120)
    periodic.join(120)
    assert answer == [None] and order[-1] == b"newest", order
    assert bytes(obstore.get(bucket, "run/ckpt").bytes()) == b"newest"


def test_a_submit_naming_many_slow_prefixes_is_checked_within_one_deadline(tmp_path, monkeypatch):
    """A hostile user names many prefixes on an endpoint of their own that answers each listing
    slowly (yet within the request timeout): the submit's checks run a few at a time and are
    refused at one deadline for them all, not one timeout per prefix after the other."""
    import http.server
    import threading

    from ma_jupyter.service import storage

    listing = (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
        '2006-03-01/"><Name>b</Name><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false'
        "</IsTruncated><Contents><Key>{prefix}a</Key><LastModified>2020-01-01T00:00:00.000Z</LastModified>"
        '<ETag>"e"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>'
    )
    release = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            release.wait(2.0)  # slow, within the request timeout
            prefix = self.path.partition("prefix=")[2].partition("&")[0].replace("%2F", "/")
            body = listing.format(prefix=prefix).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
        allow(tmp_path, url)
        monkeypatch.setattr(storage, "SUBMIT_CHECK_TIMEOUT", 1.5, raising=False)
        spec = parse_spec(
            {
                "name": "many",
                "command": "true",
                "datasets": [{"name": f"d{i}", "path": f"s3://b/p{i}"} for i in range(8)],
                "storage_credentials": {**_credentials(url)},
            }
        )
        with pytest.raises(InvalidSpec, match="took more than 2 s"):
            storage.check_paths(spec)
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_a_prepared_copy_is_shared_only_by_credentials_of_the_same_identity(s3_endpoint, tmp_path):
    """Another user, whose credentials may list the prefix but not read its objects (per-object
    permissions), never gets the copy that the first user's credentials downloaded."""
    import obstore

    from ma_jupyter import objectstore
    from ma_jupyter.service.prepared import PreparedStore

    store = _store(s3_endpoint, "shared")
    obstore.put(store, "set/a.txt", b"private")
    uri = objectstore.ObjectURI.parse("s3://shared/set")
    owner, other = _credentials(s3_endpoint), {**_credentials(s3_endpoint), "AWS_ACCESS_KEY_ID": "AKIDOTHER"}
    copies = PreparedStore(tmp_path / "prepared")
    first = copies.acquire_objects("j1", uri, owner, s3_endpoint, "alice")
    assert not first.reused and (first.path / "a.txt").read_bytes() == b"private"
    theirs = copies.acquire_objects("j2", uri, other, s3_endpoint, "mallory")
    assert not theirs.reused and theirs.path != first.path  # downloaded with their own credentials
    again = copies.acquire_objects("j3", uri, owner, s3_endpoint, "alice")
    assert again.reused and again.path == first.path


class OneObjectEndpoint:
    """An S3 endpoint on loopback whose bucket ``bucket`` holds one object ``p/0.bin``: a
    ``HEAD`` always answers; a listing answers while ``listable`` is set (403 AccessDenied
    otherwise) and waits for ``release`` while ``slow`` is set.  ``listings`` counts them."""

    def __init__(self, bucket: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.listable, self.slow, self.release = threading.Event(), threading.Event(), threading.Event()
        self.listable.set()
        self.listings: list[int] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):  # every object is there and readable
                self.send_response(200)
                for name, value in (
                    ("Content-Length", "1"),
                    ("ETag", '"e"'),
                    ("Last-Modified", "Mon, 07 Dec 2026 00:00:00 GMT"),
                ):
                    self.send_header(name, value)
                self.end_headers()

            def do_GET(self):
                endpoint.listings.append(1)
                if endpoint.slow.is_set():
                    endpoint.release.wait(60)
                if endpoint.listable.is_set():
                    status, body = (
                        200,
                        (
                            f'<?xml version="1.0"?><ListBucketResult><Name>{bucket}</Name><KeyCount>1</KeyCount>'
                            "<IsTruncated>false</IsTruncated><Contents><Key>p/0.bin</Key><Size>1</Size>"
                            '<ETag>"e"</ETag><LastModified>2026-12-07T00:00:00.000Z</LastModified></Contents>'
                            "</ListBucketResult>"
                        ),
                    )
                else:
                    status, body = 403, "<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_known_prefix_no_longer_listable_fails_its_start_clearly_and_its_next_submit(monkeypatch):
    """objectstore rule 1b, the hostile side: an endpoint that still answers the first object's
    HEAD but refuses the listing now (the user's listing right revoked).  The submit right after
    passes on the HEAD (the rule's bounded staleness), and its start fails with the bucket and
    the endpoint's refusal; the next submit is refused at once, not accepted to fail again at
    its start."""
    from ma_jupyter import objectstore
    from ma_jupyter.errors import StorageError

    endpoint = OneObjectEndpoint("revoked")
    listable = endpoint.listable
    try:
        url = endpoint.url
        objectstore.trust_endpoints((url,))
        monkeypatch.setattr(objectstore, "LISTING_REUSE", 3600.0)
        creds, uri = _credentials(url), objectstore.ObjectURI.parse("s3://revoked/p")
        objectstore.check_readable(uri, creds, url, "dataset d")  # listed: p/0.bin is known
        objectstore._recent.clear()  # that listing is long past (rule 1a's seconds)
        listable.clear()
        objectstore.check_readable(uri, creds, url, "dataset d")  # passes on the HEAD
        with pytest.raises(StorageError, match="revoked.*AccessDenied|AccessDenied.*revoked"):
            objectstore.listing(uri, creds, url, reuse=True)  # the start: the listing's verdict
        with pytest.raises(InvalidSpec, match="dataset d: .*revoked"):
            objectstore.check_readable(uri, creds, url, "dataset d")
    finally:
        endpoint.close()


def test_submits_in_a_loop_on_a_known_prefix_share_one_listing_of_a_slow_endpoint(monkeypatch):
    """objectstore rule 1b, the hostile side: each submit of a known prefix passes on its HEAD
    while the listing goes on; a user submitting in a loop against their own endpoint that
    answers listings slowly must not leave one waiting thread per submit."""
    import threading

    from ma_jupyter import objectstore

    endpoint = OneObjectEndpoint("loop")
    try:
        url = endpoint.url
        objectstore.trust_endpoints((url,))
        creds, uri = _credentials(url), objectstore.ObjectURI.parse("s3://loop/p")
        objectstore.check_readable(uri, creds, url, "dataset d")  # listed: p/0.bin is known
        endpoint.slow.set()
        for _ in range(20):  # each passes on the HEAD while the listing hangs
            objectstore.check_readable(uri, creds, url, "dataset d")
        checking = [t for t in threading.enumerate() if t.name == "ma-storage-check"]
        assert len(checking) == 1, f"{len(checking)} listings of one prefix at once"
        # the shared listing's request reaches the endpoint on its own thread, maybe after the
        # submits returned: wait for it, then it must be the only one
        wait_for(lambda: len(endpoint.listings) >= 2, timeout=30)
        assert len(endpoint.listings) == 2
    finally:
        endpoint.close()


def test_an_obs_uri_is_reached_at_the_clusters_obs_endpoint(s3_endpoint, tmp_path, monkeypatch):
    """``obs://`` (OBS's S3-compatible API) without the user's ``AWS_ENDPOINT_URL``: refused at
    the submit until the administrator names ``[storage] obs_endpoint``, then checked, listed and
    downloaded there (an administrator's endpoint on loopback, named by another spelling than
    the module's trusted one, so only the setting lets it through the endpoint guard)."""
    import obstore

    from ma_jupyter import objectstore
    from ma_jupyter.service import storage

    store = _store(s3_endpoint, "obsdata")
    obstore.put(store, "set/a.txt", b"from-obs")
    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
    creds = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}

    def spec(path: str):
        return parse_spec(
            {
                "name": "obs",
                "command": "true",
                "datasets": [{"name": "d", "path": path}],
                "storage_credentials": creds,
            }
        )

    with pytest.raises(InvalidSpec, match=r"obs:// needs an endpoint.*\[storage\] obs_endpoint"):
        storage.check_paths(spec("obs://obsdata/set"))
    obs_endpoint = s3_endpoint.replace("127.0.0.1", "localhost")
    (tmp_path / "cluster.toml").write_text(f'[storage]\nobs_endpoint = "{obs_endpoint}"\n')
    storage.check_paths(spec("obs://obsdata/set"))
    with pytest.raises(InvalidSpec, match="bucket obsdata") as missing:
        storage.check_paths(spec("obs://obsdata/nope"))
    assert "obs://obsdata/nope" in str(missing.value) and SECRET not in str(missing.value)
    uri = objectstore.ObjectURI.parse("obs://obsdata/set")
    at = storage.endpoint(uri, creds)
    assert at == obs_endpoint and not objectstore.guarded(at)
    objects = objectstore.listing(uri, creds, at)
    objectstore.download(uri, objects, creds, at, tmp_path / "into")
    assert (tmp_path / "into" / "a.txt").read_bytes() == b"from-obs"


def test_a_ray_nodes_download_keeps_its_disks_reserve_free(s3_endpoint, tmp_path):
    """``backends/ray/objects.py`` rule 6, the agent's own function (no Ray needed): before a
    Ray node downloads a dataset into its cache or an outputs prefix into a job folder, what it
    still has to fetch must leave ``[limits] disk_reserve_mb`` free on that disk: more than the
    disk could ever take is refused, more than it has free now is ``DiskFull`` (the job waits),
    and neither writes anything; with room, the download runs."""
    import obstore

    from ma_jupyter import objectstore
    from ma_jupyter.backends.base import ObjectFetch
    from ma_jupyter.backends.ray import objects
    from ma_jupyter.errors import DiskFull

    store = _store(s3_endpoint, "roomy")
    for i in range(3):
        obstore.put(store, f"set/{i}.bin", os.urandom(4000))
    creds = _credentials(s3_endpoint)
    node_root = tmp_path / "node"

    def fetch(reserve: int, what: str = "datasets d", into: str = "prepared/private-d-") -> list[str]:
        item = ObjectFetch(what, "s3://roomy/set", s3_endpoint, into, True, reserve)
        return objects.fetch(str(node_root), "job-room", [item], creds, None)

    with pytest.raises(InvalidSpec, match=r"datasets d: s3://roomy/set holds 0\.0 MB .* disk_reserve_mb"):
        fetch(shutil.disk_usage(tmp_path).total)
    with pytest.raises(DiskFull, match=r"downloading s3://roomy/set .* disk reserve"):
        fetch(shutil.disk_usage(tmp_path).free + (256 << 20))
    with pytest.raises(DiskFull, match=r"outputs: downloading s3://roomy/set"):
        fetch(shutil.disk_usage(tmp_path).free + (256 << 20), "outputs", "outputs")
    # nothing was fetched (a key's lock file, empty, is no copy)
    assert [p for p in node_root.rglob("*") if p.is_file() and p.suffix != ".lock"] == []
    assert "downloaded" in fetch(0)[-1]
    copy = (node_root / "job-room" / "prepared" / "private-d-").resolve()
    listed = objectstore.listing(objectstore.ObjectURI.parse("s3://roomy/set"), creds, s3_endpoint)
    assert objectstore.missing_bytes(listed, copy) == 0
    (copy / "1.bin").unlink()  # what a resumed download would still fetch: that object only
    assert objectstore.missing_bytes(listed, copy) == 4000


def test_a_ray_nodes_copy_held_by_a_running_job_outlives_the_retention_and_then_goes(s3_endpoint, tmp_path):
    """``backends/ray/objects.py`` rule 4, the agent's own function (no Ray needed), as another
    job's fetch on the same Ray machine: job A's dataset copy, older than the retention and
    past its fetch's grace, is not removed while a node of A runs there (a real process, its
    run record as the agent writes it); a run record naming another live process does not hold
    it; once A's node has ended, its hold is dropped and the retention counts from then; an
    unheld copy is then kept for the retention the service sent (``[data] retention``) and
    removed past it."""
    import time

    import obstore

    from ma_jupyter.backends.base import ObjectFetch
    from ma_jupyter.backends.ray import objects
    from ma_jupyter.models import NodeRun
    from ma_jupyter.nodehost.procfs import process_start_time

    store = _store(s3_endpoint, "held")
    obstore.put(store, "a/x.bin", b"job a's data")
    obstore.put(store, "b/y.bin", b"job b's data")
    creds = _credentials(s3_endpoint)
    node_root = tmp_path / "node"

    def fetch(job: str, prefix: str, retention: float | None) -> None:
        item = ObjectFetch(
            f"datasets {prefix}",
            f"s3://held/{prefix}",
            s3_endpoint,
            "prepared/private-d-",
            True,
            0,
            retention,
        )
        objects.fetch(str(node_root), job, [item], creds, None)

    fetch("job-a", "a", 60.0)
    copy = (node_root / "job-a" / "prepared" / "private-d-").resolve()
    entry = copy.parent
    hold = entry / "holds" / "job-a"
    assert hold.exists() and (copy / "x.bin").read_bytes() == b"job a's data"
    # A's node: a real process in its node folder, recorded as the agent records a launch
    folder = node_root / "job-a" / "nodes" / "worker-0"
    folder.mkdir(parents=True)
    node = subprocess.Popen(["sleep", "600"], cwd=folder)
    try:
        run = NodeRun(name="worker-0", pid=node.pid, start_time=process_start_time(node.pid), state="running")
        (folder / "run.json").write_text(run.model_dump_json())
        # a record naming a process that runs, but is no runner of A: it holds nothing
        impostor = node_root / "job-a" / "nodes" / "worker-1"
        impostor.mkdir()
        pid1 = NodeRun(name="worker-1", pid=1, start_time=process_start_time(1), state="running")
        (impostor / "run.json").write_text(pid1.model_dump_json())
        now = time.time()
        os.utime(hold, (now - 7200 - 60, now - objects.LAUNCH_GRACE - 60))
        os.utime(entry, (now - 8 * 86400, now - 8 * 86400))  # past 60 s and past 7 days
        fetch("job-b", "b", 60.0)
        assert hold.exists() and (copy / "x.bin").read_bytes() == b"job a's data", "swept under a running job"
    finally:
        node.kill()
        node.wait()
    fetch("job-b", "b", 60.0)  # A's node ended: its hold goes, the retention counts from now
    assert not hold.exists() and (copy / "x.bin").exists()
    now = time.time()
    os.utime(entry, (now - 120, now - 120))
    fetch("job-b", "b", None)  # the service could not read its retention: nothing goes for its age
    fetch("job-b", "b", 3600.0)
    assert (copy / "x.bin").exists()
    fetch("job-b", "b", 60.0)  # the admin's retention, as the service sent it
    assert not entry.exists()
    assert (node_root / "job-b" / "prepared" / "private-d-" / "y.bin").read_bytes() == b"job b's data"


def test_the_ray_nodes_fetch_is_sent_the_services_data_retention(fake_sup, ma_home):
    """Data preparation's side of ``backends/ray/objects.py`` rule 4: each download request to a
    backend that fetches on its own machines carries ``[data] retention`` of the service's
    ``cluster.toml`` as it is at that request (the agents read none), and None when the value
    cannot be read (the agents then remove nothing for its age)."""
    import threading

    from ma_jupyter.service.preparation import _Preparing, _Saying

    sent: list = []

    def fetch_objects(job_id, hosts, fetches, credentials, account, cancel, say):
        sent.append([f.retention for f in fetches])
        return True

    fake_sup.backend.fetch_objects = fetch_objects
    dataset = types.SimpleNamespace(
        path="s3://bkt/data", name="d", source=types.SimpleNamespace(value="private"), version=None
    )
    spec = types.SimpleNamespace(datasets=[dataset], models=[], outputs="s3://bkt/out", creator=None)
    placement = types.SimpleNamespace(tasks=[types.SimpleNamespace(host="node-a")])
    prep = _Preparing(placement, spec, threading.Event(), _Saying(), threading.Lock())
    cluster = ma_home / "cluster.toml"
    base = cluster.read_text()
    fake_sup.store.storage_secrets = lambda job_id: {"AWS_ENDPOINT_URL": "http://8.8.8.8:9000"}
    for retention in ('"90s"', '"2h"', '"a while"'):
        cluster.write_text(base + f"\n[data]\nretention = {retention}\n")
        assert fake_sup.preparation._fetch_on_nodes("job-keep", prep) is True
    assert sent == [[90.0, 90.0], [7200.0, 7200.0], [None, None]]
