"""The job page's "Create dev environment" kernel choice, server side, against a real JupyterLab:
``POST <base_url>/ma-jupyter/devenv-kernel`` starts the dev environment and installs its
kernelspec for the server's account, Jupyter lists it and starts it (the bridge attaches to the
dev environment), and deleting the kernel ends the dev environment.  No browser is needed.
"""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.browser.lab import running_lab

pytestmark = [pytest.mark.timeout(400)]


def _wait(what, check, within: float = 180):
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {within} s"
        time.sleep(0.5)


def test_the_lab_starts_the_jobs_own_kernel_and_deleting_it_ends_the_environment(tmp_path):
    with running_lab(tmp_path) as lab:
        auth = {"Authorization": f"token {lab['token']}"}
        api = f"{lab['url']}/ma-jupyter/api/v1"
        body = {"name": "labjob", "mode": "pytorch", "nodes": 2, "command": "sleep 600"}
        source = requests.post(f"{api}/jobs", json=body, headers=auth, timeout=60)
        assert source.status_code == 201, source.text
        source_id = source.json()["id"]

        made = requests.post(
            f"{lab['url']}/ma-jupyter/devenv-kernel",
            json={"job": source_id, "node": "worker-1"},
            headers=auth,
            timeout=120,
        )
        assert made.status_code == 201, made.text
        answer = made.json()
        name = f"ma_jupyter-{source_id}-worker-1".lower()  # by the job's id, not its name
        assert answer["kernel_name"] == name
        assert answer["display_name"] == "ma_jupyter: labjob (worker-1)"
        devenv_id = answer["devenv"]["id"]
        assert answer["devenv"]["spec"]["devenv_of"]["node"] == "worker-1"

        specs = requests.get(f"{lab['url']}/api/kernelspecs", headers=auth, timeout=30).json()["kernelspecs"]
        assert specs[name]["spec"]["display_name"] == "ma_jupyter: labjob (worker-1)"

        kernel = requests.post(f"{lab['url']}/api/kernels", json={"name": name}, headers=auth, timeout=60)
        assert kernel.status_code == 201, kernel.text

        def job() -> dict:
            return requests.get(f"{api}/jobs/{devenv_id}", headers=auth, timeout=30).json()

        _wait("the dev environment running", lambda: job()["status"] == "running")
        # the bridge found the node's kernel folder and handed the kernel its connection file
        kernel_folder = lab["home"] / "jobs" / devenv_id / "nodes" / "worker-0" / "kernel"
        connection = _wait(
            "the kernel's connection file", lambda: (kernel_folder / "connection.json").exists()
        )
        assert connection
        assert json.loads((kernel_folder / "connection.json").read_text())["transport"] == "ipc"

        gone = requests.delete(f"{lab['url']}/api/kernels/{kernel.json()['id']}", headers=auth, timeout=60)
        assert gone.status_code == 204, gone.text
        _wait("the dev environment ended", lambda: job()["status"] in ("succeeded", "stopped"))


def test_the_job_pages_kernel_choice_opens_a_notebook_running_in_the_node(tmp_path):
    from playwright.sync_api import expect

    from tests.browser.lab import lab_page, wait_notebook_ready

    with running_lab(tmp_path) as lab, lab_page(lab) as page:
        auth = {"Authorization": f"token {lab['token']}"}
        api = f"{lab['url']}/ma-jupyter/api/v1"
        body = {
            "name": "pagejob",
            "mode": "pytorch",
            "nodes": 2,
            "command": "sleep 600",
            "env": {"WHO": "page"},
        }
        reply = requests.post(f"{api}/jobs", json=body, headers=auth, timeout=60)
        assert reply.status_code == 201, reply.text
        source = reply.json()

        card = page.locator(".jp-LauncherCard", has_text="Training jobs")
        expect(card).to_be_visible(timeout=90_000)
        card.click()
        table = page.locator('[data-ma-view="jobs"]')
        expect(table).to_be_visible(timeout=30_000)
        table.locator(f'tr[data-job-id="{source["id"]}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{source["id"]}"]')
        expect(detail).to_be_visible(timeout=30_000)
        detail.locator(".ma-op-devenv").click()
        dialog = page.locator(".jp-Dialog")
        dialog.locator("select.ma-devenv-node").select_option("worker-1")
        dialog.locator(".ma-devenv-kernel").click()
        expect(detail.locator(".ma-message")).to_contain_text("Started dev environment", timeout=60_000)

        panel = page.locator(".jp-NotebookPanel").last
        expect(panel).to_be_visible(timeout=60_000)
        expect(panel.locator(".jp-KernelName")).to_have_text("ma_jupyter: pagejob (worker-1)", timeout=60_000)
        wait_notebook_ready(panel)
        panel.locator(".jp-Cell .cm-content").first.click()
        page.keyboard.type("import os; print(os.environ['WHO'], os.environ['RANK'])")
        page.keyboard.press("Shift+Enter")
        expect(panel.locator(".jp-OutputArea-output").first).to_have_text("page 1", timeout=60_000)

        kernels = requests.get(f"{lab['url']}/api/kernels", headers=auth, timeout=30).json()
        name = f"ma_jupyter-{source['id']}-worker-1".lower()  # by the job's id, not its name
        (kernel,) = [k for k in kernels if k["name"] == name]
        requests.delete(f"{lab['url']}/api/kernels/{kernel['id']}", headers=auth, timeout=60)
        jobs = requests.get(f"{api}/jobs", headers=auth, timeout=30).json()["items"]
        (devenv,) = [j for j in jobs if j["spec"].get("devenv_of")]
        _wait(
            "the dev environment ended",
            lambda: (
                requests.get(f"{api}/jobs/{devenv['id']}", headers=auth, timeout=30).json()["status"]
                in ("succeeded", "stopped")
            ),
        )
