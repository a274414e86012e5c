"""The magics in an in-process IPython shell, against a real job service on a temporary home.

Every magic is exercised for real (jobs run as real processes through the service), and every
magic's bad-argument path must print one line, never a traceback.
"""

from __future__ import annotations

import _thread
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from ma_jupyter.client import JobHandle
from ma_jupyter.frontends.notebook import live, session
from ma_jupyter.frontends.notebook import record as notebook_record
from ma_jupyter.models import JobStatus
from tests.helpers import BAR_FINAL, PROGRESS_BAR, wait_for, writable_dir
from tests.magic_shell import Run, one_line_error

pytestmark = pytest.mark.timeout(180)
#: the checkout the tests run from, first on a subprocess's PYTHONPATH
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# --------------------------------------------------------------------------- %%ma_train


def test_train_follows_logs_and_returns_handle(ma_module_shell):
    ma_module_shell.user_ns["count"] = 5
    run = Run(
        ma_module_shell,
        "%%ma_train --name hello --env COUNT={count} --out job\n"
        "import os\n"
        "for i in range(int(os.environ['COUNT'])):\n"
        "    print(f'line {i}', flush=True)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    handle = run.result.result
    assert isinstance(handle, JobHandle) and ma_module_shell.user_ns["job"] is handle
    assert handle.status is JobStatus.succeeded
    text = run.job_text()
    assert text.splitlines()[0].startswith(f"job {handle.id} (hello): succeeded")
    assert [line for line in text.splitlines() if line.startswith("line ")] == [f"line {i}" for i in range(5)]
    meta = run.job_metadata()
    assert meta["job_id"] == handle.id and meta["offsets"]["worker-0"] > 0
    # the body ran as the job's algorithm file, snapshotted under the home
    assert handle.info.spec.command == "python /workspace/algorithm/hello.py"
    assert "for i in range" in (
        handle.info.spec.algorithm and open(f"{handle.info.spec.algorithm}/hello.py").read()
    )
    assert handle.id in notebook_record.jobs()


def test_train_dry_run_prints_plan_and_submits_nothing(ma_module_shell, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    ma_module_shell.user_ns["data_dir"] = str(data)
    run = Run(
        ma_module_shell, "%%ma_train --name planned --dataset d={data_dir} --env A=1 --dry-run\nprint('x')"
    )
    assert run.error is None, run.stdout + run.stderr
    assert "dry run: nothing submitted" in run.stdout
    assert "[worker-0]" in run.stdout
    assert "argv:" in run.stdout and "/workspace/algorithm/planned.py" in run.stdout
    assert "A=1" in run.stdout
    assert str(data) in run.stdout and "/workspace/dataset/private/d" in run.stdout
    assert session.get_client().jobs(name="planned") == []


def test_train_code_dir_ships_folder_with_body(ma_module_shell, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "helper.py").write_text("GREETING = 'hello from the code dir'\n")
    ma_module_shell.user_ns["code_dir"] = str(code)
    run = Run(
        ma_module_shell,
        "%%ma_train --name withdir --code-dir {code_dir}\nimport helper\nprint(helper.GREETING, flush=True)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    assert "hello from the code dir" in run.job_text()
    # no body (the line form): the folder alone is the algorithm
    run = Run(
        ma_module_shell,
        "%ma_train --name onlydir --code-dir {code_dir} --command 'python -c \"import helper; print(helper.GREETING)\"'",
    )
    assert run.error is None, run.stdout + run.stderr
    assert "hello from the code dir" in run.job_text()


def test_failing_job_raises_one_line_error_with_last_lines(ma_module_shell):
    run = Run(
        ma_module_shell,
        "%%ma_train --name boom\nimport sys\nprint('about to fail', flush=True)\nsys.exit(3)\n",
    )
    assert isinstance(run.error, live.JobFailed)
    assert "Traceback" not in run.stdout
    assert run.stdout.startswith("JobFailed: job ")
    assert "ended error" in run.stdout and "about to fail" in run.stdout
    assert "error" in run.job_text().splitlines()[0]


def test_a_failed_cell_shows_the_jobs_traceback_once(ma_module_shell):
    run = Run(ma_module_shell, "%%ma_train --name twice\nraise ValueError('broken input')\n")
    assert isinstance(run.error, live.JobFailed)
    shown = run.job_text() + run.stdout + run.stderr
    assert shown.count("Traceback (most recent call last)") == 1, shown
    assert shown.count("ValueError: broken input") == 2, shown  # in the log, and named by the error
    assert "last log line: ValueError: broken input" in run.stdout
    assert "\n" not in run.job_text().splitlines()[0] and "last log lines" not in run.job_text()


def test_printed_lines_come_before_the_one_final_status(ma_module_shell, capsys):
    """Without a live display (papermill) the lines are printed as they come, and the display
    with the final status goes under them, the final status said there only."""
    run = Run(
        ma_module_shell,
        "%%ma_train --name order --no-follow --out order_job\nfor i in range(3): print('line', i, flush=True)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    handle = ma_module_shell.user_ns["order_job"]
    printed: list[str] = []
    seen: list[tuple[int, dict]] = []

    class Out:
        def write(self, text):
            printed.append(text)

        def flush(self):
            pass

    def display(bundle, **kwargs):
        seen.append((len(printed), bundle))

    import contextlib

    with contextlib.redirect_stdout(Out()):
        live.follow_job(session.get_client(), handle.id, display=display, live_display=False)
    text = "".join(printed)
    assert [f"line {i}" in text for i in range(3)] == [True] * 3, text
    assert len(seen) == 1, seen
    at, bundle = seen[0]
    assert at == len(printed), "the display comes after every printed line"
    assert ": succeeded" in bundle["text/plain"] and "3 log lines printed above" in bundle["text/plain"]
    assert ": succeeded" not in text  # the final status is the display's, not printed as well
    # %ma_jobs leaves out the plain success reason that would repeat on every row
    jobs = Run(ma_module_shell, "%ma_jobs --name order")
    assert "succeeded" in jobs.text() and "every node exited" not in jobs.text(), jobs.text()


def test_a_shell_command_body_is_refused_with_the_command_to_use_which_then_works(
    ma_module_shell, tmp_path, monkeypatch
):
    for body in ("python train.py --lr 0.1", "!python train.py --lr 0.1"):
        run = Run(ma_module_shell, f"%%ma_train --name cmd\n{body}\n")
        message = one_line_error(run)
        assert "the cell body is a shell command, not Python" in message
        assert '`%ma_train --command "python train.py --lr 0.1"`' in message
    assert session.get_client().jobs(name="cmd") == []  # refused before anything was submitted
    # the suggested line form runs the command, with the notebook's folder shipped
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import sys\nprint('lr is', sys.argv[2], flush=True)\n")
    monkeypatch.chdir(project)
    run = Run(ma_module_shell, '%ma_train --name cmdline --command "python train.py --lr 0.1"')
    assert run.error is None, run.stdout + run.stderr
    assert "lr is 0.1" in run.job_text()
    assert f"shipped {project}" in run.stdout


def test_a_kernel_variable_used_in_the_cell_gets_a_hint_on_how_to_pass_it(ma_module_shell):
    ma_module_shell.user_ns["learning_rate"] = 0.1
    run = Run(ma_module_shell, "%%ma_train --name uses-var\nprint(learning_rate * 2)\n")
    assert isinstance(run.error, live.JobFailed)
    assert "NameError: name 'learning_rate' is not defined" in run.stdout
    assert "hint: `learning_rate` is a variable of this notebook's kernel" in run.stdout
    assert "--env LEARNING_RATE={learning_rate}" in run.stdout
    # the hint's way works: the magic line expands {learning_rate}
    run = Run(
        ma_module_shell,
        "%%ma_train --name passes-var --env LEARNING_RATE={learning_rate}\n"
        "import os\nprint(float(os.environ['LEARNING_RATE']) * 2, flush=True)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    assert "0.2" in run.job_text().splitlines()
    # a name the kernel does not have either: the plain error, no hint
    run = Run(ma_module_shell, "%%ma_train --name typo\nprint(no_such_name)\n")
    assert isinstance(run.error, live.JobFailed)
    assert "NameError" in run.stdout and "hint:" not in run.stdout


def test_no_follow_returns_at_once(ma_module_shell):
    run = Run(ma_module_shell, "%%ma_train --name sleeper --no-follow\nimport time\ntime.sleep(30)\n")
    assert run.error is None, run.stderr
    handle = run.result.result
    assert handle.info.status in (JobStatus.queued, JobStatus.running)
    assert "submitted job" in run.job_text()
    handle.stop()


#: a fresh kernel's first cells (tests/magic_shell.py's Run, in a new interpreter)
FIRST_CELLS = r"""
import json, os, sys
from IPython.core.interactiveshell import InteractiveShell
import ma_jupyter
from ma_jupyter.client.snapshot import snapshots_root
from tests.magic_shell import Run

shell = InteractiveShell.instance()
ma_jupyter.load_ipython_extension(shell)
first = Run(shell, "%%ma_train --no-follow --name first\nprint('first')\n")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "pydantic_core", "ma_jupyter.models"))
handle = first.result.result
refused = Run(shell, "%%ma_train --no-follow --name bad --env 1A=x\nprint('bad')\n")
print(json.dumps({
    "error": repr(first.error), "loaded": loaded, "shown": first.job_text(), "repr": repr(handle),
    "plain_client": handle.client.plain, "info": type(handle.info).__module__ + "." + type(handle.info).__name__,
    "refused": repr(refused.error), "said": refused.stdout + refused.stderr,
    "snapshots": sorted(p.name for p in snapshots_root().iterdir()),
}))
handle.stop()
"""


def test_a_fresh_kernels_first_submit_loads_no_pydantic_and_a_bad_option_is_still_one_line(ma_home):
    """A fresh kernel's first ``%%ma_train --no-follow`` (bench/cli_speed.py times it) loads
    neither pydantic nor the models: the spec goes out unchecked and the answer is read plain
    (the handle's later calls are the ordinary client's).  A spec the service refuses for a rule
    of the wire model is the same one-line ``UsageError`` naming the field that the client-side
    check gave, and the snapshot the cell made is removed."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", FIRST_CELLS], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["error"] == "None", said
    assert said["loaded"] == [], said
    assert re.fullmatch(r"submitted job first-\w+ \(first\): (queued|running)", said["shown"]), said
    assert re.fullmatch(r"<JobHandle id=first-\w+ name=first status=(queued|running)>", said["repr"]), said
    assert said["plain_client"] is False, said
    assert said["info"] == "ma_jupyter.models.jobs.Job", said  # the model, fetched on first use
    assert said["refused"].startswith('UsageError("%%ma_train: env.1A.[key]: String should match pattern'), (
        said
    )
    assert "Traceback" not in said["said"], said
    assert len(said["snapshots"]) == 1 and said["snapshots"][0].startswith("first-"), said


def test_huge_log_keeps_newest_lines(ma_module_shell):
    run = Run(
        ma_module_shell,
        "%%ma_train --name chatty --lines 50\nfor i in range(5000):\n    print(f'row {i}')\n",
    )
    assert run.error is None, run.stderr
    text = run.job_text()
    rows = [line for line in text.splitlines() if line.startswith("row ")]
    assert rows == [f"row {i}" for i in range(4950, 5000)]
    assert "4950 earlier lines not shown" in text


def test_a_progress_bar_shows_its_final_state_in_the_cell(ma_module_shell, ma_module_home_env):
    run = Run(ma_module_shell, "%%ma_train --name bar --out bar\n" + PROGRESS_BAR)
    assert run.error is None, run.stdout + run.stderr
    lines = run.job_text().splitlines()
    assert lines[1:] == [BAR_FINAL, "after the bar"]
    # the log keeps the raw bytes: every redraw is still there
    raw = (
        ma_module_home_env / "jobs" / ma_module_shell.user_ns["bar"].id / "logs" / "worker-0.log"
    ).read_bytes()
    assert raw.count(b"\r") == 400 and len(raw) > 8000
    run = Run(ma_module_shell, f"%ma_logs {ma_module_shell.user_ns['bar'].id}")
    assert run.stdout.splitlines() == [BAR_FINAL, "after the bar"]


def _interrupt_after(predicate, timeout=60):
    """Raise KeyboardInterrupt in the main thread once ``predicate()`` holds."""

    def worker():
        try:
            wait_for(predicate, timeout=timeout)
        finally:
            _thread.interrupt_main()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    return thread


def _live_text(shell) -> str:
    """What the running cell's live job output shows now (while ``Run`` captures it)."""
    outputs = list(getattr(shell.display_pub, "outputs", ()))
    texts = [o["data"].get("text/plain", "") for o in outputs if (o["metadata"] or {}).get("ma_jupyter")]
    return texts[-1] if texts else ""


def _job_log(home, name_prefix=""):
    """The log of the newest job whose id starts with ``name_prefix`` (a name of the test's own)."""
    logs = sorted(home.glob(f"jobs/{name_prefix}*/logs/worker-0.log"))
    return logs[-1].read_text() if logs else ""


TICKS = 200
TICKER = (
    f"import time\nfor i in range({TICKS}):\n    print(f'tick {{i}}', flush=True)\n    time.sleep(0.02)\n"
)


# The ticker held after its line 30 until the test opens the gate (a file in a dataset folder):
# the job cannot end before the interrupted cell has detached, however slow the machine.
GATED_TICKER = (
    "import os, sys, time\n"
    f"for i in range({TICKS}):\n"
    "    print(f'tick {i}', flush=True)\n"
    "    deadline = time.monotonic() + 120\n"
    "    while i == 30 and not os.path.exists('/workspace/dataset/private/gate/open'):\n"
    "        if time.monotonic() > deadline:\n"
    "            sys.exit('the gate never opened')\n"
    "        time.sleep(0.02)\n"
    "    time.sleep(0.02)\n"
)


def test_interrupt_detaches_and_attach_continues_without_replay(ma_shell, ma_home, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    ma_shell.user_ns["gate_dir"] = str(gate)
    # once the cell shows the line before the gate: it has shown lines before the interrupt
    _interrupt_after(lambda: "tick 30" in _live_text(ma_shell))
    first = Run(ma_shell, "%%ma_train --name ticker --dataset gate={gate_dir} --out ticker\n" + GATED_TICKER)
    # the cell ends as interrupted, so "Run All" stops there; the job goes on
    assert isinstance(first.error, KeyboardInterrupt), (first.stdout, first.stderr)
    handle = ma_shell.user_ns["ticker"]
    said = first.job_text()
    assert f"detached: job {handle.id} keeps running" in said
    assert f"%ma_attach {handle.id}" in said and f"%ma_stop {handle.id}" in said
    assert f"%ma_logs {handle.id} --follow" in said
    assert handle.refresh().status is JobStatus.running  # interrupting did not stop the job
    shown_first = [line for line in first.job_text().splitlines() if line.startswith("tick ")]
    assert shown_first
    (gate / "open").touch()  # the job goes on to its end

    # a kernel restart: no variables, no client; the notebook record remains
    session._clients.clear()
    ma_shell.reset()
    second = Run(ma_shell, "%ma_attach --lines 1000")
    assert second.error is None, second.stderr
    text = second.job_text()
    assert "continuing where this notebook left off" in text
    shown_second = [line for line in text.splitlines() if line.startswith("tick ")]
    assert (
        shown_first + shown_second
        == [f"tick {i}" for i in range(TICKS)][: len(shown_first) + len(shown_second)]
    )
    assert shown_second[-1] == f"tick {TICKS - 1}"
    assert second.result.result.status is JobStatus.succeeded

    # a later attach has nothing new to show; following the log shows it from its start
    third = Run(ma_shell, "%ma_attach")
    assert "succeeded" in third.text() and not re.search(r"tick \d", third.text())
    fourth = Run(ma_shell, f"%ma_logs {handle.id} --follow --lines 1000")
    assert [line for line in fourth.job_text().splitlines() if line.startswith("tick ")] == [
        f"tick {i}" for i in range(TICKS)
    ]


def test_stop_on_interrupt_stops_the_job(ma_module_shell, ma_module_home_env):
    _interrupt_after(lambda: "tick 2\n" in _job_log(ma_module_home_env, "stopper-"))
    run = Run(ma_module_shell, "%%ma_train --name stopper --stop-on-interrupt --out stopper\n" + TICKER)
    assert isinstance(run.error, KeyboardInterrupt)
    handle = ma_module_shell.user_ns["stopper"]
    assert handle.wait(timeout=60).status is JobStatus.stopped


# --------------------------------------------------------------------------- line magics


def test_line_magics_manage_jobs(ma_module_shell):
    run = Run(ma_module_shell, "%%ma_train --name alpha --out a\nprint('alpha says hi', flush=True)\n")
    assert run.error is None, run.stderr
    a = ma_module_shell.user_ns["a"]
    run = Run(
        ma_module_shell,
        "%%ma_train --name beta --no-follow --out b\nimport time\nprint('beta', flush=True)\ntime.sleep(60)\n",
    )
    b = ma_module_shell.user_ns["b"]
    wait_for(lambda: b.status is JobStatus.running, timeout=60)

    run = Run(ma_module_shell, "%ma_jobs")
    assert "alpha" in run.text() and "beta" in run.text()
    html = [o.data["text/html"] for o in run.outputs if "text/html" in o.data][0]
    assert "<table" in html and a.id in html
    run = Run(ma_module_shell, "%ma_jobs --status running")
    assert "beta" in run.text() and "alpha" not in run.text()
    run = Run(ma_module_shell, "%ma_jobs --name alp")
    assert "alpha" in run.text() and "beta" not in run.text()

    run = Run(ma_module_shell, f"%ma_logs {a.id}")
    assert run.stdout.strip() == "alpha says hi"
    run = Run(ma_module_shell, "%ma_logs alpha --tail 1")  # a name works too
    assert run.stdout.strip() == "alpha says hi"

    run = Run(ma_module_shell, f"%ma_events {a.id}")
    assert "succeeded" in run.text() and "running" in run.text()

    run = Run(ma_module_shell, f"%ma_delete {b.id}")
    assert one_line_error(run).startswith("Conflict:")
    run = Run(ma_module_shell, f"%ma_stop {b.id}")
    assert "stop requested" in run.stdout
    assert b.wait(timeout=60).status is JobStatus.stopped
    run = Run(ma_module_shell, f"%ma_delete {b.id}")
    assert "deleted" in run.stdout
    assert [h.id for h in session.get_client().jobs() if h.id in (a.id, b.id)] == [a.id]

    # a clone's dry run plans it and leaves the source job's code where that job keeps it
    run = Run(ma_module_shell, f"%ma_clone {a.id} --name alpha3 --dry-run")
    assert run.error is None, run.stdout + run.stderr
    assert Path(a.info.spec.algorithm).is_dir(), "the dry run removed the source job's code"
    run = Run(ma_module_shell, f"c = %ma_clone {a.id} --name alpha2 --env X=1")
    assert run.error is None, run.stdout + run.stderr
    clone = ma_module_shell.user_ns["c"]
    assert clone.status is JobStatus.succeeded and clone.name == "alpha2"
    assert clone.info.spec.env == {"X": "1"} and clone.info.spec.command == a.info.spec.command
    assert "alpha says hi" in run.job_text()


def test_specs_table_shows_free_capacity(ma_module_shell):
    run = Run(ma_module_shell, "%ma_specs")
    assert run.error is None, run.stderr
    text = run.text()
    assert "cpu.small" in text and "free now" in text and "nodes" in text


def test_cluster_shows_nodes_specs_queue_and_demand(ma_module_shell):
    run = Run(ma_module_shell, "%ma_cluster --spec cpu.small")
    assert run.error is None, run.stderr
    assert "CAN START NOW" in run.stdout and "cpu.small" in run.stdout
    # the spec filter keeps the chosen spec's row only (the nodes' SPECS column still lists
    # every spec that fits each node)
    assert not any(line.startswith("gpu.emu-2") for line in run.stdout.splitlines())
    assert "queue: empty" in run.stdout and "queued card demand: none" in run.stdout


@pytest.mark.parametrize("own_outputs", [True, False], ids=["--output", "default-outputs"])
def test_tensorboard_iframe_and_inline_png(ma_module_shell, tmp_path, own_outputs):
    out = tmp_path / "outputs"
    writable_dir(out)
    ma_module_shell.user_ns["out_dir"] = str(out)
    # without --output the job still has an outputs folder (made for it): TensorBoard reads that
    output_option = "--output {out_dir} " if own_outputs else ""
    run = Run(
        ma_module_shell,
        f"%%ma_train --name scalars {output_option}--out job\n"
        "import time\n"
        "from tensorboard.compat.proto import event_pb2, summary_pb2\n"
        "from tensorboard.summary.writer.record_writer import RecordWriter\n"
        "import os\n"
        "os.makedirs('/workspace/outputs/run-a', exist_ok=True)\n"
        "with open(f'/workspace/outputs/run-a/events.out.tfevents.{int(time.time())}.x', 'wb') as fh:\n"
        "    w = RecordWriter(fh)\n"
        "    for step in range(5):\n"
        "        v = summary_pb2.Summary.Value(tag='loss', simple_value=1.0 / (step + 1))\n"
        "        w.write(event_pb2.Event(step=step, wall_time=time.time(), summary=summary_pb2.Summary(value=[v])).SerializeToString())\n"
        "print('wrote scalars', flush=True)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    job = ma_module_shell.user_ns["job"]
    folder = job.refresh().outputs_folder
    assert (folder == str(out)) if own_outputs else folder.endswith(f"/{job.id}/outputs"), folder
    run = Run(ma_module_shell, "%ma_tensorboard {job.id} --inline")
    assert run.error is None, run.stdout + run.stderr
    pngs = [o.data["image/png"] for o in run.outputs if "image/png" in o.data]
    assert pngs and len(pngs[0]) > 1000

    run = Run(ma_module_shell, "url = %ma_tensorboard {job.id}")
    assert run.error is None, run.stdout + run.stderr
    url = ma_module_shell.user_ns["url"]
    assert f"/tb/{job.id}/" in url
    assert any("<iframe" in o.data.get("text/html", "") for o in run.outputs)
    assert requests.get(url + "data/runs", timeout=30).json() == ["run-a"]
    run = Run(ma_module_shell, "%ma_tensorboard {job.id} --via-jupyter /user/me/")
    frames = [o.data.get("text/html", "") for o in run.outputs]
    assert any(f'src="/user/me/ma-jupyter/tensorboard/{job.id}/"' in f for f in frames), frames
    run = Run(ma_module_shell, "%ma_tensorboard {job.id} --stop")
    assert "stopped" in run.stdout
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "data/runs", timeout=5)

    # the monitor's buttons do the same
    from ma_jupyter import JobMonitor

    monitor = JobMonitor(job, client=session.get_client(), start=False)
    monitor.plot_button.click()
    assert "data:image/png;base64," in monitor.extra.children[0].value
    monitor.tb_button.click()
    frame = monitor.extra.children[0].value
    assert f"/tb/{job.id}/" in frame and "<iframe" in frame


def test_a_notebook_run_twice_keeps_its_names_working(ma_module_shell):
    """Two jobs called envtest (the notebook ran twice): the name means the newer one, with a
    note naming its id, in every magic that takes a JOB."""
    first = Run(ma_module_shell, "%%ma_train --name envtest --out first\nprint('run one', flush=True)\n")
    second = Run(ma_module_shell, "%%ma_train --name envtest --out second\nprint('run two', flush=True)\n")
    assert first.error is None and second.error is None, second.stderr
    newer = ma_module_shell.user_ns["second"]
    run = Run(ma_module_shell, "%ma_logs envtest")
    assert run.error is None, run.stdout + run.stderr
    assert run.stdout.strip() == "run two"
    assert f"your newest job of that name, {newer.id}" in run.stderr
    run = Run(ma_module_shell, "%ma_events envtest")
    assert run.error is None and newer.id in run.stderr


def test_ma_logs_follow_from_start_and_rank_node_options(ma_module_shell):
    run = Run(
        ma_module_shell, "%%ma_train --name twice --no-follow --out t\nprint('only once', flush=True)\n"
    )
    handle = ma_module_shell.user_ns["t"]
    handle.wait(timeout=60)
    run = Run(ma_module_shell, f"%ma_logs {handle.id} --follow")
    assert run.job_text().count("only once") == 1
    run = Run(ma_module_shell, f"%ma_logs {handle.id} --follow")
    # from the start again: no follow of this job runs in the kernel now
    assert run.job_text().count("only once") == 1 and "continuing" not in run.job_text()
    run = Run(ma_module_shell, f"%ma_logs {handle.id} --follow --from-start")
    assert run.job_text().count("only once") == 1
    run = Run(ma_module_shell, f"%ma_logs {handle.id} --node worker-0")
    assert run.stdout.strip() == "only once"
    run = Run(ma_module_shell, f"%ma_logs {handle.id} --node nope")
    assert one_line_error(run).startswith("NotFound:")
    run = Run(ma_module_shell, f"%ma_logs {handle.id} --node nope --follow")
    assert one_line_error(run).startswith("NotFound:")
    run = Run(ma_module_shell, f"%ma_logs {handle.id} --node worker-0 --follow --from-start")
    assert run.job_text().count("only once") == 1


def test_several_nodes_prefix_each_line(ma_module_shell):
    # TensorFlow mode only sets TF_CONFIG per task and runs the command as written: two cheap nodes
    run = Run(
        ma_module_shell,
        "%%ma_train --name twonodes --mode tensorflow --nodes 2\n"
        "import json, os\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "print(f\"I am {task['type']} {task['index']}\", flush=True)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    lines = run.job_text().splitlines()
    assert "[worker-0] I am worker 0" in lines
    assert "[worker-1] I am worker 1" in lines
    # the cell's metadata keeps how far each node's log was shown: %ma_attach continues there
    offsets = run.job_metadata()["offsets"]
    assert set(offsets) == {"worker-0", "worker-1"} and all(offsets.values()), offsets
    # --follow-node narrows the cell to one node, its lines as the node printed them
    narrowed = Run(
        ma_module_shell,
        "%%ma_train --name onenode --mode tensorflow --nodes 2 --follow-node worker-1\n"
        "import json, os\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "print(f\"I am {task['type']} {task['index']}\", flush=True)\n",
    )
    assert narrowed.error is None, narrowed.stdout + narrowed.stderr
    shown = narrowed.job_text().splitlines()
    assert "I am worker 1" in shown and not any("worker 0" in line for line in shown), shown


@pytest.mark.small_cluster
def test_queued_job_shows_its_queue_position(ma_shell, ma_home):
    from ma_jupyter import JobMonitor

    run = Run(
        ma_shell,
        "%%ma_train --name blocker --spec cpu.medium --node-name tiny --grace 1 --no-follow --out blocker\n"
        "import time\ntime.sleep(600)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    blocker = ma_shell.user_ns["blocker"]
    wait_for(lambda: blocker.status is JobStatus.running, timeout=60)
    run = Run(
        ma_shell, "%%ma_train --name waiting --node-name tiny --no-follow --out waiting\nprint('ran')\n"
    )
    waiting = ma_shell.user_ns["waiting"]
    assert waiting.status is JobStatus.queued
    assert "queued (#1)" in Run(ma_shell, "%ma_jobs").text()
    monitor = JobMonitor(waiting, client=session.get_client())
    try:
        wait_for(lambda: "position 1 in the queue" in monitor.info.value, timeout=10)
        assert "ma-status-queued" in monitor.badge.value
        blocker.stop()
        wait_for(lambda: "ma-status-succeeded" in monitor.badge.value, timeout=60)
        wait_for(lambda: monitor.log_text() == "ran", timeout=30)
    finally:
        monitor.close_monitor()


def test_attach_finds_jobs_in_the_saved_notebook(ma_module_shell, tmp_path, monkeypatch):
    run = Run(ma_module_shell, "%%ma_train --name saved --out s\nprint('first line', flush=True)\n")
    assert run.error is None, run.stderr
    handle = ma_module_shell.user_ns["s"]
    # the notebook as Jupyter saved it: the cell's output carries the job id and offsets
    output = {
        "output_type": "display_data",
        "data": {"text/plain": run.job_text()},
        "metadata": {"ma_jupyter": run.job_metadata()},
    }
    cell = {"cell_type": "code", "source": "%%ma_train ...", "metadata": {}, "outputs": [output]}
    path = tmp_path / "saved.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    # another kernel for that notebook, with no record of its own
    monkeypatch.setenv("JPY_SESSION_NAME", str(path))
    session._clients.clear()
    ma_module_shell.reset()
    assert notebook_record.jobs() == [handle.id]
    run = Run(ma_module_shell, f"%ma_attach {handle.id}")
    assert run.error is None, run.stderr
    assert "first line" not in run.job_text()  # shown in the saved notebook already
    assert "succeeded" in run.job_text().splitlines()[0]


def test_follow_survives_a_service_crash(ma_shell, ma_home):
    import os
    import signal

    killed = []

    def crash():
        wait_for(lambda: "tick 20\n" in _job_log(ma_home), timeout=60)
        killed.append(json.loads((ma_home / "service.json").read_text())["pid"])
        os.kill(killed[0], signal.SIGKILL)

    thread = threading.Thread(target=crash, daemon=True)
    thread.start()
    run = Run(ma_shell, "%%ma_train --name survivor --lines 1000\n" + TICKER)
    thread.join(5)
    assert killed and json.loads((ma_home / "service.json").read_text())["pid"] != killed[0]
    assert run.error is None, run.stdout + run.stderr
    ticks = [line for line in run.job_text().splitlines() if line.startswith("tick ")]
    assert ticks == [f"tick {i}" for i in range(TICKS)]  # none lost, none twice
    assert "succeeded" in run.job_text().splitlines()[0]


def test_a_performance_alert_shows_in_the_followed_cell_and_is_marked_in_events(ma_module_shell):
    run = Run(
        ma_module_shell,
        "%%ma_train --name slowish --resume 1 --perf-threshold 0.5 --perf-policy alert --out job\n"
        "import time\n"
        "print('hardware time is 9 and e2e time is 10', flush=True)\n"
        "time.sleep(1.5)\n",
    )
    assert run.error is None, run.stdout + run.stderr
    text = run.job_text()
    assert "ALERT" in text and "performance alert on worker-0" in text, text
    handle = run.result.result
    events = Run(ma_module_shell, f"%ma_events {handle.id}")
    assert "ALERT: performance alert on worker-0" in events.text(), events.text()


def test_job_text_never_drives_a_terminal_and_its_html_is_escaped(ma_module_shell):
    hostile = (
        "print('clip \\x1b]52;c;ZWNobyBwd25lZA==\\x07 title \\x1b]0;t\\x07 \\x1b[2J\\x1b[1;1H c1 \\x9b2J', flush=True)\n"
        "print('\\x1b[32mgreen\\x1b[0m <img src=x onerror=alert(1)>', flush=True)\n"
        "raise SystemExit(3)\n"
    )
    run = Run(ma_module_shell, "%%ma_train --name ctl --out c\n" + hostile)
    handle = ma_module_shell.user_ns.get("c") or session.get_client().jobs(name="ctl")[0]
    shown = "clip ^[]52;c;ZWNobyBwd25lZA==^G title ^[]0;t^G ^[[2J^[[1;1H c1 \\x9b2J"

    def inert(text: str) -> bool:
        bare = re.sub(r"\x1b\[[0-9;]*m", "", text)  # colours may stay: an output area shows them
        return not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", bare)

    # the followed cell
    assert shown in run.job_text() and inert(run.job_text()), run.job_text()
    # %ma_logs
    logs = Run(ma_module_shell, f"%ma_logs {handle.id}")
    assert shown in logs.stdout and "\x1b[32mgreen\x1b[0m" in logs.stdout and inert(logs.stdout), logs.stdout
    # the plain stream (papermill, a terminal IPython) of the live log: colours only on a terminal
    import io

    plain = io.StringIO()
    printed = live.LiveLog(handle.id, display=lambda *a, **k: None, stream_to=plain)
    printed.add([(("worker-0", None), line) for line in handle.logs(follow=False)])
    printed.say("status of \x1b]0;job\x07")
    assert shown in plain.getvalue() and "green" in plain.getvalue() and "\x1b" not in plain.getvalue()
    assert "status of ^[]0;job^G" in plain.getvalue()
    # %ma_events as HTML: the reason (the log's tail) escaped
    events = Run(ma_module_shell, f"%ma_events {handle.id}")
    html = "".join(o.data.get("text/html", "") for o in events.outputs)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html, html
    plain = "".join(o.data.get("text/plain", "") for o in events.outputs)  # a terminal IPython's
    assert "^[[2J^[[1;1H" in plain and inert(plain), plain
