"""Bad input through the REST API (issue 13, item 4), on a real service: each is a 400 naming
the field and telling what to do, and nothing is half-made (no job, no database row, no
folder).  A dataset or a model may be a single file (data preparation copies it), so a file is
refused where a folder is needed: the algorithm, the outputs, a volume.  A job's ``LD_PRELOAD`` is allowed, but reaches the job's own command only.
"""

from __future__ import annotations

import json
import sqlite3

import psutil
import pytest

from tests.fixtures.service_api import full_log, pycmd, submit, wait_status
from tests.helpers import wait_for

GOOD = {"name": "t", "command": "python train.py"}


def _cases(tmp_path):
    a_file = tmp_path / "data.csv"
    a_file.write_text("x,y\n")
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    mount = {"name": "d", "path": str(folder)}
    return {
        "name with /": ({"name": "a/b"}, "name", "letters, digits"),
        "name ..": ({"name": ".."}, "name", "letters, digits"),
        "name with NUL": ({"name": "a\x00b"}, "name", "letters, digits"),
        "name of 10 000 characters": ({"name": "n" * 10_000}, "name", "letters, digits"),
        "name only unicode": ({"name": "训练任务"}, "name", "letters, digits"),
        "command of 1 MB": ({"command": "python " + "a" * 1_000_000}, "command", "at most 131072"),
        "command with NUL": ({"command": "python a\x00b"}, "command", "NUL byte"),
        "env name with =": ({"env": {"A=B": "1"}}, "env", "pattern"),
        "env value with NUL": ({"env": {"A": "x\x00y"}}, "env", "NUL byte"),
        # a dataset may be one file (data preparation copies it); the algorithm is a folder
        "algorithm path a file": ({"algorithm": str(a_file)}, "algorithm", "not a folder"),
        "outputs a file": ({"outputs": str(a_file)}, "outputs", "not a folder"),
        "volume a file": ({"volumes": [{"name": "v", "path": str(a_file)}]}, "volumes", "not a folder"),
        "dataset path missing": (
            {"datasets": [{"name": "d", "path": str(tmp_path / "nowhere")}]},
            "datasets",
            "does not exist",
        ),
        "dataset path with NUL": ({"datasets": [{"name": "d", "path": "/a\x00b"}]}, "datasets", "NUL byte"),
        "duplicate mount names": ({"datasets": [mount, mount]}, None, "mounted twice"),
        "1000 specs": ({"specs": [f"s{i}" for i in range(1000)]}, "specs", "at most 16"),
        "1000 datasets": (
            {"datasets": [{"name": f"d{i}", "path": str(folder)} for i in range(1000)]},
            "datasets",
            "at most 64",
        ),
        "duration infinite": ({"duration": float("inf")}, "duration", "positive"),
        "duration of a century": ({"duration": 100 * 366 * 86400}, "duration", "ten years"),
        "unknown field": ({"nmae": "x"}, "nmae", "unknown field"),
    }


#: the case names (the cases themselves need the test's tmp_path)
CASES = [
    "name with /",
    "name ..",
    "name with NUL",
    "name of 10 000 characters",
    "name only unicode",
    "command of 1 MB",
    "command with NUL",
    "env name with =",
    "env value with NUL",
    "algorithm path a file",
    "outputs a file",
    "volume a file",
    "dataset path missing",
    "dataset path with NUL",
    "duplicate mount names",
    "1000 specs",
    "1000 datasets",
    "duration infinite",
    "duration of a century",
    "unknown field",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_a_400_naming_the_field_and_makes_nothing(ma_module_service, tmp_path, case):
    # one service for every case: each checks that nothing at all was made, so a case that
    # made something fails there (or the next case does)
    ma_service, ma_home = ma_module_service, ma_module_service.home
    fields, field, words = _cases(tmp_path)[case]
    s = ma_service.session()
    for route in ("plan", "jobs"):
        # as Python's json writes it (Infinity included, which the service's parser reads)
        data = json.dumps({**GOOD, **fields})
        r = s.post(
            f"{ma_service.api}/{route}", data=data, headers={"Content-Type": "application/json"}, timeout=60
        )
        assert r.status_code == 400, (route, r.status_code, r.text[:500])
        body = r.json()
        assert body["error"] == "invalid_spec" and words in body["message"], body["message"][:500]
        assert len(body["message"]) < 2000  # the answer names the problem, it does not echo the input
        if field is not None:
            # the message starts with the field (a mount: with its kind and name)
            assert body["field"] == field and body["message"].startswith(field.rstrip("s")), body
    # nothing half-made: no job listed, no row, no job folder
    assert s.get(f"{ma_service.api}/jobs", timeout=10).json()["total"] == 0
    with sqlite3.connect(ma_home / "jobs.db") as db:
        assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0
    jobs = ma_home / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []


def test_ld_preload_reaches_the_jobs_command_only(ma_service, tmp_path):
    preload = str(tmp_path / "not-a-library.so")  # ld.so warns and goes on: harmless, visible
    job = submit(
        ma_service,
        name="preload",
        command=pycmd(
            "import os, time; print('seen', os.environ.get('LD_PRELOAD'), flush=True); time.sleep(60)"
        ),
        env={"LD_PRELOAD": preload},
    )
    wait_for(lambda: "seen " in full_log(ma_service, job["id"]), timeout=60)
    assert f"seen {preload}" in full_log(ma_service, job["id"])
    running = ma_service.session().get(f"{ma_service.api}/jobs/{job['id']}", timeout=10).json()
    root = psutil.Process(running["nodes"][0]["pid"])
    carriers, clean = [], []
    for proc in [root, *root.children(recursive=True)]:
        try:
            env = proc.environ()
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        (carriers if env.get("LD_PRELOAD") == preload else clean).append(cmdline)
    # the runner, bubblewrap, setpriv and the env helper run without it; the job's command has it
    assert carriers and all("print('seen'" in c for c in carriers), carriers
    assert clean, "the node's own processes were not found"
    assert "LD_PRELOAD" not in psutil.Process(ma_service.proc.pid).environ()
    ma_service.session().post(f"{ma_service.api}/jobs/{job['id']}/stop", timeout=10)
    wait_status(ma_service, job["id"], {"stopped"})
