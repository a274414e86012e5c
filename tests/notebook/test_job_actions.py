"""The job actions of a notebook: ``%ma_update``, ``%ma_delete`` of several jobs, ``%ma_jobs``'
search filters, and the monitor's priority and duration controls, against a real service."""

from __future__ import annotations

import pytest

from ma_jupyter.frontends.notebook import session
from ma_jupyter.models import JobStatus, Priority
from tests.helpers import wait_for
from tests.magic_shell import Run, one_line_error

pytestmark = pytest.mark.timeout(300)

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def _blocked(ma_shell):
    """A job filling node ``tiny`` and one queued behind it there."""
    run = Run(
        ma_shell,
        "%%ma_train --name blocker --spec cpu.medium --node-name tiny --grace 1 --no-follow --out blocker\n"
        + SLEEPER,
    )
    assert run.error is None, run.stdout + run.stderr
    blocker = ma_shell.user_ns["blocker"]
    wait_for(lambda: blocker.status is JobStatus.running, timeout=120)
    run = Run(
        ma_shell, "%%ma_train --name waiting --node-name tiny --no-follow --out waiting\nprint('ran')\n"
    )
    assert run.error is None, run.stdout + run.stderr
    waiting = ma_shell.user_ns["waiting"]
    assert waiting.status is JobStatus.queued
    return blocker, waiting


@pytest.mark.small_cluster
def test_ma_update_changes_priority_and_duration(ma_shell):
    blocker, waiting = _blocked(ma_shell)
    run = Run(ma_shell, f"%ma_update {waiting.id} --priority urgent")
    assert run.error is None, run.stdout + run.stderr
    assert "priority urgent" in run.stdout and "queued" in run.stdout
    assert waiting.refresh().spec.priority is Priority.urgent
    run = Run(ma_shell, f"%ma_update {blocker.id} --duration 2h")
    assert run.error is None, run.stdout + run.stderr
    assert "duration 2:00:00" in run.stdout
    assert blocker.refresh().spec.duration == 7200
    events = session.get_client().events(blocker.id)
    assert any("duration" in e.reason and e.by for e in events)
    # a running job's priority cannot change: one line saying so
    assert one_line_error(Run(ma_shell, f"%ma_update {blocker.id} --priority urgent")).startswith("Conflict:")
    assert "give --priority" in one_line_error(Run(ma_shell, f"%ma_update {blocker.id}"))


@pytest.mark.small_cluster
def test_the_monitor_changes_priority_and_duration(ma_shell):
    from ma_jupyter import JobMonitor

    blocker, waiting = _blocked(ma_shell)
    client = session.get_client()
    monitor = JobMonitor(waiting, client=client, start=False)
    try:
        assert not monitor.actions.priority_button.disabled  # queued: its priority may change
        monitor.actions.priority.value = "urgent"
        monitor.actions.priority_button.click()
        assert client.get(waiting.id).spec.priority is Priority.urgent
        assert "priority urgent set" in monitor.message.value
        monitor.actions.duration.value = "90m"
        monitor.actions.duration_button.click()
        assert client.get(waiting.id).spec.duration == 5400
    finally:
        monitor.close_monitor()
    running = JobMonitor(blocker, client=client, start=False)
    try:
        assert running.actions.priority_button.disabled  # running: only its duration may change
        running.actions.duration.value = "not a time"
        running.actions.duration_button.click()
        assert "not a duration" in running.message.value
        assert client.get(blocker.id).spec.duration is None
    finally:
        running.close_monitor()


def test_ma_delete_several_reports_each_and_fails_if_one_was_not_deleted(ma_module_shell):
    done = []
    for name in ("one", "two"):
        run = Run(ma_module_shell, f"%%ma_train --name {name} --out j\nprint('{name}')\n")
        assert run.error is None, run.stdout + run.stderr
        done.append(ma_module_shell.user_ns["j"])
    run = Run(ma_module_shell, f"%%ma_train --name live --no-follow --grace 1 --out live\n{SLEEPER}")
    live = ma_module_shell.user_ns["live"]
    run = Run(ma_module_shell, f"%ma_delete {done[0].id} {live.id} nope {done[1].id}")
    assert run.error is not None
    assert f"job {done[0].id} (one) deleted" in run.stdout and f"job {done[1].id} (two) deleted" in run.stdout
    assert f"job {live.id}: not deleted" in run.stdout and "job nope: not deleted: no job" in run.stdout
    assert "2 of 4 jobs not deleted" in run.stderr
    made = {live.id, *(h.id for h in done)}
    assert [h.id for h in session.get_client().jobs() if h.id in made] == [live.id]
    run = Run(ma_module_shell, f"%ma_delete {live.id} --force")
    assert run.error is None and "deleted" in run.stdout


def test_ma_jobs_filters_by_algorithm_favourites_creator_and_outputs(ma_module_shell, tmp_path):
    client = session.get_client()
    for name in ("mnist", "resnet"):
        (tmp_path / name).mkdir()
        # two algorithms: another code each (the same code in two folders is one algorithm)
        (tmp_path / name / "train.py").write_text(f"print('{name} ok')\n")
        client.submit(name=name, algorithm=str(tmp_path / name), command="python train.py").wait(timeout=120)
    ma_module_shell.user_ns["folder"] = str(tmp_path / "mnist")
    text = Run(ma_module_shell, "%ma_jobs --algorithm {folder}").text()
    assert "mnist" in text and "resnet" not in text
    assert text.splitlines()[-1].split()[-1] == "current"  # it ran the folder's current content
    assert "no jobs match" in Run(ma_module_shell, "%ma_jobs --favourites").text()
    ma_module_shell.user_ns["other"] = str(tmp_path / "resnet")
    marked = Run(ma_module_shell, "%ma_algorithms favourite {other}")
    assert marked.error is None and marked.stdout.strip() == f"favourite: {tmp_path / 'resnet'}"
    table = Run(ma_module_shell, "%ma_algorithms").text()
    assert str(tmp_path / "resnet") in table and str(tmp_path / "mnist") in table
    text = Run(ma_module_shell, "%ma_jobs --favourites").text()
    assert "resnet" in text and "mnist" not in text
    me = client.whoami().name
    assert "mnist" in Run(ma_module_shell, f"%ma_jobs --creator {me}").text()
    assert "no jobs match" in Run(ma_module_shell, "%ma_jobs --creator somebody-else").text()
    client.submit(name="saving", command="python -c pass", outputs=str(tmp_path / "saved-models")).wait(
        timeout=120
    )
    text = Run(ma_module_shell, "%ma_jobs --outputs saved-models").text()
    assert "saving" in text and "mnist" not in text
