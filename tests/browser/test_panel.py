"""The widgets panel in a real JupyterLab, driven in Debian's chromium through Playwright.

The test starts JupyterLab on loopback with a token and temporary folders, opens a notebook that
shows ``ma_jupyter.panel()``, fills in the form in the browser, submits, waits for the job's log
lines in the monitor, presses Stop, sees the job stopped, and saves a screenshot.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.browser.lab import CHROMIUM, CHROMIUM_ARGS, REPO, running_lab

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SCRIPT = """import time
for i in range(600):
    print(f"browser line {i}", flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def ma_lab(tmp_path, monkeypatch):
    """JupyterLab with the test's own job-service home (see tests/browser/lab.py)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with running_lab(tmp_path / "lab") as lab:
        monkeypatch.setenv("MA_JUPYTER_HOME", str(lab["home"]))
        yield lab


def write_panel_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell("import ma_jupyter\npanel = ma_jupyter.panel()\npanel")]
    nbformat.write(nb, path)


def accept_kernel_dialog(page, timeout: float) -> None:
    """Accept JupyterLab's "Select Kernel" dialog (the notebook's own kernel) if it shows up."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=timeout)
    except PlaywrightTimeout:
        pass


def test_panel_submit_follow_stop(ma_lab):
    from playwright.sync_api import expect, sync_playwright

    write_panel_notebook(ma_lab["root"] / "panel.ipynb")
    shots = REPO / "test-output" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(f"{ma_lab['url']}/lab/tree/panel.ipynb?reset&token={ma_lab['token']}")
            notebook = page.locator(".jp-NotebookPanel:visible")
            expect(notebook).to_have_count(1, timeout=60_000)
            accept_kernel_dialog(page, timeout=8_000)
            page.locator("li.lm-MenuBar-item", has_text="Run").first.click()
            page.locator('li.lm-Menu-item[data-command="runmenu:run-all"]').click()
            accept_kernel_dialog(page, timeout=5_000)

            form = notebook.locator(".ma-job-form")
            expect(form).to_be_visible(timeout=90_000)
            form.locator(".ma-form-name input").fill("browser-job")
            form.locator(".ma-form-code textarea").fill(SCRIPT)
            expect(form.locator(".ma-form-errors")).to_contain_text("ready to submit", timeout=15_000)
            submit = form.locator(".ma-form-submit")
            expect(submit).to_be_enabled()
            submit.click()

            monitor = notebook.locator(".ma-job-monitor")
            expect(monitor).to_be_visible(timeout=30_000)
            log = monitor.locator(".ma-monitor-log").first
            expect(log).to_contain_text("browser line 3", timeout=90_000)
            expect(monitor.locator(".ma-status-running")).to_be_visible(timeout=30_000)
            page.screenshot(path=str(shots / "panel-running.png"), full_page=True)

            monitor.locator(".ma-monitor-stop").click()
            expect(monitor.locator(".ma-status-stopped")).to_be_visible(timeout=60_000)
            # the jobs table shows it stopped as well
            expect(notebook.locator(".ma-panel-jobs .ma-status-stopped").first).to_be_visible(timeout=30_000)
            page.screenshot(path=str(shots / "panel-stopped.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(shots / "panel-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert (shots / "panel-stopped.png").stat().st_size > 10_000
    # the job is really stopped in the service, and printed what the monitor showed
    logs = list((ma_lab["home"] / "jobs").glob("*/logs/worker-0.log"))
    assert logs and "browser line 3" in logs[0].read_text()
