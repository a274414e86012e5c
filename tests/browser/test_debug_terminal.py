"""The debug terminal from JupyterLab: the job page's Terminal button opens a JupyterLab terminal
tab inside the node's sandbox (a real PTY, real xterm, the real service), in Debian's chromium."""

from __future__ import annotations

import pytest
import requests

from tests.browser.lab import REPO, chromium, lab_page, run_all_cells, running_lab
from tests.helpers import wait_for, writable_dir

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

SHOTS = REPO / "test-output" / "screenshots"


@pytest.fixture(scope="module")
def ma_lab(tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        yield lab


@pytest.fixture(scope="module")
def ma_browser():
    """One chromium for the module's pages (each test opens a page of its own in it)."""
    with chromium() as browser:
        yield browser


def test_the_terminal_button_opens_a_shell_inside_the_node(ma_lab, ma_browser):
    from playwright.sync_api import expect

    base = f"{ma_lab['url']}/ma-jupyter/api/v1"
    headers = {"Authorization": f"token {ma_lab['token']}"}

    def api(method, path, **kw):
        r = requests.request(method, f"{base}/{path}", headers=headers, timeout=120, **kw)
        assert r.status_code < 300, r.text
        return r.json() if r.content else None

    outputs = writable_dir(ma_lab["work"] / "terminal-out")
    job = api(
        "POST",
        "jobs",
        json={
            "name": "dbg-lab",
            "command": "python -c \"import time; print('job running', flush=True); time.sleep(600)\"",
            "outputs": str(outputs),
            "debug_terminal": True,
            "grace_period": 1,
        },
    )

    def log() -> str:
        return api("GET", f"jobs/{job['id']}/logs/read", params={"node": "worker-0", "offset": 0})["data"]

    wait_for(lambda: "job running" in log() and "debug terminal ready" in log(), timeout=120, interval=0.5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab_page(ma_lab, browser=ma_browser) as page:
        card = page.locator(".jp-LauncherCard", has_text="Training jobs")
        expect(card).to_be_visible(timeout=90_000)
        card.click()
        page.locator(f'[data-ma-view="jobs"] tr[data-job-id="{job["id"]}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{job["id"]}"]')
        expect(detail.locator(".ma-op-terminal")).to_be_enabled(timeout=30_000)
        detail.locator(".ma-op-terminal").click()
        terminal = page.locator(f'[data-ma-debug-terminal="{job["id"]}/worker-0"]')
        expect(terminal).to_be_visible(timeout=60_000)
        expect(
            page.locator(".lm-TabBar-tab", has_text=f"Debug terminal: {job['id']}/worker-0")
        ).to_be_visible()

        def opened() -> bool:
            events = api("GET", f"jobs/{job['id']}/events")
            return any("a debug terminal opened on worker-0" in e["reason"] for e in events)

        wait_for(opened, timeout=60, interval=0.5)  # the tab's CLI reached the node
        # the tab keeps the node's name (the terminal renames itself once connected)
        tab = page.locator(".lm-TabBar-tab", has_text=f"Debug terminal: {job['id']}/worker-0")
        expect(tab).to_be_visible(timeout=30_000)
        terminal.locator(".xterm").click()
        page.keyboard.type("echo ok-$((6*7)) > /workspace/outputs/from-terminal.txt\n")
        wait_for(lambda: (outputs / "from-terminal.txt").exists(), timeout=60, interval=0.5)
        page.screenshot(path=str(SHOTS / "debug-terminal-tab.png"))
        page.keyboard.type("exit 5\n")
        # the node's shell ended: so does the tab's terminal (it ran the CLI under exec)
        expect(terminal).to_have_count(0, timeout=60_000)
    assert (outputs / "from-terminal.txt").read_text() == "ok-42\n"  # written inside the sandbox
    assert api("GET", f"jobs/{job['id']}")["status"] == "running"  # the shell's exit ends no job
    api("POST", f"jobs/{job['id']}/stop")


def test_ma_shell_in_a_notebook_offers_a_button_that_opens_the_terminal(ma_lab, ma_browser):
    import nbformat
    from playwright.sync_api import expect

    base = f"{ma_lab['url']}/ma-jupyter/api/v1"
    headers = {"Authorization": f"token {ma_lab['token']}"}
    job = requests.post(
        f"{base}/jobs",
        headers=headers,
        timeout=60,
        json={
            "name": "dbg-nb",
            "command": "python -c \"import time; print('job running', flush=True); time.sleep(600)\"",
            "debug_terminal": True,
            "grace_period": 1,
        },
    ).json()

    def events() -> list[str]:
        got = requests.get(f"{base}/jobs/{job['id']}/events", headers=headers, timeout=60).json()
        return [e["reason"] for e in got]

    wait_for(lambda: any(r.startswith("running on spec") for r in events()), timeout=120, interval=0.5)
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_code_cell(f"%load_ext ma_jupyter\n%ma_shell {job['id']}")]
    nbformat.write(notebook, ma_lab["root"] / "shell.ipynb")
    # reset: the workspace the test before saved has a terminal tab, which would be restored
    # and could become the current widget after the notebook (the Run menu acts on that one)
    with lab_page(ma_lab, browser=ma_browser, path="/lab/tree/shell.ipynb") as page:
        panel = page.locator(".jp-NotebookPanel").last
        expect(panel).to_be_visible(timeout=90_000)

        run_all_cells(page, panel)
        button = panel.locator(".ma-shell-open")
        try:
            expect(button).to_have_text(f"Open the debug terminal of worker-0 ({job['id']})", timeout=120_000)
        except AssertionError as missing:
            # what the notebook showed: whether the cell ran, is running, or never started
            page.screenshot(path=str(SHOTS / "debug-terminal-from-notebook-failed.png"))
            prompt = panel.locator(".jp-InputPrompt").first.inner_text()
            kernel = panel.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status")
            outputs = panel.locator(".jp-OutputArea").first.inner_text()
            raise AssertionError(
                f"no button: prompt {prompt!r}, kernel {kernel!r}, outputs {outputs!r}"
            ) from missing
        button.click()
        expect(page.locator(f'[data-ma-debug-terminal="{job["id"]}/worker-0"]')).to_be_visible(timeout=60_000)
        wait_for(lambda: any("a debug terminal opened on worker-0" in r for r in events()), timeout=60)
        page.screenshot(path=str(SHOTS / "debug-terminal-from-notebook.png"))
    requests.post(f"{base}/jobs/{job['id']}/stop", headers=headers, timeout=60)
