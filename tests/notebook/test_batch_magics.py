"""A batch job in the notebook: ``%ma_jobs --type batch`` lists only batch jobs with their tasks
counted by status, and the status line a followed job shows names the failed task."""

from __future__ import annotations

import sys

from ma_jupyter.frontends.notebook import session
from ma_jupyter.frontends.render import status_line
from tests.magic_shell import Run

PY = sys.executable


def test_ma_jobs_filters_batch_jobs_and_counts_their_tasks(ma_shell, ma_home):
    client = session.get_client()
    batch = client.submit(
        name="sweep",
        type="batch",
        tasks=[{"command": f"{PY} -c pass"}, {"command": f"{PY} -c 'import sys; sys.exit(2)'"}],
    )
    regular = client.submit(name="plain", command=f"{PY} -c pass")
    done = batch.wait(timeout=120, check=False)
    regular.wait(timeout=120)
    assert [t.status for t in done.tasks] == ["succeeded", "failed"]

    text = Run(ma_shell, "%ma_jobs --type batch").text()
    assert "sweep" in text and "plain" not in text
    assert "tasks: 1 succeeded, 1 failed (task-1)" in text
    assert "plain" in Run(ma_shell, "%ma_jobs --type regular").text()
    line = status_line(done)
    assert line.startswith(f"job {batch.id} (sweep): error") and "1 failed (task-1)" in line
