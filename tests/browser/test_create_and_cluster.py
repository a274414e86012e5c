"""The main-area create form, submit-from-anywhere and the cluster view in a real JupyterLab.

The Lab's job service runs a small cluster (``n1`` with two emulated A100 cards, ``n2`` CPU
only) so that two real jobs fill the cards: the form's queue prediction and the cluster view's
spec counts change with them.  Screenshots of every view go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import json
import re

import pytest
import requests

from tests.browser.lab import REPO, lab_page, palette, running_lab, wait_notebook_ready
from tests.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

SHOTS = REPO / "test-output" / "screenshots"
SLEEP = 'python -c "import time; time.sleep(600)"'

CLUSTER = """
[[spec]]
name = "cpu.small"
cpus = 1
memory_gb = 0.5

[[spec]]
name = "gpu.one"
cpus = 1
memory_gb = 0.5
accelerators = 1
accelerator_type = "gpu"
accelerator_model = "A100"
emulated = true
description = "one emulated A100"

[[node]]
name = "n1"
cpus = 4
memory_gb = 4
accelerators = 2
accelerator_type = "gpu"
accelerator_model = "A100"

[[node]]
name = "n2"
cpus = 4
memory_gb = 4
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab with this checkout's extension; its service (started on first use) runs CLUSTER."""
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        cluster = lab["home"] / "cluster.toml"
        cluster.write_text(cluster.read_text() + CLUSTER)
        yield lab


@pytest.fixture(scope="module")
def page(lab):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab_page(lab, height=1000) as page:
        page.locator(".jp-LabShell").wait_for(timeout=90_000)
        page.locator(".jp-DirListing-content").wait_for(timeout=60_000)
        yield page


def api(lab, method: str, path: str, **kwargs):
    headers = {"Authorization": f"token {lab['token']}"}
    reply = requests.request(
        method, f"{lab['url']}/ma-jupyter/api/v1/{path}", headers=headers, timeout=60, **kwargs
    )
    assert reply.ok, reply.text
    return reply.json() if reply.text else None


def show_files(page) -> None:
    """Show the file browser (if hidden) and refresh it: the test writes files behind its back."""
    if not page.locator("#filebrowser").is_visible():
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="filebrowser"]').click()
    page.locator('#filebrowser [data-command="filebrowser:refresh"]').first.click()


def open_in_browser(page, name: str) -> None:
    """Double-click an entry of the file browser's current folder: the event is dispatched to
    the entry (the listing handles it by delegation, as a real one).  A pointer's double click
    first waits for the entry to stay put, and on a loaded machine the listing re-renders its
    entries at each refresh while that wait lasts (seen for 30 s: "element was detached")."""
    page.locator(f'.jp-DirListing-item[title*="{name}"]').first.dispatch_event("dblclick")


def wait_job(lab, job_id: str, statuses: set[str], timeout: float = 180) -> dict:
    return wait_for(
        lambda: (j := api(lab, "GET", f"jobs/{job_id}"))["status"] in statuses and j, timeout=timeout
    )


def log_of(lab, job_id: str) -> str:
    return api(lab, "GET", f"jobs/{job_id}/logs/read", params={"node": "worker-0", "offset": 0})["data"]


def stop_all(lab) -> None:
    for job in api(lab, "GET", "jobs", params={"status": ["running", "queued"], "limit": 500})["items"]:
        api(lab, "POST", f"jobs/{job['id']}/stop")
    for job in api(lab, "GET", "jobs", params={"limit": 500})["items"]:
        wait_job(lab, job["id"], {"stopped", "succeeded", "error", "expired"}, timeout=120)


def test_form_validates_as_you_type_predicts_the_queue_and_submits(lab, page):
    from playwright.sync_api import expect

    palette(page, "New Training Job")
    form = page.locator('[data-ma-view="form"]').last
    expect(form).to_be_visible(timeout=30_000)
    expect(form.locator('[data-spec="gpu.one"] input')).to_be_attached(timeout=60_000)
    # every group of fields is there
    for group in ("basics", "code", "data", "resources", "lifecycle", "access"):
        expect(form.locator(f'fieldset[data-group="{group}"]')).to_be_visible()
    form.locator('[data-ma-input="name"]').fill("form-job")
    form.locator('[data-ma-input="command"]').fill("python -c \"print('from the form')\"")
    prediction = form.locator("[data-ma-prediction]")
    expect(prediction).to_have_attribute("data-state", "now", timeout=60_000)

    # an invalid value, as typed: the service's own message at the field it names
    form.locator('[data-ma-input="command"]').fill("KEY=1 python train.py")
    command = form.locator('.ma-field[data-field="command"]')
    expect(command).to_have_class(re.compile("ma-field-invalid"), timeout=30_000)
    expect(command.locator(".ma-field-error")).to_contain_text("bash -c", timeout=30_000)
    form.locator('[data-ma-input="duration"]').fill("soon")
    form.locator('[data-ma-input="command"]').fill("python -c \"print('from the form')\"")
    duration = form.locator('.ma-field[data-field="duration"]')
    expect(duration).to_have_class(re.compile("ma-field-invalid"), timeout=30_000)
    expect(command).not_to_have_class(re.compile("ma-field-invalid"))
    page.screenshot(path=str(SHOTS / "form-invalid.png"))
    form.locator('[data-ma-input="duration"]').fill("1h")
    expect(duration).not_to_have_class(re.compile("ma-field-invalid"), timeout=30_000)

    # choose the card spec: it can start now, until two real jobs hold both cards of n1
    form.locator('[data-spec="cpu.small"] input').uncheck()
    form.locator('[data-spec="gpu.one"] input').check()
    expect(prediction).to_have_attribute("data-state", "now", timeout=30_000)
    expect(form.locator(".ma-dryrun")).to_contain_text("worker-0", timeout=30_000)
    expect(form.locator(".ma-dryrun")).to_contain_text("n1")
    blockers = [
        api(
            lab,
            "POST",
            "jobs",
            json={"name": f"blocker-{i}", "command": SLEEP, "specs": ["gpu.one"], "grace_period": 1},
        )
        for i in range(2)
    ]
    for job in blockers:
        wait_job(lab, job["id"], {"running"})
    expect(prediction).to_have_attribute("data-state", "wait", timeout=30_000)
    waiting = api(
        lab,
        "POST",
        "jobs",
        json={"name": "queued-one", "command": SLEEP, "specs": ["gpu.one"], "grace_period": 1},
    )
    expect(prediction).to_contain_text("Would wait behind 1 job", timeout=30_000)
    page.screenshot(path=str(SHOTS / "form-waiting.png"))
    # an urgent job submitted later goes ahead of it in the queue
    urgent = api(
        lab,
        "POST",
        "jobs",
        json={
            "name": "queued-urgent",
            "command": SLEEP,
            "specs": ["gpu.one"],
            "priority": "urgent",
            "grace_period": 1,
        },
    )

    # the cluster view: both cards held, by the blockers, and no gpu.one can start now
    palette(page, "Cluster Resources")
    cluster = page.locator('[data-ma-view="cluster"]')
    expect(cluster).to_be_visible(timeout=30_000)
    n1 = cluster.locator('[data-node="n1"]')
    expect(n1.locator(".ma-card-use")).to_have_count(2, timeout=30_000)
    expect(n1).to_contain_text("blocker-0")
    expect(n1.locator(f'[data-job-id="{blockers[0]["id"]}"]')).to_be_visible()
    # jobs run on n1, where a cpu.small still fits: busy, never "idle"; n2 runs nothing
    expect(n1).to_have_attribute("data-state", "busy")
    expect(n1.locator(".ma-node-state")).to_have_text("busy")
    expect(cluster.locator('[data-node="n2"]')).to_have_attribute("data-state", "idle")
    expect(cluster.locator('tr[data-spec="gpu.one"] .ma-can-start')).to_have_text("0")
    expect(cluster.locator('tr[data-spec="cpu.small"] .ma-can-start')).to_have_text("6")
    # the queue by priority: the urgent job first, though submitted after
    queue_rows = cluster.locator("[data-ma-queue] tbody tr")
    expect(queue_rows).to_have_count(2, timeout=30_000)
    expect(queue_rows.nth(0)).to_have_attribute("data-job-id", urgent["id"])
    expect(queue_rows.nth(0)).to_contain_text("urgent")
    expect(queue_rows.nth(1)).to_have_attribute("data-job-id", waiting["id"])
    # usage bars: both cards of n1 held, its cores partly
    expect(n1.locator('[data-bar="cards"] .ma-bar-value')).to_have_text("2 / 2")
    expect(n1.locator('[data-bar="cards"] .ma-bar-fill')).to_have_class(re.compile("ma-bar-high"))
    assert n1.locator('[data-bar="cores"] .ma-bar-value').inner_text().startswith("2 / ")
    expect(cluster.locator("[data-ma-demand]")).to_contain_text("A100: 2")  # one card each
    page.screenshot(path=str(SHOTS / "cluster.png"))
    # the seed's columns: the specs that fit each node (n2 has no cards: no gpu.one)
    expect(n1.locator("[data-ma-specs]")).to_contain_text("gpu.one")
    n2 = cluster.locator('[data-node="n2"]')
    expect(n2.locator("[data-ma-specs]")).to_contain_text("cpu.small")
    expect(n2.locator("[data-ma-specs]")).not_to_contain_text("gpu.one")
    # a drained node says so: nothing fits there, yet it is not "tight"
    api(lab, "POST", "nodes/n2/drain", json={"reason": "disk check"})
    expect(n2).to_have_attribute("data-state", "drained", timeout=30_000)
    expect(n2.locator(".ma-node-state")).to_have_text("drained")
    api(lab, "POST", "nodes/n2/undrain")
    expect(n2).to_have_attribute("data-state", "idle", timeout=30_000)
    # the spec filter: n1 is tight for gpu.one, and n2 (no cards) is not listed
    cluster.locator('.ma-cluster-filters [data-spec="gpu.one"] input').check()
    expect(cluster.locator('[data-node="n2"]')).to_have_count(0, timeout=30_000)
    expect(n1).to_have_attribute("data-state", "tight", timeout=30_000)
    cluster.locator('.ma-cluster-filters [data-spec="gpu.one"] input').uncheck()
    expect(cluster.locator('[data-node="n2"]')).to_be_visible(timeout=30_000)
    # the board model filter keeps n1 only
    cluster.locator('[data-model="A100"] input').check()
    expect(cluster.locator('[data-node="n2"]')).to_have_count(0, timeout=30_000)
    expect(cluster.locator('[data-node="n1"]')).to_be_visible()
    page.screenshot(path=str(SHOTS / "cluster-a100.png"))
    # a job on a node opens its page; its emulated card is listed as held, its use not drawn
    n1.locator(f'.ma-node-job[data-job-id="{blockers[0]["id"]}"]').click()
    blocker_page = page.locator(f'[data-ma-view="job"][data-job-id="{blockers[0]["id"]}"]')
    expect(blocker_page).to_be_visible(timeout=30_000)
    blocker_page.locator('.ma-tab[data-tab="resources"]').click()
    expect(blocker_page.locator(".ma-cards-note")).to_contain_text("Cards held: worker-0 1", timeout=30_000)
    page.screenshot(path=str(SHOTS / "job-resources-cards.png"))

    # back on the form: stop the jobs, the prediction says it can start again, and submit
    stop_all(lab)
    page.locator('.lm-TabBar-tab:has-text("New training job")').first.click()
    expect(prediction).to_have_attribute("data-state", "now", timeout=30_000)
    # a dataset typed as the CLI takes it (the format of spectext.py, exported into models.ts)
    digits = lab["work"] / "digits"
    digits.mkdir(exist_ok=True)
    form.locator('[data-ma-input="datasets"]').fill(f"favorite/digits@v2={digits}:ro")
    expect(prediction).to_have_attribute("data-state", "now", timeout=30_000)
    form.locator('[data-ma-action="submit"]').click()
    submitted = form.locator("[data-ma-submitted]")
    expect(submitted).to_be_attached(timeout=30_000)
    job_id = submitted.get_attribute("data-job-id")
    # the new job's page opens in the main area
    expect(page.locator(f'[data-ma-view="job"][data-job-id="{job_id}"]')).to_be_visible(timeout=30_000)
    job = wait_job(lab, job_id, {"succeeded", "error"})
    assert job["status"] == "succeeded"
    assert job["spec"]["duration"] == 3600 and job["spec"]["specs"] == ["gpu.one"]
    assert [
        (d["source"], d["name"], d["version"], d["path"], d["read_only"]) for d in job["spec"]["datasets"]
    ] == [("favorite", "digits", "v2", str(digits), True)]
    assert "from the form" in log_of(lab, job_id)
    page.screenshot(path=str(SHOTS / "form-submitted.png"))


def test_right_click_a_python_file_submits_it(lab, page):
    from playwright.sync_api import expect

    folder = lab["root"] / "proj"
    folder.mkdir()
    (folder / "train.py").write_text("import os\nprint('file job in', os.getcwd(), flush=True)\n")
    show_files(page)
    open_in_browser(page, "proj")
    item = page.locator('.jp-DirListing-item[title*="train.py"]').first
    expect(item).to_be_visible(timeout=30_000)
    item.click(button="right")
    entry = page.locator('.lm-Menu-item:has-text("Submit as Training Job")')
    expect(entry).to_be_visible(timeout=10_000)
    page.screenshot(path=str(SHOTS / "file-context-menu.png"))
    entry.click()
    form = page.locator('[data-ma-view="form"]').last
    expect(form.locator('[data-ma-input="command"]')).to_have_value("python train.py", timeout=30_000)
    expect(form.locator('[data-ma-input="algorithm"]')).to_have_value(str(folder))
    expect(form.locator("[data-ma-prediction]")).to_have_attribute("data-state", "now", timeout=60_000)
    page.screenshot(path=str(SHOTS / "form-from-file.png"))
    # the outputs folder through the folder picker (Lab's contents): results/run1
    out = lab["root"] / "results" / "run1"
    out.mkdir(parents=True)
    out.chmod(0o777)  # the job runs as another account: it must be able to write there
    form.locator('[data-ma-browse="outputs"]').click()
    picker = page.locator('[data-ma-view="folder-picker"]')
    picker.locator('.ma-folder[data-path="results"]').click()
    picker.locator('.ma-folder[data-path="results/run1"]').click()
    expect(picker.locator(".ma-folder-where")).to_have_text(str(out))
    page.screenshot(path=str(SHOTS / "folder-picker.png"))
    page.locator('.jp-Dialog button:has-text("Choose this folder")').click()
    expect(form.locator('[data-ma-input="outputs"]')).to_have_value(str(out))
    page.screenshot(path=str(SHOTS / "form-outputs-chosen.png"))
    form.locator('[data-ma-action="submit"]').click()
    submitted = form.locator("[data-ma-submitted]")
    try:
        expect(submitted).to_be_attached(timeout=30_000)
    except AssertionError:  # say what the form showed instead
        raise AssertionError(form.locator(".ma-field-invalid, .ma-message").all_inner_texts()) from None
    job_id = submitted.get_attribute("data-job-id")
    expect(page.locator(f'[data-ma-view="job"][data-job-id="{job_id}"]')).to_be_visible(timeout=30_000)
    job = wait_job(lab, job_id, {"succeeded", "error"})
    assert job["status"] == "succeeded", log_of(lab, job_id)
    assert job["spec"]["algorithm"] == str(folder) and job["spec"]["command"] == "python train.py"
    assert job["spec"]["outputs"] == str(out)
    assert "file job in" in log_of(lab, job_id)


def test_run_cell_as_training_job_from_the_notebook_toolbar(lab, page):
    from playwright.sync_api import expect

    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": "print('cell job says', 6 * 7)",
                "outputs": [],
                "execution_count": None,
            }
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (lab["root"] / "cell.ipynb").write_text(json.dumps(notebook))
    page.locator(".jp-BreadCrumbs-home").first.click()
    page.locator('.jp-FileBrowser [data-command="filebrowser:refresh"]').first.click()
    open_in_browser(page, "cell.ipynb")
    panel = page.locator(".jp-NotebookPanel").last
    expect(panel).to_be_visible(timeout=60_000)

    wait_notebook_ready(panel)
    panel.locator(".jp-CodeCell .jp-InputArea-editor").first.click()
    button = panel.locator(
        '.jp-Toolbar-item[data-jp-item-name="ma-run-cell"] button, [data-command="ma-jupyter:run-cell"]'
    ).first
    expect(button).to_be_visible(timeout=30_000)
    page.screenshot(path=str(SHOTS / "notebook-run-cell.png"))
    button.click()
    toast = page.locator(".Toastify__toast").filter(has_text="submitted from the cell")
    try:
        expect(toast).to_be_visible(timeout=120_000)
    except AssertionError as missing:
        # what the Lab said instead: an error notification names the magic's failure
        page.screenshot(path=str(SHOTS / "notebook-run-cell-failed.png"))
        said = page.locator(".Toastify__toast").all_inner_texts()
        raise AssertionError(f"no 'submitted' notification; notifications: {said!r}") from missing
    page.screenshot(path=str(SHOTS / "notebook-run-cell-submitted.png"))

    jobs = wait_for(
        lambda: [
            j
            for j in api(lab, "GET", "jobs", params={"limit": 500})["items"]
            if "cell job says" in full_log(lab, j)
        ],
        timeout=180,
        interval=1,
    )
    assert len(jobs) == 1
    job = wait_job(lab, jobs[0]["id"], {"succeeded", "error"})
    assert job["status"] == "succeeded"
    assert "cell job says 42" in log_of(lab, job["id"])
    # the notification's "Open job" opens the job's page
    toast.locator("button", has_text="Open job").click()
    expect(page.locator(f'[data-ma-view="job"][data-job-id="{job["id"]}"]')).to_be_visible(timeout=30_000)

    # the same from the cell's context menu
    page.locator(".lm-TabBar-tab", has_text="cell.ipynb").click()
    panel.locator(".jp-CodeCell .jp-InputArea-editor").first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Run Cell as Training Job").first.click()
    again = wait_for(
        lambda: [
            j
            for j in api(lab, "GET", "jobs", params={"limit": 500})["items"]
            if j["id"] != job["id"] and "cell job says" in full_log(lab, j)
        ],
        timeout=180,
        interval=1,
    )
    assert len(again) == 1


def full_log(lab, job: dict) -> str:
    try:
        return log_of(lab, job["id"])
    except AssertionError:
        return ""
