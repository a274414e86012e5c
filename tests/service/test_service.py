"""The job service end to end over HTTP: real service process, real node processes in bubblewrap."""

from __future__ import annotations

import os
import pwd
import signal
import textwrap
import time
from datetime import datetime
from types import SimpleNamespace

import psutil
import pytest
import requests

from tests.fixtures.service_api import PY, full_log, job_of, pycmd, submit, wait_status
from tests.helpers import wait_for, writable_dir

OWNER = pwd.getpwuid(os.geteuid()).pw_name  # the account that starts the service owns it


def test_every_route_requires_the_token(ma_module_service):
    from ma_jupyter.service.app import create_app

    try:  # a newer FastAPI keeps each included router whole in app.routes
        from fastapi.routing import iter_route_contexts
    except ImportError:  # earlier: app.routes holds every route itself

        def iter_route_contexts(routes):
            return routes

    # an app with nothing behind it (only its routes are read)
    nothing = SimpleNamespace(
        store=None, scheduler=None, backend=None, health=None, queue=None, resources=None
    )
    # every route the app defines, taken from the app itself so a new route cannot slip through
    routes = [
        (method.lower(), route.path.replace("{job_id}", "x").replace("{name}", "x"))
        for route in iter_route_contexts(create_app(nothing, "unused").routes)
        for method in getattr(route, "methods", ()) or ()
        if method != "HEAD"
    ]
    assert ("get", "/api/v1/openapi.json") in routes and len(routes) >= 15
    for method, path in routes:
        r = requests.request(method, f"{ma_module_service.url}{path}", timeout=5)
        assert r.status_code == 401, (method, path, r.status_code)
        assert r.json()["error"] == "unauthorized"
        bad = requests.request(
            method, f"{ma_module_service.url}{path}", headers={"Authorization": "Bearer nope"}, timeout=5
        )
        assert bad.status_code == 401
    for path in ("/docs", "/openapi.json", "/redoc", "/api/v1/docs"):
        assert requests.get(f"{ma_module_service.url}{path}", timeout=5).status_code in (401, 404)
    assert ma_module_service.session().get(f"{ma_module_service.api}/health", timeout=5).json()["ok"] is True
    # loopback only, and the runtime file is private
    assert ma_module_service.url.startswith("http://127.0.0.1:")
    assert (ma_module_service.home / "service.json").stat().st_mode & 0o777 == 0o600
    schema = ma_module_service.session().get(f"{ma_module_service.api}/openapi.json", timeout=5)
    assert schema.status_code == 200 and "/api/v1/jobs" in schema.json()["paths"]


def test_bad_specs_get_a_400_that_says_what_to_do_and_create_nothing(ma_module_service, tmp_path):
    s = ma_module_service.session()
    r = s.post(
        f"{ma_module_service.api}/jobs",
        json={"name": "refused-spec", "command": "KEY=VALUE python3 train.py"},
        timeout=5,
    )
    assert r.status_code == 400
    assert "bash -c" in r.json()["message"]
    r = s.post(
        f"{ma_module_service.api}/jobs",
        json={"name": "refused-spec", "command": "python x.py", "specs": ["nope"]},
        timeout=5,
    )
    assert r.status_code == 400 and "unknown spec" in r.json()["message"]
    r = s.post(
        f"{ma_module_service.api}/jobs",
        json={
            "name": "refused-spec",
            "command": "python x.py",
            "datasets": [{"name": "d", "path": "/does/not/exist"}],
        },
        timeout=5,
    )
    assert r.status_code == 400 and "/does/not/exist" in r.json()["message"]
    out = writable_dir(tmp_path / "out")
    (out / "data").mkdir()
    r = s.post(
        f"{ma_module_service.api}/jobs",
        json={
            "name": "refused-spec",
            "command": "python x.py",
            "outputs": str(out),
            "datasets": [{"name": "d", "path": str(out / "data")}],
        },
        timeout=5,
    )
    assert r.status_code == 400 and "lies inside the writable /workspace/outputs" in r.json()["message"]
    # nothing made (the module's service is shared: the jobs of this test's name)
    assert (
        s.get(f"{ma_module_service.api}/jobs", params={"name": "refused-spec"}, timeout=5).json()["total"]
        == 0
    )
    assert s.get(f"{ma_module_service.api}/jobs/missing-1", timeout=5).status_code == 404


def test_read_only_dataset_writable_outputs(ma_module_service, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "numbers.txt").write_text("1 2 3 4\n")
    out = tmp_path / "out"
    writable_dir(out)
    script = textwrap.dedent("""
        import os, subprocess
        nums = open('/workspace/dataset/private/numbers/numbers.txt').read().split()
        open('/workspace/outputs/sum.txt', 'w').write(str(sum(map(int, nums))))
        try:
            open('/workspace/dataset/private/numbers/hack.txt', 'w').write('x')
            print('DATASET WRITABLE')
        except OSError as exc:
            print('dataset is read-only:', exc.errno)
        print('done')
    """)
    job = submit(
        ma_module_service,
        command=pycmd(script),
        datasets=[{"name": "numbers", "path": str(data)}],
        outputs=str(out),
    )
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error"})
    log = full_log(ma_module_service, job["id"])
    assert final["status"] == "succeeded", log
    assert (out / "sum.txt").read_text() == "10"
    assert "dataset is read-only" in log and "DATASET WRITABLE" not in log
    assert not (data / "hack.txt").exists()
    events = (
        ma_module_service.session().get(f"{ma_module_service.api}/jobs/{job['id']}/events", timeout=5).json()
    )
    assert [e["status"] for e in events][0] == "queued" and events[-1]["status"] == "succeeded"


def test_failure_reports_exit_code_and_last_lines(ma_module_service):
    job = submit(ma_module_service, command=f"{PY} -c \"import sys; print('before the crash'); sys.exit(3)\"")
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error"})
    assert final["status"] == "error"
    assert final["exit_code"] == 3
    events = (
        ma_module_service.session().get(f"{ma_module_service.api}/jobs/{job['id']}/events", timeout=5).json()
    )
    last = events[-1]
    assert last["exit_code"] == 3 and last["node"] == "worker-0"
    assert "exited with code 3" in last["reason"] and "before the crash" in last["reason"]


def tree_script(marker):
    return textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        # a child that ignores SIGTERM and a grandchild in its own session
        subprocess.Popen([sys.executable, '-c', 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)  # {marker}'])
        subprocess.Popen([sys.executable, '-c', 'import os,time; os.setsid(); time.sleep(600)  # {marker}'])
        print('tree started', flush=True)
        time.sleep(600)
    """)


def _procs_with(marker):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_stop_kills_the_whole_tree_within_the_grace_period(ma_module_service):
    marker = f"ma-tree-{os.getpid()}-{time.time_ns()}"
    job = submit(ma_module_service, command=pycmd(tree_script(marker)), grace_period=2)
    wait_for(lambda: "tree started" in full_log(ma_module_service, job["id"]), timeout=30)
    wait_for(lambda: len(_procs_with(marker)) >= 2, timeout=10)
    started = time.monotonic()
    r = ma_module_service.session().post(f"{ma_module_service.api}/jobs/{job['id']}/stop", timeout=5)
    assert r.status_code == 200
    final = wait_status(ma_module_service, job["id"], {"stopped"}, timeout=30)
    took = time.monotonic() - started
    assert final["status"] == "stopped"
    assert _procs_with(marker) == []
    assert took < 2 + 5, f"stop took {took:.1f} s for a 2 s grace period"


def test_a_job_past_its_duration_expires(ma_module_service):
    job = submit(
        ma_module_service,
        command=f"{PY} -c \"import time; print('long', flush=True); time.sleep(600)\"",
        duration=2,
        grace_period=1,
    )
    final = wait_status(ma_module_service, job["id"], {"expired", "error", "succeeded"}, timeout=30)
    assert final["status"] == "expired"
    assert "duration" in final["reason"]


@pytest.mark.small_cluster
def test_kill_9_of_the_service_loses_nothing(ma_service, tmp_path):
    script = textwrap.dedent("""
        import time
        for i in range(40):
            print(f'line {i}', flush=True)
            time.sleep(0.1)
    """)
    job = submit(ma_service, command=pycmd(script), node_name="big")
    wait_for(lambda: "line 3" in full_log(ma_service, job["id"]), timeout=30)
    # a job that cannot start yet must survive the crash too
    blocker = submit(
        ma_service,
        name="blocker",
        command=f'{PY} -c "import time; time.sleep(600)"',
        specs=["cpu.medium"],
        node_name="tiny",
        grace_period=1,
    )
    queued_later = submit(ma_service, name="waiting", command=f"{PY} -c \"print('I ran')\"", node_name="tiny")
    wait_status(ma_service, blocker["id"], {"running"})
    wait_status(ma_service, queued_later["id"], {"queued"})
    os.kill(ma_service.proc.pid, signal.SIGKILL)
    ma_service.proc.wait(10)
    time.sleep(1.0)  # the job keeps printing while no service runs
    svc = ma_service.restart()
    final = wait_status(svc, job["id"], {"succeeded", "error"}, timeout=60)
    assert final["status"] == "succeeded"
    log = full_log(svc, job["id"])
    assert [line for line in log.splitlines() if line.startswith("line ")] == [f"line {i}" for i in range(40)]
    events = svc.session().get(f"{svc.api}/jobs/{job['id']}/events", timeout=5).json()
    assert any("re-attached" in e["reason"] for e in events)
    assert job_of(svc, queued_later["id"])["status"] == "queued"
    svc.session().post(f"{svc.api}/jobs/{blocker['id']}/stop", timeout=5)
    assert wait_status(svc, queued_later["id"], {"succeeded"}, timeout=60)["status"] == "succeeded"


def test_follow_long_poll_and_offsets(ma_module_service):
    script = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second', flush=True)"
    job = submit(ma_module_service, command=pycmd(script))
    s = ma_module_service.session()
    seen, offset = "", 0
    while True:
        chunk = s.get(
            f"{ma_module_service.api}/jobs/{job['id']}/logs/read",
            params={"offset": offset, "wait": 5},
            timeout=15,
        ).json()
        assert chunk["offset"] == offset
        seen += chunk["data"]
        offset = chunk["next_offset"]
        if chunk["eof"]:
            break
    assert seen.splitlines() == ["first", "second"]
    streams = s.get(f"{ma_module_service.api}/jobs/{job['id']}/logs", timeout=5).json()
    assert streams[0]["node"] == "worker-0" and streams[0]["size"] == offset


def test_listing_filters_and_paging(ma_module_service):
    ids = [submit(ma_module_service, name=f"alpha-{i}", command=f"{PY} -c pass")["id"] for i in range(3)]
    submit(ma_module_service, name="beta-listed", command=f"{PY} -c pass", specs=["cpu.medium"])
    for job_id in ids:
        wait_status(ma_module_service, job_id, {"succeeded"})
    s = ma_module_service.session()
    page = s.get(f"{ma_module_service.api}/jobs", params={"name": "alpha-", "limit": 2}, timeout=5).json()
    assert page["total"] == 3 and len(page["items"]) == 2

    def medium(name: str) -> int:  # the module's service is shared: the spec filter on this test's names
        params = {"spec": "cpu.medium", "name": name}
        return s.get(f"{ma_module_service.api}/jobs", params=params, timeout=5).json()["total"]

    assert (medium("beta-listed"), medium("alpha-")) == (1, 0)
    assert (
        s.get(
            f"{ma_module_service.api}/jobs",
            params={"creator": OWNER, "status": "succeeded", "name": "alpha"},
            timeout=5,
        ).json()["total"]
        == 3
    )
    specs = s.get(f"{ma_module_service.api}/specs", timeout=5).json()
    assert "cpu.small" in [x["name"] for x in specs]
    assert len(s.get(f"{ma_module_service.api}/nodes", timeout=5).json()) >= 2


def test_others_access_rules(ma_module_service):
    job = submit(ma_module_service, command=f"{PY} -c pass", access="ro")
    other = ma_module_service.user_session("someone-else")
    assert other.get(f"{ma_module_service.api}/jobs/{job['id']}", timeout=5).status_code == 200
    r = other.post(f"{ma_module_service.api}/jobs/{job['id']}/stop", timeout=5)
    assert r.status_code == 403 and "ask its owner" in r.json()["message"]
    private = submit(ma_module_service, command=f"{PY} -c pass", access="none")
    assert other.get(f"{ma_module_service.api}/jobs/{private['id']}", timeout=5).status_code == 404
    assert private["id"] not in [
        j["id"] for j in other.get(f"{ma_module_service.api}/jobs", timeout=5).json()["items"]
    ]


@pytest.mark.small_cluster
@pytest.mark.parametrize("priority", ["urgent", "very-urgent"])
def test_queued_priority_can_change_and_queued_jobs_stop_at_once(ma_service, priority):
    blocker = submit(
        ma_service,
        name="blocker",
        command=f'{PY} -c "import time; time.sleep(600)"',
        specs=["cpu.medium"],
        node_name="tiny",
        grace_period=1,
    )
    wait_status(ma_service, blocker["id"], {"running"})
    waiting = submit(ma_service, name="waiting", command=f"{PY} -c pass", node_name="tiny")
    assert job_of(ma_service, waiting["id"])["queue_position"] == 0
    s = ma_service.session()
    r = s.patch(f"{ma_service.api}/jobs/{waiting['id']}", json={"priority": priority}, timeout=5)
    assert r.status_code == 200 and r.json()["spec"]["priority"] == priority
    assert (
        s.patch(f"{ma_service.api}/jobs/{blocker['id']}", json={"priority": "urgent"}, timeout=5).status_code
        == 409
    )
    assert s.delete(f"{ma_service.api}/jobs/{waiting['id']}", timeout=5).status_code == 409
    assert s.post(f"{ma_service.api}/jobs/{waiting['id']}/stop", timeout=5).json()["status"] == "stopped"
    assert s.delete(f"{ma_service.api}/jobs/{waiting['id']}", timeout=5).status_code == 204
    assert s.get(f"{ma_service.api}/jobs/{waiting['id']}", timeout=5).status_code == 404
    # a forced delete of a running job: 204 once it is deleted (it stops within its 1 s grace,
    # well inside the answer's wait); 202 only if it were still stopping after that wait
    r = s.delete(f"{ma_service.api}/jobs/{blocker['id']}", params={"force": "true"}, timeout=60)
    if r.status_code == 202:  # a machine too loaded to stop it within the wait
        assert r.json()["deleting"] is True
        wait_for(
            lambda: s.get(f"{ma_service.api}/jobs/{blocker['id']}", timeout=5).status_code == 404, timeout=60
        )
    else:
        assert r.status_code == 204 and not r.content
    assert s.get(f"{ma_service.api}/jobs/{blocker['id']}", timeout=5).status_code == 404


@pytest.mark.small_cluster
def test_a_queued_job_gets_an_estimated_start_from_the_jobs_ahead_of_it(ma_service):
    """Each job ahead starts at its own estimate and ends at its duration: the blocker ends in
    about 10 minutes, the first waiting job runs 5 minutes after it, the second starts then."""
    sleep = f'{PY} -c "import time; time.sleep(600)"'
    blocker = submit(
        ma_service, name="blocker", command=sleep, specs=["cpu.medium"], node_name="tiny", duration=600
    )
    wait_status(ma_service, blocker["id"], {"running"})
    started = datetime.fromisoformat(job_of(ma_service, blocker["id"])["started_at"]).timestamp()
    first = submit(
        ma_service, name="first", command=sleep, specs=["cpu.medium"], node_name="tiny", duration=300
    )
    second = submit(ma_service, name="second", command=sleep, specs=["cpu.medium"], node_name="tiny")
    third = submit(ma_service, name="third", command=sleep, specs=["cpu.medium"], node_name="tiny")
    at = {job["id"]: job_of(ma_service, job["id"])["estimated_start"] for job in (first, second, third)}
    assert datetime.fromisoformat(at[first["id"]]).timestamp() == pytest.approx(started + 600, abs=2)
    assert datetime.fromisoformat(at[second["id"]]).timestamp() == pytest.approx(started + 900, abs=2)
    assert at[third["id"]] is None  # the second has no duration: nobody can tell when it ends
    # a listing does not estimate (one reservation per job ahead, for every row): its summaries
    # carry no estimate at all, or an empty one
    listed = ma_service.session().get(f"{ma_service.api}/jobs", params={"status": "queued"}, timeout=5).json()
    assert len(listed["items"]) == 3 and {j.get("estimated_start") for j in listed["items"]} == {None}
    for job in (third, second, first, blocker):
        ma_service.session().post(f"{ma_service.api}/jobs/{job['id']}/stop", timeout=5)


@pytest.mark.small_cluster
def test_the_prediction_learns_how_long_a_job_without_a_duration_runs_from_its_earlier_runs(ma_service):
    """Seed 002's queue prediction when the running job has no --duration: "start unknown"
    until similar jobs (same name, same user) have run, then their median, with a confidence."""
    api, s = ma_service.api, ma_service.session()
    waiter = {"name": "next", "command": f"{PY} -c pass", "specs": ["cpu.medium"], "node_name": "tiny"}

    def run_exp(seconds: float, wait: bool) -> dict:
        code = f'{PY} -c "import time; time.sleep({seconds})"'
        job = submit(
            ma_service, name="exp", command=code, specs=["cpu.medium"], node_name="tiny", grace_period=1
        )
        return wait_status(ma_service, job["id"], {"succeeded"} if wait else {"running"}, timeout=120)

    blocker = run_exp(600, wait=False)
    unknown = s.post(f"{api}/plan", json=waiter, timeout=30).json()
    assert unknown["estimated_start"] is None and unknown["estimate_confidence"] is None
    s.post(f"{api}/jobs/{blocker['id']}/stop", timeout=5)
    wait_status(ma_service, blocker["id"], {"stopped"}, timeout=60)
    for seconds in (1, 1.2, 1.4):
        run_exp(seconds, wait=True)
    running = run_exp(600, wait=False)
    started = datetime.fromisoformat(running["started_at"]).timestamp()
    plan = s.post(f"{api}/plan", json=waiter, timeout=30).json()
    assert plan["can_start_now"] is False
    # the median of the three earlier runs (each a little longer than its sleep), from its start
    estimate = datetime.fromisoformat(plan["estimated_start"]).timestamp()
    assert started + 1.2 <= estimate <= started + 30, (started, plan)
    assert plan["estimate_confidence"] in ("medium", "low")
    assert any("exp typically runs" in note and "median of 3 runs" in note for note in plan["notes"]), plan
    s.post(f"{api}/jobs/{running['id']}/stop", timeout=5)


def test_batch_job_runs_each_task_with_its_algorithm_and_outputs_subfolder(ma_module_service, tmp_path):
    out = tmp_path / "out"
    writable_dir(out)
    algos = []
    for i in range(2):
        algo = tmp_path / f"algo{i}"
        algo.mkdir()
        (algo / "train.py").write_text(
            f"open('/workspace/outputs/result.txt', 'w').write('task {i} ran ' + open('/workspace/algorithm/train.py').read()[:5])\n"
            f"print('task {i} done')\n"
        )
        algos.append(algo)
    job = submit(
        ma_module_service,
        name="sweep",
        type="batch",
        outputs=str(out),
        tasks=[{"algorithm": str(a), "command": "python /workspace/algorithm/train.py"} for a in algos],
    )
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error"})
    assert final["status"] == "succeeded", final["reason"]
    assert sorted(n["name"] for n in final["nodes"]) == ["task-0", "task-1"]
    assert (out / "sweep-0" / "result.txt").read_text() == "task 0 ran open("
    assert (out / "sweep-1" / "result.txt").read_text() == "task 1 ran open("
    assert "task 1 done" in full_log(ma_module_service, job["id"], node="task-1")

    failing = submit(
        ma_module_service,
        name="sweep-bad",
        type="batch",
        tasks=[{"command": f"{PY} -c pass"}, {"command": f"{PY} -c 'import sys; sys.exit(4)'"}],
    )
    final = wait_status(ma_module_service, failing["id"], {"succeeded", "error"})
    assert final["status"] == "error" and "task-1" in final["reason"] and "code 4" in final["reason"]


def test_dry_run_plan_shows_argv_env_and_mounts_and_creates_nothing(ma_module_service, tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    r = ma_module_service.session().post(
        f"{ma_module_service.api}/plan",
        json={
            "name": "dry-plan",
            "command": "python train.py",
            "datasets": [{"name": "d", "path": str(data)}],
        },
        timeout=10,
    )
    assert r.status_code == 200, r.text
    plan = r.json()
    node = plan["nodes"][0]
    assert node["name"] == "worker-0" and node["argv"] == ["python", "train.py"]
    assert node["env"]["MA_JOB_NAME"] == "dry-plan"
    assert {"source": str(data), "target": "/workspace/dataset/private/d"}.items() <= {
        k: v for m in node["mounts"] for k, v in m.items() if m["target"].endswith("/d")
    }.items()
    assert node["workdir"] == "/workspace/algorithm"  # an empty working folder of the node's own
    assert plan["can_start_now"] is True
    listed = ma_module_service.session().get(
        f"{ma_module_service.api}/jobs", params={"name": "dry-plan"}, timeout=5
    )
    assert listed.json()["total"] == 0  # the module's service is shared: the jobs of this test's name


def test_data_preparation_copies_datasets_before_the_run(ma_module_service, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("prepared")
    single = tmp_path / "labels.csv"
    single.write_text("a,b\n")
    script = "print(open('/workspace/dataset/private/d/x.txt').read(), open('/workspace/dataset/private/f').read().strip())"
    job = submit(
        ma_module_service,
        command=pycmd(script),
        data_preparation=True,
        datasets=[{"name": "d", "path": str(data)}, {"name": "f", "path": str(single)}],
    )
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error"})
    assert final["status"] == "succeeded", final["reason"]
    assert "prepared a,b" in full_log(ma_module_service, job["id"])
    events = (
        ma_module_service.session().get(f"{ma_module_service.api}/jobs/{job['id']}/events", timeout=5).json()
    )
    assert any("dataset d: prepared 0.0 MB in" in e["reason"] for e in events)
    assert any("dataset f: prepared 0.0 MB in" in e["reason"] for e in events)
