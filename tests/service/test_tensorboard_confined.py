"""A job's TensorBoard reads nothing its job could not (issue 24, item 2), on a real root service.

The reproductions: a job plants ``outputs/steal -> <home>/jobs`` beside another user's ``--access
none`` job, and its user opens the job's own TensorBoard: it listed and served the other job's
scalars and text.  The same job swaps a folder of its outputs with a symlink to the service's home
while the projector plugin checks, then opens, a metadata file under it: it served
``service.json``, the admin's token.  Now TensorBoard runs as the job's account in a sandbox that
shows only the job's outputs, read-only: neither the other job nor the home exists there.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import signal
import time

import psutil
import pytest
import requests

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.helpers import wait_for, writable_dir

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="jobs of a root service run as another account"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.timeout(420),
]

#: the attacker's account: a real one (``daemon``, uid 1), so "the job's account" cannot be
#: mistaken for the job account every account-less user shares (``nobody``)
ATTACKER = "daemon"

#: writes one run of scalars and text with TensorBoard's own writer: ``events.py FOLDER TAG TEXT``
EVENTS = r"""
import os, sys, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

folder, tag, text = sys.argv[1:4]
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, f"events.out.tfevents.{int(time.time())}.job"), "wb") as fh:
    writer = RecordWriter(fh)
    writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    for step in range(3):
        value = summary_pb2.Summary.Value(tag=tag, simple_value=0.5 + step)
        event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value]))
        writer.write(event.SerializeToString())
    value = summary_pb2.Summary.Value(
        tag=tag + "-text",
        metadata=text_metadata.create_summary_metadata(display_name="", description=""),
        tensor=tensor_util.make_tensor_proto([text]),
    )
    event = event_pb2.Event(wall_time=time.time(), step=3, summary=summary_pb2.Summary(value=[value]))
    writer.write(event.SerializeToString())
    writer.flush()
print("WROTE", folder, flush=True)
"""

#: the hostile job: its own run, the symlink to every job's folder, then the projector race
#: (``sw`` swapped, atomically and again and again, between a real folder holding a decoy
#: ``service.json`` and a symlink to the service's home) until the test stops it
ATTACK = r"""
import ctypes, os, subprocess, sys, time
home = sys.argv[1]
out = "/workspace/outputs"
subprocess.run([sys.executable, "/workspace/algorithm/events.py", out + "/mine", "my-loss", "my own text"], check=True)
os.symlink(home + "/jobs", out + "/steal")
os.symlink(home, out + "/home")
os.makedirs(out + "/sw")
open(out + "/sw/service.json", "w").write("decoy\tdecoy\n")
open(out + "/emb.tsv", "w").write("0.1\t0.2\n0.3\t0.4\n")
open(out + "/projector_config.pbtxt", "w").write(
    'embeddings { tensor_name: "emb" tensor_path: "emb.tsv" metadata_path: "sw/service.json" }\n'
)
os.symlink(home, out + "/swl")
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
print("PLANTED", flush=True)
end = time.monotonic() + 300
while time.monotonic() < end:
    if libc.renameat2(AT_FDCWD, (out + "/sw").encode(), AT_FDCWD, (out + "/swl").encode(), RENAME_EXCHANGE):
        raise OSError(ctypes.get_errno(), "renameat2")
"""


def _gone(pid: int) -> bool:
    """Whether the process ``pid`` has ended (a zombie waiting for its reaper has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _tensorboard_pid(port: int) -> int:
    """The process listening on the board's port (TensorBoard itself, inside its sandbox)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise AssertionError(f"nothing listens on port {port}")


def test_a_jobs_tensorboard_reads_only_that_jobs_outputs_as_its_account(ma_service, tmp_path):
    home = ma_service.home
    bob = Client(url=ma_service.url, token=ma_service.user_token("bob"), timeout=30)
    attacker = Client(url=ma_service.url, token=ma_service.user_token(ATTACKER), timeout=30)
    algo = writable_dir(tmp_path / "algo")
    (algo / "events.py").write_text(EVENTS)
    (algo / "attack.py").write_text(ATTACK)

    # another user's job nobody else may see, with scalars and text in its outputs
    victim = bob.submit(
        name="victim",
        algorithm=str(algo),
        command="python /workspace/algorithm/events.py /workspace/outputs/secret-run bob-loss bob-secret-text",
        access="none",
    )
    done = victim.wait(timeout=180)
    assert done.status is JobStatus.succeeded, bob.read_log(victim.id).data
    victim_outputs = home / "jobs" / victim.id / "outputs"
    assert (victim_outputs / "secret-run").is_dir()

    hostile = attacker.submit(
        name="hostile",
        algorithm=str(algo),
        command=f"python /workspace/algorithm/attack.py {home}",
        grace_period=1,
    )
    wait_for(lambda: "PLANTED" in attacker.read_log(hostile.id).data, timeout=180)
    own_outputs = home / "jobs" / hostile.id / "outputs"
    assert os.readlink(own_outputs / "steal") == f"{home}/jobs"  # the planted symlink is there

    url = attacker.tensorboard(hostile.id)  # the user's own job: allowed
    session = requests.Session()

    # 1. the symlink reproduction: only the job's own run is listed, nothing of the other job served
    runs = session.get(url + "data/runs", timeout=30).json()
    assert runs == ["mine"], runs
    stolen_run = f"steal/{victim.id}/outputs/secret-run"
    for plugin in ("scalars", "text"):
        tags = session.get(url + f"data/plugin/{plugin}/tags", timeout=30).json()
        assert list(tags) == ["mine"], tags
    scalars = session.get(
        url + "data/plugin/scalars/scalars", params={"run": stolen_run, "tag": "bob-loss"}, timeout=30
    )
    assert scalars.status_code == 404, scalars.text[:300]
    text = session.get(
        url + "data/plugin/text/text", params={"run": stolen_run, "tag": "bob-loss-text"}, timeout=30
    )
    assert "bob-secret-text" not in text.text and text.json() == [], text.text[:300]
    # ... while the job's own run is served whole
    assert "my-loss" in session.get(url + "data/plugin/scalars/tags", timeout=30).json()["mine"]
    text = session.get(
        url + "data/plugin/text/text", params={"run": "mine", "tag": "my-loss-text"}, timeout=30
    )
    assert "my own text" in text.text

    # 2. the projector race for the token: the check passes on the real folder, the open meets
    # the symlink; the home does not exist in the sandbox, so only the decoy is ever read
    token = json.loads((home / "service.json").read_text())["token"]
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        answer = session.get(
            url + "data/plugin/projector/metadata", params={"run": ".", "name": "emb"}, timeout=30
        )
        assert token not in answer.text and '"token"' not in answer.text, answer.text[:300]
        kind = "decoy" if "decoy" in answer.text else str(answer.status_code)
        seen[kind] = seen.get(kind, 0) + 1
    print("projector answers:", seen)
    assert seen.get("decoy"), seen  # the race ran: the plugin did read files meanwhile

    # 3. the process: the job's account, no capability, a view of its outputs alone, read-only
    port = int(url.split(":")[2].split("/")[0])
    pid = _tensorboard_pid(port)
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    account = pwd.getpwnam(ATTACKER)
    assert status["Uid"].split() == [str(account.pw_uid)] * 4, status["Uid"]
    assert status["Gid"].split() == [str(account.pw_gid)] * 4, status["Gid"]
    assert int(status["CapEff"], 16) == 0
    root = f"/proc/{pid}/root"
    assert sorted(os.listdir(f"{root}/workspace/outputs")) == sorted(os.listdir(own_outputs))
    for hidden in (home, home / "jobs", home / "service.json", victim_outputs, own_outputs):
        assert not os.path.lexists(f"{root}{hidden}"), hidden
    mounts = [line.split() for line in open(f"/proc/{pid}/mountinfo")]
    outputs_mount = [m for m in mounts if m[4] == "/workspace/outputs"]
    assert outputs_mount and "ro" in outputs_mount[0][5].split(","), outputs_mount
    # of the home, the job's own outputs alone are mounted
    assert [m for m in mounts if m[3].startswith(str(home))] == outputs_mount
    # read-only even for root: a write through the TensorBoard's view is refused by the kernel
    with pytest.raises(OSError) as refused:
        open(f"{root}/workspace/outputs/written-through-the-board", "w").close()
    assert refused.value.errno == errno.EROFS
    assert not (own_outputs / "written-through-the-board").exists()

    hostile.stop()
    attacker.stop_tensorboard(hostile.id)
    wait_for(lambda: _gone(pid), timeout=30)


def test_the_job_account_reads_what_the_job_wrote_and_its_board_is_reaped(ma_service, tmp_path):
    """The ordinary case, end to end: a job that wrote scalars as ``nobody``; its owner's board
    serves them, runs as ``nobody`` too, is gone when stopped (the reaper's path), started again
    on the next use, and gone with a service that is killed."""
    alice = Client(url=ma_service.url, token=ma_service.user_token("alice"), timeout=30)
    algo = writable_dir(tmp_path / "algo")
    (algo / "events.py").write_text(EVENTS)
    job = alice.submit(
        name="plain",
        algorithm=str(algo),
        command="python /workspace/algorithm/events.py /workspace/outputs/train loss fine",
    )
    assert job.wait(timeout=180).status is JobStatus.succeeded, alice.read_log(job.id).data
    url = alice.tensorboard(job.id)
    assert requests.get(url + "data/runs", timeout=30).json() == ["train"]
    pid = _tensorboard_pid(int(url.split(":")[2].split("/")[0]))
    assert psutil.Process(pid).uids().real == 65534  # nobody: the account the job ran as
    # another user may view the job (ro access, the default): the same board, as the job's account
    other = Client(url=ma_service.url, token=ma_service.user_token("carol"), timeout=30)
    assert other.tensorboard(job.id) == url
    alice.stop_tensorboard(job.id)
    wait_for(lambda: _gone(pid), timeout=30)
    # started again on the next use
    again = alice.tensorboard(job.id)
    assert requests.get(again + "data/runs", timeout=30).json() == ["train"]
    assert again != url  # a fresh board: a fresh secret
    # a service killed outright takes its boards along (they end with the thread that started them)
    pid = _tensorboard_pid(int(again.split(":")[2].split("/")[0]))
    ma_service.proc.send_signal(signal.SIGKILL)
    ma_service.proc.wait(30)
    wait_for(lambda: _gone(pid), timeout=30)
