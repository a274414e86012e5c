"""Watching a job live: a line the job is still redrawing with ``\\r`` (a progress bar, no
newline yet) is shown as it stands while the job runs, by the CLI's ``--follow`` on a terminal,
the notebook's live output and the follower under both; Ctrl-C detaches visibly.

The job is real and hostile to a line-based follower: it redraws one line and then waits, with
the newline still to come, until the test has seen that state (a file the test makes, in a
folder the job mounts), so a follower that shows only whole lines never gets there.  The tests
assert on the sequence of states seen, never on timing.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import threading

import pytest

from ma_jupyter.client.logs import JobFollower
from ma_jupyter.frontends.notebook import live
from ma_jupyter.frontends.render import visible_line
from ma_jupyter.models import JobStatus
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(300)

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3
GO = "/workspace/dataset/private/go"
# each state is redrawn over the last, then the job waits (bounded) for the test to have seen it
REDRAWING = (
    "import os, sys, time\n"
    "print('starting', flush=True)\n"
    f"for i in range(1, {STEPS + 1}):\n"
    f"    sys.stdout.write(f'\\rstep {{i}}/{STEPS} ' + '#' * i)\n"
    "    sys.stdout.flush()\n"
    "    deadline = time.time() + 90\n"
    f"    while not os.path.exists(f'{GO}/{{i}}') and time.time() < deadline:\n"
    "        time.sleep(0.02)\n"
    "sys.stdout.write(' done\\n')\n"
    "print('after the bar', flush=True)\n"
)
FINAL = f"step {STEPS}/{STEPS} {'#' * STEPS} done"


def _state(i: int) -> str:
    return f"step {i}/{STEPS} {'#' * i}"


def _env(home) -> dict:
    """The CLI's environment: the owner of ``home``'s service (its runtime file), whatever the
    test's own environment names."""
    return {
        **{
            key: value
            for key, value in os.environ.items()
            if key not in ("MA_JUPYTER_TOKEN", "MA_JUPYTER_URL")
        },
        "MA_JUPYTER_HOME": str(home),
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


class _Reader(threading.Thread):
    """Collects what a process writes on ``fd`` (a pty's main side or a pipe) as it comes."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd = fd
        self.data = b""
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the pty's side closed
                return
            if not chunk:
                return
            with self.lock:
                self.data += chunk

    def text(self) -> str:
        with self.lock:
            return self.data.decode("utf-8", "replace")


def _go_folder(tmp_path):
    folder = tmp_path / "go"
    folder.mkdir()
    return folder


def test_cli_follow_on_a_terminal_shows_a_redrawn_line_before_its_newline(ma_module_service, tmp_path):
    go = _go_folder(tmp_path)
    main, side = pty.openpty()
    proc = subprocess.Popen(
        [PY, "-m", "ma_jupyter.frontends.cli", "submit", "--follow", "--name", "bar", "--dataset", f"go={go}"]
        + ["--", PY, "-c", REDRAWING],
        env=_env(ma_module_service.home),
        cwd=tmp_path,
        stdout=side,
        stderr=side,
    )
    os.close(side)
    reader = _Reader(main)
    reader.start()
    try:
        seen_at: list[int] = []
        for i in range(1, STEPS + 1):
            # the job holds this state (no newline) until the test has seen it on the terminal
            wait_for(lambda i=i: _state(i) in reader.text(), timeout=90)
            assert FINAL not in reader.text()
            seen_at.append(reader.text().index(_state(i)))
            (go / str(i)).touch()
        assert proc.wait(timeout=120) == 0
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    out = reader.text()
    assert seen_at == sorted(seen_at)  # the states came in order, each replacing the last
    assert "\r\x1b[K" in out  # redrawn in place: the row is cleared for the next state
    # the finished line is printed once, whole, as a terminal shows it
    lines = [line.rsplit("\x1b[K", 1)[-1] for line in out.replace("\r\n", "\n").split("\n")]
    assert lines.count(FINAL) == 1, out
    assert lines.index(FINAL) < lines.index("after the bar")


def test_a_pipe_gets_whole_lines_only(ma_module_service, tmp_path):
    """A pipe (a file, `tee`) is not redrawn: only the final state of the line, once."""
    go = _go_folder(tmp_path)
    for i in range(1, STEPS + 1):
        (go / str(i)).touch()
    done = subprocess.run(
        [PY, "-m", "ma_jupyter.frontends.cli", "submit", "--follow", "--name", "bar", "--dataset", f"go={go}"]
        + ["--", PY, "-c", REDRAWING],
        env=_env(ma_module_service.home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"starting\n{FINAL}\nafter the bar\n"), done.stdout


class _Cell:
    """A notebook cell's display: every text it was updated to, in order."""

    def __init__(self):
        self.texts: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, bundle, **_):
        self.record(bundle)
        return self

    def update(self, bundle, **_):
        self.record(bundle)

    def record(self, bundle) -> None:
        with self.lock:
            self.texts.append(bundle["text/plain"])

    def last(self) -> str:
        with self.lock:
            return self.texts[-1] if self.texts else ""


def test_the_notebook_cell_shows_the_redrawn_line_as_it_stands(ma_module_client, tmp_path):
    go = _go_folder(tmp_path)
    handle = ma_module_client.submit(
        name="bar", command=f"{PY} -c {_quoted(REDRAWING)}", datasets=[{"name": "go", "path": str(go)}]
    )
    cell = _Cell()
    states: list[str] = []

    def release() -> None:
        for i in range(1, STEPS + 1):
            # the cell's last line is the state, alone: replaced in place, not a line added per state
            wait_for(lambda i=i: cell.last().splitlines()[-1:] == [_state(i)], timeout=90)
            states.append(cell.last())
            (go / str(i)).touch()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    job = live.follow_job(ma_module_client, handle.id, display=cell, live_display=True)
    thread.join(timeout=30)
    assert job.status is JobStatus.succeeded
    assert len(states) == STEPS
    for i, text in enumerate(states, 1):
        assert text.splitlines()[-2:] == ["starting", _state(i)]
    # the saved output keeps the last state only, as a line
    assert cell.last().splitlines()[-2:] == [FINAL, "after the bar"]
    assert not any(_state(i) in cell.last() for i in range(1, STEPS))


def test_the_monitor_widget_shows_the_redrawn_line_as_it_stands(ma_module_client, tmp_path):
    from ma_jupyter.frontends.notebook.widgets.monitor import JobMonitor

    go = _go_folder(tmp_path)
    handle = ma_module_client.submit(
        name="bar", command=f"{PY} -c {_quoted(REDRAWING)}", datasets=[{"name": "go", "path": str(go)}]
    )
    monitor = JobMonitor(handle, client=ma_module_client)
    try:
        for i in range(1, STEPS + 1):
            wait_for(lambda i=i: monitor.log_text().splitlines() == ["starting", _state(i)], timeout=90)
            (go / str(i)).touch()
        wait_for(lambda: not monitor.following, timeout=90)
        assert monitor.log_text().splitlines() == ["starting", FINAL, "after the bar"]
    finally:
        monitor.close_monitor()


def test_a_ranks_redrawn_line_is_shown_live_with_its_rank(ma_module_client, tmp_path):
    """Behind a launcher's rank splitter the node log gets a rank's redrawn line whole, at its
    newline; meanwhile the follower shows it from the rank's own log, labelled as in the node log."""
    go = _go_folder(tmp_path)
    ranked = f"{PY} -m ma_jupyter.nodeside.rank_log --rank=1 {PY} -c {_quoted(REDRAWING)}"
    handle = ma_module_client.submit(
        name="ranked", command=ranked, datasets=[{"name": "go", "path": str(go)}]
    )
    cell = _Cell()

    def release() -> None:
        for i in range(1, STEPS + 1):
            wait_for(lambda i=i: cell.last().splitlines()[-1:] == [f"[rank 1] {_state(i)}"], timeout=90)
            (go / str(i)).touch()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    job = live.follow_job(ma_module_client, handle.id, display=cell, live_display=True)
    thread.join(timeout=30)
    assert job.status is JobStatus.succeeded, cell.last()
    assert cell.last().splitlines()[-3:] == [
        "[rank 1] starting",
        f"[rank 1] {FINAL}",
        "[rank 1] after the bar",
    ]


def test_the_follower_gives_the_unfinished_line_before_its_newline(ma_module_client, tmp_path):
    go = _go_folder(tmp_path)
    handle = ma_module_client.submit(
        name="bar", command=f"{PY} -c {_quoted(REDRAWING)}", datasets=[{"name": "go", "path": str(go)}]
    )
    follower = JobFollower(ma_module_client, handle.info)
    seen: list[tuple[str, str]] = []  # ("line", text) or ("partial", text), in order
    released = 0
    for items, partials in follower.updates():
        seen += [("line", line) for _, line in items]
        seen += [("partial", visible_line(text)) for text in partials.values() if text]
        if released < STEPS and seen[-1:] == [("partial", _state(released + 1))]:
            released += 1
            (go / str(released)).touch()
    states = [_state(i) for i in range(1, STEPS + 1)]
    # each state, in order (a read may also have caught one half written: it is replaced too)
    assert [text for kind, text in seen if kind == "partial" and text in states] == states
    lines = [text for kind, text in seen if kind == "line"]
    assert lines[0] == "starting" and lines[-1] == "after the bar"
    assert lines[1].endswith(" done") and lines[1].count("\r") == STEPS
    assert follower.offsets["worker-0"] == len(f"starting\n{lines[1]}\nafter the bar\n".encode())


def _quoted(code: str) -> str:
    import shlex

    return shlex.quote(code)


def test_ctrl_c_detaches_and_says_how_to_come_back(ma_module_client, ma_module_service, tmp_path):
    proc = subprocess.Popen(
        [PY, "-m", "ma_jupyter.frontends.cli", "submit", "--follow", "--name", "long", "--"]
        + [PY, "-c", "import time\nprint('running', flush=True)\ntime.sleep(300)\n"],
        env=_env(ma_module_service.home),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = _Reader(proc.stdout.fileno()), _Reader(proc.stderr.fileno())
    out.start()
    err.start()
    try:
        wait_for(lambda: "running" in out.text(), timeout=90)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        out.join(timeout=30)
        err.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = err.text()
    job_id = said.split("submitted ", 1)[1].split()[0]
    assert f"detached: job {job_id} keeps running" in said, said
    assert f"ma-jupyter logs {job_id} --follow" in said and f"ma-jupyter stop {job_id}" in said
    assert f"%ma_attach {job_id}" in said
    assert ma_module_client.get(job_id).status is JobStatus.running  # the interrupt only detached
    ma_module_client.stop(job_id)


def test_stop_on_interrupt_stops_the_job(ma_module_client, ma_module_service, tmp_path):
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "ma_jupyter.frontends.cli",
            "submit",
            "--follow",
            "--stop-on-interrupt",
            "--name",
            "long",
            "--",
        ]
        + [PY, "-c", "import time\nprint('running', flush=True)\ntime.sleep(300)\n"],
        env=_env(ma_module_service.home),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = _Reader(proc.stdout.fileno()), _Reader(proc.stderr.fileno())
    out.start()
    err.start()
    try:
        wait_for(lambda: "running" in out.text(), timeout=90)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        err.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    job_id = err.text().split("submitted ", 1)[1].split()[0]
    assert f"stop requested for job {job_id}" in err.text()
    assert ma_module_client.job(job_id).wait(timeout=60).status is JobStatus.stopped
