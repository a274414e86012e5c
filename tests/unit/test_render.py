"""The front ends' texts: a job's status line and the dry-run plans."""

from __future__ import annotations

from ma_jupyter.frontends import render
from ma_jupyter.models import JobStatus


def test_status_line_covers_every_state():
    from datetime import UTC, datetime, timedelta

    from ma_jupyter.models import Job, JobSpec

    spec = JobSpec(name="s", command="python x.py", duration=600)
    now = datetime.now(UTC)
    queued = Job(id="j", spec=spec, status=JobStatus.queued, queue_position=1)
    assert "position 2 in the queue" in render.status_line(queued, now)
    running = Job(id="j", spec=spec, status=JobStatus.running, started_at=now - timedelta(seconds=65))
    line = render.status_line(running, now)
    assert "0:01:05 elapsed" in line and "0:08:55 left" in line
    done = Job(
        id="j",
        spec=spec,
        status=JobStatus.error,
        started_at=now - timedelta(seconds=10),
        finished_at=now,
        exit_code=3,
        reason="worker-0 exited with 3",
    )
    line = render.status_line(done)
    assert "error after 0:00:10" in line and "exit code 3" in line and "worker-0 exited" in line


def _plan():
    from ma_jupyter.models import Mount, NodeLaunch, Plan

    node = NodeLaunch(
        name="worker-0",
        role="worker",
        index=0,
        hostname="worker-0",
        argv=["python", "train.py", "--lr", "${LR}"],
        env={"LR": "0.1"},
        files={"/etc/mpi/hostfile": "worker-0 slots=2\nworker-1 slots=2\n"},
        mounts=[
            Mount(source="/data/d", target="/workspace/dataset/private/d", read_only=True, kind="dataset")
        ],
    )
    return Plan(spec="cpu.small", nodes=[node], can_start_now=True, notes=["ports are 0 in a dry run"])


def test_the_cli_plan_shows_every_file_line():
    text = render.plan_text(_plan())
    assert text.startswith("spec cpu.small: can start now\nnote: ports are 0 in a dry run\n")
    assert "node worker-0 (worker 0, hostname worker-0)" in text
    assert "  argv:    python train.py --lr '${LR}'" in text
    assert "      | worker-0 slots=2\n      | worker-1 slots=2" in text
    assert "    /workspace/dataset/private/d <- /data/d (ro)" in text


def test_the_notebook_plan_shows_the_first_file_line():
    text = render.plan_summary(_plan())
    assert text.startswith("plan on spec cpu.small: 1 node(s), can start now (dry run: nothing submitted)")
    assert "[worker-0] role=worker index=0 hostname=worker-0" in text
    assert "    /etc/mpi/hostfile: worker-0 slots=2 …" in text
    assert "    /workspace/dataset/private/d <- /data/d (ro)" in text


def test_tables_as_text_and_html():
    bundle = render.table_bundle(["id", "status"], [["a-1", "running"], ["b", None]])
    assert bundle["text/plain"] == "id   status\na-1  running\nb"
    assert "<th>status</th>" in bundle["text/html"] and "<td>a-1</td>" in bundle["text/html"]


def test_cli_texts_and_badges():
    assert render.one_line("a\n  b\tc") == "a b c"
    assert render.clock(None) == "-"
    assert render.text_table([["id", "status"], ["a-1", "running"]]) == "id   status\na-1  running\n"
    badge = render.status_badge(JobStatus.error)
    assert "ma-status-error" in badge and ">error</span>" in badge
