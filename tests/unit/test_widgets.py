"""The widgets against a real job service: form rules and submit, live monitor, panel table.

The widgets run without a browser here (ipywidgets keeps their state in Python); the browser
test drives the same widgets in JupyterLab.
"""

from __future__ import annotations

import pytest

from ma_jupyter import magics
from ma_jupyter.models import JobStatus
from ma_jupyter.widgets import JobForm, JobMonitor, panel
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ma_widget_client(ma_home):
    magics._clients.clear()
    client = magics.get_client()
    yield client
    try:
        for handle in client.jobs(status=["running", "queued"]):
            handle.stop()
    finally:
        client.shutdown_service()
        magics._clients.clear()


def test_form_rules_and_inline_validation(ma_widget_client):
    form = JobForm(client=ma_widget_client)
    assert set(form.specs.options) >= {"cpu.small", "cpu.medium"}
    assert "command is required" in form.errors.value and form.submit_button.disabled
    form.command.value = "python -c 'print(1)'"
    assert "ready to submit" in form.errors.value and not form.submit_button.disabled
    # ps and chief only for tensorflow
    assert form.tf_box.layout.display == "none"
    form.mode.value = "tensorflow"
    assert form.tf_box.layout.display is None
    form.ps.value = 1
    assert form.spec_dict()["ps"] == 1
    form.mode.value = "pytorch"
    assert form.ps.value == 0 and "ps" not in form.spec_dict()
    # fault restart and checkpoint resume exclude each other
    form.fault_restart.value = True
    form.checkpoint_resume.value = True
    assert not form.fault_restart.value
    assert "fault_restart" not in form.spec_dict() and form.spec_dict()["checkpoint_resume"] == {
        "max_resumes": 3
    }
    # inline messages come from the wire model
    form.mode.value = "single"
    form.name.value = "no spaces allowed"
    assert "name:" in form.errors.value and form.submit_button.disabled
    form.name.value = "ok"
    form.add_mount_row("model", "m", "/tmp", read_only=False)
    assert form.spec_dict()["models"] == [{"name": "m", "path": "/tmp"}]
    form.add_mount_row("model", "m", "/tmp")
    assert "mounted twice" in form.errors.value


def test_form_submits_script_and_monitor_streams_logs(ma_widget_client):
    submitted = []
    form = JobForm(client=ma_widget_client, on_submit=submitted.append)
    form.name.value = "widget-job"
    form.code.value = (
        "import time\nfor i in range(300):\n    print(f'widget line {i}', flush=True)\n    time.sleep(0.1)\n"
    )
    handle = form.submit()
    assert handle is not None and submitted == [handle]
    assert handle.info.spec.command == "python /workspace/algorithm/widget-job.py"

    monitor = JobMonitor(handle, client=ma_widget_client)
    try:
        wait_for(lambda: "widget line 3" in monitor.log_text(), timeout=60)
        assert "ma-status-running" in monitor.badge.value
        assert "worker-0" in monitor.tabs.titles
        assert "elapsed" in monitor.info.value
        monitor.stop_button.click()
        wait_for(lambda: "ma-status-stopped" in monitor.badge.value, timeout=60)
        wait_for(lambda: not monitor.following, timeout=30)
        assert monitor.stop_button.disabled
        assert "stopped" in monitor.events.value
        lines = monitor.log_text().splitlines()
        assert lines == [f"widget line {i}" for i in range(len(lines))]  # in order, none twice
        clone_form = monitor.clone()
        assert clone_form.name.value == "widget-job-clone"
        assert clone_form.command.value == handle.info.spec.command
        assert "ready to submit" in clone_form.errors.value
    finally:
        monitor.close_monitor()
    assert handle.wait(timeout=30).status is JobStatus.stopped


def test_panel_lists_jobs_and_opens_monitor(ma_widget_client):
    p = panel(ma_widget_client)
    try:
        p.form.name.value = "panel-job"
        p.form.command.value = "python -c \"print('from the panel')\""
        handle = p.form.submit()
        assert p.monitor is not None and p.monitor.job_id == handle.id
        wait_for(lambda: "from the panel" in p.monitor.log_text(), timeout=60)
        wait_for(lambda: "ma-status-succeeded" in p.monitor.badge.value, timeout=60)
        wait_for(
            lambda: any(
                "ma-status-succeeded" in w.value for row in p.table.children for w in row.children[1:2]
            ),
            timeout=30,
        )
        button = p.table.children[0].children[0]
        assert button.description == "panel-job"
        p.monitor_slot.children = []
        button.click()
        assert p.monitor_slot.children and p.monitor.job_id == handle.id
    finally:
        p.close_panel()
