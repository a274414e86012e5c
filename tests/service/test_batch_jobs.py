"""Batch jobs with real processes: a failing task leaves its siblings running to their end, each
task has its own status, a fault restart reruns only the failed tasks, lists filter by type and
the job's TensorBoard has one run per task."""

from __future__ import annotations

import json

import requests

from tests.fixtures.service_api import PY, full_log, job_of, pycmd, submit, wait_status
from tests.helpers import wait_for, writable_dir


def _task(script: str) -> dict:
    return {"command": pycmd(script)}


# a sibling that is still working when task-1 fails: before, the failure killed it mid-sleep
SLOW_OK = "import time; time.sleep(4); print('task {i} finished its work', flush=True)"


def test_a_failing_task_lets_the_others_finish_and_names_itself(ma_module_service):
    job = submit(
        ma_module_service,
        name="sweep",
        type="batch",
        tasks=[
            _task(SLOW_OK.format(i=0)),
            _task("import sys; print('task 1 gives up', flush=True); sys.exit(3)"),
            _task(SLOW_OK.format(i=2)),
        ],
    )
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error", "stopped"}, timeout=180)
    assert final["status"] == "error"
    assert "task-1" in final["reason"] and "task-0" not in final["reason"], final["reason"]
    assert "1 of 3 task(s) failed" in final["reason"]
    assert final["exit_code"] == 3
    assert [(t["name"], t["status"], t["exit_code"]) for t in final["tasks"]] == [
        ("task-0", "succeeded", 0),
        ("task-1", "failed", 3),
        ("task-2", "succeeded", 0),
    ]
    assert [t["outputs"] for t in final["tasks"]] == ["sweep-0", "sweep-1", "sweep-2"]
    assert "task 0 finished its work" in full_log(ma_module_service, job["id"], node="task-0")
    assert "task 2 finished its work" in full_log(ma_module_service, job["id"], node="task-2")
    events = (
        ma_module_service.session().get(f"{ma_module_service.api}/jobs/{job['id']}/events", timeout=10).json()
    )
    last = events[-1] if isinstance(events, list) else events["items"][-1]
    assert last["status"] == "error" and "task 1 gives up" in last["reason"]


def test_fault_restart_reruns_only_the_failed_task(ma_module_service, tmp_path):
    out = tmp_path / "out"
    writable_dir(out)
    # each task appends to its own outputs folder (kept across attempts): task-1 fails on its
    # first run only
    counting = "open('/workspace/outputs/runs', 'a').write('x'); "
    flaky = (
        "import os, sys; first = not os.path.exists('/workspace/outputs/runs'); "
        + counting
        + "sys.exit(5 if first else 0)"
    )
    job = submit(
        ma_module_service,
        name="retry",
        type="batch",
        outputs=str(out),
        fault_restart={"max_restarts": 1},
        tasks=[_task(counting + "print('zero ran')"), _task(flaky)],
    )
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error", "stopped"}, timeout=180)
    assert final["status"] == "succeeded", final["reason"]
    assert final["restarts"] == 1
    assert (out / "retry-1" / "runs").read_text() == "xx"
    assert (out / "retry-0" / "runs").read_text() == "x"  # the task that succeeded ran once
    assert [t["status"] for t in final["tasks"]] == ["succeeded", "succeeded"]


def test_lists_filter_by_type_and_cli_shows_task_status(ma_module_service, ma_module_cli):
    # the module's service is shared: this test lists the jobs of its own names
    batch = submit(ma_module_service, name="by-type-b", type="batch", tasks=[{"command": f"{PY} -c pass"}])
    regular = submit(ma_module_service, name="by-type-r", command=f"{PY} -c pass")
    for job in (batch, regular):
        wait_status(ma_module_service, job["id"], {"succeeded", "error"}, timeout=120)
    s = ma_module_service.session()
    ids = lambda **p: [  # noqa: E731
        j["id"]
        for j in s.get(f"{ma_module_service.api}/jobs", params={"name": "by-type-", **p}, timeout=10).json()[
            "items"
        ]
    ]
    assert ids(type="batch") == [batch["id"]]
    assert ids(type="regular") == [regular["id"]]
    assert set(ids()) == {batch["id"], regular["id"]}
    bad = s.get(f"{ma_module_service.api}/jobs", params={"type": "sweep"}, timeout=10)
    assert bad.status_code == 400 and "batch" in bad.text, bad.text

    listed = json.loads(ma_module_cli("jobs", "--type", "batch", "--name", "by-type-", "--json").stdout)
    assert [j["id"] for j in listed["items"]] == [batch["id"]]
    shown = ma_module_cli("get", batch["id"]).stdout
    assert "task:      task-0 (succeeded, exit 0; outputs by-type-b-0/)" in shown


def test_batch_tensorboard_has_one_run_per_task(ma_module_service, tmp_path):
    from tests.fixtures.tensorboard import write_scalars

    out = tmp_path / "out"
    writable_dir(out)
    job = submit(
        ma_module_service,
        name="tb",
        type="batch",
        outputs=str(out),
        tasks=[{"command": f"{PY} -c pass"}, {"command": f"{PY} -c pass"}],
    )
    assert (
        wait_status(ma_module_service, job["id"], {"succeeded", "error"}, timeout=120)["status"]
        == "succeeded"
    )
    for i in range(2):  # what each task's training would write into its own outputs folder
        write_scalars(out / f"tb-{i}")
    r = ma_module_service.session().post(f"{ma_module_service.api}/jobs/{job['id']}/tensorboard", timeout=120)
    assert r.status_code == 200, r.text
    url = r.json()["url"]

    def both_runs() -> list | None:  # TensorBoard lists a run once it has read its folder
        runs = requests.get(url + "data/runs", timeout=10).json()
        return runs if len(runs) >= 2 else None

    runs = wait_for(both_runs, timeout=60, interval=0.1)
    assert sorted(runs) == ["tb-0", "tb-1"]
    assert job_of(ma_module_service, job["id"])["tasks"][1]["outputs"] == "tb-1"
