"""A hostile job against its neighbours and the service, on a real root service (issue 13, item 3).

One job probes what a job shares the host with: another running job's TensorBoard on loopback,
that job's processes and the service's (signals), the files of that job and of the service (its
log, outputs, node folder with the job's variables, the service's home, runtime file with its
token, database), and the way out of its mounts (``..``, ``/proc/self/root``, a bind mount).
Every probe must fail; the test prints what each got.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import psutil
import pytest

from ma_jupyter.models import JobStatus
from tests.fixtures.tensorboard import write_scalars
from tests.helpers import wait_for, writable_dir

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="jobs of a root service run as another account"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.timeout(300),
]

PROBE = r"""
import errno, json, os, signal, sys, urllib.error, urllib.request

targets = json.load(open("/workspace/algorithm/targets.json"))
found = {}
for path in targets["urls"]:
    try:
        with urllib.request.urlopen(path, timeout=10) as answer:
            found[path] = answer.status
    except urllib.error.HTTPError as exc:
        found[path] = exc.code
    except OSError as exc:
        found[path] = type(exc).__name__
for name, pid in targets["pids"].items():
    for sig in (0, signal.SIGTERM):
        try:
            os.kill(pid, sig)
            found[f"signal {sig} to {name}"] = "sent"
        except OSError as exc:
            found[f"signal {sig} to {name}"] = errno.errorcode[exc.errno]
for path in targets["files"]:
    try:
        if os.path.isdir(path):
            found[path] = f"listed {len(os.listdir(path))}"
        else:
            with open(path, "rb") as fh:
                found[path] = f"read {len(fh.read(100))}"
    except OSError as exc:
        found[path] = errno.errorcode[exc.errno]
# out of the mounts: through "..", through /proc/self/root, with a bind mount of the host's root
for path in ("/workspace/outputs/../../../etc/escaped", "/proc/self/root/etc/escaped", "/proc/1/root/escaped"):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        found[f"write {path}"] = "wrote"
    except OSError as exc:
        found[f"write {path}"] = errno.errorcode[exc.errno]
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND = 4096
done = libc.mount(b"/", b"/tmp", None, MS_BIND, None)
found["bind mount of /"] = "mounted" if done == 0 else errno.errorcode[ctypes.get_errno()]
print("PROBES " + json.dumps(found), flush=True)
"""


def test_a_job_reaches_nothing_of_another_job_nor_of_the_service(ma_client, ma_home, tmp_path):
    outputs = writable_dir(tmp_path / "victim-out")
    write_scalars(outputs / "train")
    victim = ma_client.submit(
        name="victim",
        command=f"{sys.executable} -c \"import time; open('/workspace/outputs/mine.txt', 'w').write('x'); "
        "print('victim secret line', flush=True); time.sleep(600)\"",
        outputs=str(outputs),
        env={"VICTIM_TOKEN": "hunter2"},
        grace_period=1,
    )
    wait_for(lambda: "victim secret line" in ma_client.read_log(victim.id).data, timeout=120)
    board = ma_client.tensorboard(victim.id)  # the owner's URL, with the board's secret
    port = int(board.split(":")[2].split("/")[0])
    runner = ma_client.get(victim.id).nodes[0].pid
    own = [
        p.pid
        for p in psutil.Process(runner).children(recursive=True)
        if "victim secret" in " ".join(p.cmdline())
    ]
    assert own
    service_pid = json.loads((ma_home / "service.json").read_text())["pid"]
    jd = ma_home / "jobs" / victim.id
    targets = {
        "urls": [
            f"http://127.0.0.1:{port}{p}" for p in ("/", f"/tb/{victim.id}/", f"/tb/{victim.id}/data/runs")
        ],
        "pids": {"the service": service_pid, "the other job's runner": runner, "the other job": own[-1]},
        "files": [
            str(jd / "logs" / "worker-0.log"),
            str(jd / "nodes" / "worker-0" / "node-run.json"),  # its variables and secret
            str(outputs / "mine.txt"),
            str(ma_home),
            str(ma_home / "service.json"),  # the token
            str(ma_home / "jobs.db"),
            str(jd),
        ],
    }
    algo = writable_dir(tmp_path / "algo")
    (algo / "probe.py").write_text(PROBE)
    (algo / "targets.json").write_text(json.dumps(targets))
    prober = ma_client.submit(
        name="prober",
        algorithm=str(algo),
        command="python /workspace/algorithm/probe.py",
    )
    job = prober.wait(timeout=180)
    log = ma_client.read_log(prober.id).data
    assert job.status is JobStatus.succeeded, log
    found = json.loads(log.split("PROBES ", 1)[1].splitlines()[0])
    print(json.dumps(found, indent=1))
    got_through = {
        k: v
        for k, v in found.items()
        if v in (200, "sent", "wrote", "mounted") or str(v).startswith(("read", "listed"))
    }
    assert got_through == {}, got_through
    assert len(found) == 3 + 6 + 7 + 4
    # the other job runs on, untouched
    assert victim.status is JobStatus.running
    assert "hunter2" not in log
    victim.stop()
