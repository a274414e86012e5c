"""The widgets against a real job service: form rules and submit, live monitor, panel table.

The widgets run without a browser here (ipywidgets keeps their state in Python); the browser
test drives the same widgets in JupyterLab.
"""

from __future__ import annotations

import pytest

from ma_jupyter import JobForm, JobMonitor, panel
from ma_jupyter.frontends.notebook import session
from ma_jupyter.models import JobStatus
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ma_widget_client(ma_module_home_env):
    """The notebook session's client on the module's home (``ma_module_home``: its service is
    shared by the module's tests, each of which counts only its own jobs); what a test left
    running is stopped after it."""
    session._clients.clear()
    client = session.get_client()
    yield client
    try:
        for handle in client.jobs(status=["running", "queued"]):
            handle.stop()
        for handle in client.jobs(status=["running", "queued"]):
            handle.wait(timeout=90, check=False)
    finally:
        session._clients.clear()


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
    # the distributed mode offers several nodes, as the pytorch mode does
    form.mode.value = "distributed"
    form.nodes.value = 2
    assert form.nodes.layout.display is None
    assert (form.spec_dict()["mode"], form.spec_dict()["nodes"]) == ("distributed", 2)
    form.mode.value = "pytorch"
    # fault restart and checkpoint resume exclude each other
    form.fault_restart.value = True
    form.checkpoint_resume.value = True
    assert not form.fault_restart.value
    assert "fault_restart" not in form.spec_dict() and form.spec_dict()["checkpoint_resume"] == {
        "max_resumes": 3,
        "grace_period": 30.0,
    }
    form.elastic_min_nodes.value = 1
    form.allow_scale_up.value = True
    assert form.spec_dict()["checkpoint_resume"]["allow_scale_up"] is True
    form.elastic_min_nodes.value = 0  # back to a fixed size: the switch goes with it
    assert "allow_scale_up" not in form.spec_dict()["checkpoint_resume"]
    # inline messages come from the wire model
    form.mode.value = "single"
    form.name.value = "no spaces allowed"
    assert "name:" in form.errors.value and form.submit_button.disabled
    form.name.value = "ok"
    row = form.add_mount_row("model", "m", "/tmp", read_only=False)
    assert row.read_only.value and row.read_only.disabled  # models are always read-only
    row.source.value = "pretrained"
    row.version.value = "v2"
    assert form.spec_dict()["models"] == [
        {"name": "m", "path": "/tmp", "source": "pretrained", "version": "v2"}
    ]
    volume = form.add_mount_row("volume", "cache", "/tmp")
    assert not volume.read_only.value and volume.source.disabled
    assert form.spec_dict()["volumes"] == [{"name": "cache", "path": "/tmp"}]
    form._remove_mount(volume)
    form.add_mount_row("model", "m", "/tmp", read_only=True).source.value = "pretrained"
    assert "mounted twice" not in form.errors.value  # a different version
    form.mount_rows.children[-1].version.value = "v2"
    assert "mounted twice" in form.errors.value
    # object storage is named as it is, never taken for a folder below the notebook's
    for row in list(form.mount_rows.children):
        form._remove_mount(row)
    form.add_mount_row("dataset", "d", "s3://bkt/train")
    form.add_mount_row("model", "m", "obs://models/bert")
    form.outputs.value = "s3://bkt/out"
    assert form.spec_dict()["datasets"] == [
        {"name": "d", "path": "s3://bkt/train", "source": "private", "read_only": True}
    ]
    assert form.spec_dict()["models"] == [{"name": "m", "path": "obs://models/bert", "source": "private"}]
    assert form.spec_dict()["outputs"] == "s3://bkt/out"
    assert "ready to submit" in form.errors.value, form.errors.value
    form.outputs.value = ""


def test_form_dry_run_shows_the_plan(ma_widget_client, tmp_path):
    form = JobForm(client=ma_widget_client)
    form.name.value = "planned"
    form.code.value = "print('hi')\n"
    (tmp_path / "data").mkdir()
    form.add_mount_row("dataset", "d", str(tmp_path / "data"))
    plan = form.dry_run()
    assert plan is not None and plan.nodes[0].name == "worker-0"
    assert "python /workspace/algorithm/planned.py" in form.result.value
    assert "/workspace/dataset/private/d" in form.result.value
    assert ma_widget_client.jobs(name="planned") == []


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
        # the status is refreshed every half second, the log as it comes
        wait_for(lambda: "ma-status-running" in monitor.badge.value, timeout=10)
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
        assert clone_form.name.value == "widget-job-copy"
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
        # the newest row, this job's (the module's service holds the other tests' jobs too)
        wait_for(lambda: "ma-status-succeeded" in p.table.children[0].children[1].value, timeout=30)
        button = p.table.children[0].children[0]
        assert button.description == "panel-job"
        p.monitor_slot.children = []
        button.click()
        assert p.monitor_slot.children and p.monitor.job_id == handle.id
    finally:
        p.close_panel()


@pytest.mark.mpi
def test_monitor_has_a_tab_per_rank(ma_widget_client):
    # horovod mode on a 2-card spec: mpirun starts 2 ranks, each with its own rank log
    handle = ma_widget_client.submit(
        name="ranks",
        mode="horovod",
        specs=["gpu.emu-2"],
        command="python -c \"import os; print('hello from rank', os.environ['OMPI_COMM_WORLD_RANK'], flush=True)\"",
    )
    monitor = JobMonitor(handle, client=ma_widget_client)
    try:
        wait_for(lambda: not monitor.following, timeout=120)
        assert handle.info.status is JobStatus.succeeded or handle.refresh().status is JobStatus.succeeded
        titles = set(monitor.tabs.titles)
        assert {"worker-0", "worker-0/rank-0", "worker-0/rank-1"} <= titles, titles
        assert monitor.log_text("worker-0", 0) == "hello from rank 0"
        assert monitor.log_text("worker-0", 1) == "hello from rank 1"
        assert "hello from rank 1" in monitor.log_text("worker-0")
    finally:
        monitor.close_monitor()


def test_the_monitor_of_a_multi_node_job_opens_on_every_nodes_lines(ma_widget_client):
    handle = ma_widget_client.submit(
        name="two-node-monitor",
        mode="tensorflow",
        nodes=2,
        command="python -c \"import json, os; t = json.loads(os.environ['TF_CONFIG'])['task']; "
        "print('I am', t['type'], t['index'], flush=True)\"",
    )
    monitor = JobMonitor(handle, client=ma_widget_client)
    try:
        wait_for(lambda: not monitor.following, timeout=120)
        assert monitor.tabs.titles[0] == "all nodes", monitor.tabs.titles
        every = monitor.log_text("").splitlines()
        assert sorted(every) == ["[worker-0] I am worker 0", "[worker-1] I am worker 1"], every
        assert monitor.log_text("worker-1") == "I am worker 1"
    finally:
        monitor.close_monitor()


# what a hostile job puts where the widgets show it: HTML in its log, its command and (through
# the log's tail) its reason, and terminal control characters
HTML_PAYLOAD = "<img src=x onerror=alert(1)><script>alert(2)</script>"
HOSTILE_JOB = (
    "import sys\n"
    f"print({HTML_PAYLOAD!r}, flush=True)\n"
    "print('osc \\x1b]52;c;ZWNobyBwd25lZA==\\x07 \\x9b2J \\x1b[31mred\\x1b[0m', flush=True)\n"
    "sys.exit(3)\n"
)


def test_the_monitor_escapes_html_in_the_jobs_log_command_reason_and_events(ma_widget_client):
    import shlex

    handle = ma_widget_client.submit(
        name="html-job", command=f"python -c {shlex.quote(HOSTILE_JOB)} '<b>bold</b>'", env={"X": "<i>x</i>"}
    )
    monitor = JobMonitor(handle, client=ma_widget_client)
    try:
        wait_for(lambda: not monitor.following, timeout=120)
        wait_for(lambda: "ma-status-error" in monitor.badge.value, timeout=30)
        job = handle.refresh()
        # the failure's event holds the log's tail: the payload
        assert any("<img src=x" in e.reason for e in ma_widget_client.events(handle.id))
        widgets = {
            "log": monitor._log_widgets[("worker-0", None)].value,
            "events": monitor.events.value,
            "info": monitor.info.value,
            "title": monitor.title.value,
        }
        for where, value in widgets.items():
            for raw in ("<img", "<script", "<b>bold", "<i>x"):
                assert raw not in value, (where, raw, value)
        assert "&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;" in widgets["log"]
        assert "&lt;img src=x onerror=alert(1)&gt;" in widgets["events"]
        # terminal controls are shown, colours kept (the log pane escapes them as text)
        assert "osc ^[]52;c;ZWNobyBwd25lZA==^G \\x9b2J \x1b[31mred\x1b[0m" in monitor.log_text()
        # the tables of jobs (%ma_jobs, the panel) escape every cell
        from ma_jupyter.frontends import render

        bundle = render.table_bundle(["command", "env"], [[job.spec.command, job.spec.env["X"]]])
        assert "<img" not in bundle["text/html"] and "&lt;b&gt;bold&lt;/b&gt;" in bundle["text/html"]
        assert "<i>" not in bundle["text/html"] and "&lt;i&gt;x" in bundle["text/html"]
    finally:
        monitor.close_monitor()
