"""A real JupyterLab for the browser tests, and how to launch Debian's chromium.

JupyterLab runs on loopback with a token and its own config, data, runtime and settings
folders, on its own ``MA_JUPYTER_HOME``; the job service it reaches (started on first use by
the server extension or a kernel) is stopped with its jobs when the Lab stops.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_service(home: Path) -> None:
    """Stop the jobs the service of ``home`` still runs, then the service itself."""
    from ma_jupyter.client import Client

    try:
        runtime = json.loads((home / "service.json").read_text())
    except (OSError, ValueError):
        return
    client = Client(url=runtime["url"], token=runtime["token"], timeout=10)
    try:
        for job in client.jobs(status=["running", "queued"]):
            client.stop(job.id)
            job.wait(timeout=30)
    except Exception:
        pass  # the service may already be gone; its pid is still signalled below
    try:
        os.kill(runtime["pid"], signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{runtime['pid']}").exists(), timeout=20)
    except (OSError, AssertionError):
        pass


@contextmanager
def running_lab(tmp: Path, env: dict[str, str] | None = None) -> Iterator[dict]:
    """JupyterLab under ``tmp`` (``env``: more variables for it); yields ``url``, ``token``,
    ``home``, ``root`` (its notebooks), ``work`` (a scratch folder) and ``log`` (the server's log
    file)."""
    home, root, work = tmp / "home", tmp / "notebooks", tmp / "work"
    for folder in (home, root, work):
        folder.mkdir(parents=True)
    # the lab's jobs may mount the test's folders (outside the default roots, the user's home and
    # the project folder)
    (home / "cluster.toml").write_text(f'[mounts]\nallowed_roots = ["{tmp}"]\n')
    token = secrets.token_hex(16)
    port = free_port()
    settings = tmp / "app-settings"
    settings.mkdir()
    # no news or update checks: nothing leaves loopback and no toast covers the page
    (settings / "overrides.json").write_text(
        json.dumps(
            {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
        )
    )
    # this checkout's build of the extension wins over the one installed in the environment
    # (JUPYTER_PATH comes first in the search path), so a worktree tests its own sidebar
    built = REPO / "ma_jupyter" / "labextension"
    jupyter_path = {}
    if (built / "package.json").exists():
        (tmp / "jupyter-path" / "labextensions").mkdir(parents=True)
        (tmp / "jupyter-path" / "labextensions" / "ma_jupyter").symlink_to(built)
        jupyter_path = {"JUPYTER_PATH": str(tmp / "jupyter-path")}
    env = {
        **os.environ,
        **jupyter_path,
        "MA_JUPYTER_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JUPYTER_CONFIG_DIR": str(tmp / "jupyter-config"),
        "JUPYTER_DATA_DIR": str(tmp / "jupyter-data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "jupyter-runtime"),
        "IPYTHONDIR": str(tmp / "ipython"),
        **(env or {}),
    }
    log_path = tmp / "lab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ip=127.0.0.1",
                f"--port={port}",
                "--allow-root",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                f"--LabApp.app_settings_dir={settings}",
                f"--LabApp.user_settings_dir={tmp / 'lab-settings'}",
                f"--LabApp.workspaces_dir={tmp / 'lab-workspaces'}",
                "--LabApp.news_url=None",
            ],
            env=env,
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(log_path.read_text()[-3000:])
        try:
            return requests.get(f"{url}/api/status", params={"token": token}, timeout=2).ok
        except requests.RequestException:
            return False

    try:
        wait_for(ready, timeout=60, interval=0.2)
        yield {"url": url, "token": token, "home": home, "root": root, "work": work, "log": log_path}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stop_service(home)


@contextmanager
def chromium() -> Iterator:
    """A headless chromium, and Playwright's driver, for the pages of several tests (a module's
    fixture): each launch costs a second or more of CPU, and a page of its own
    (:func:`lab_page` with ``browser``) is as fresh as a browser of its own; the calling test is
    skipped where chromium is not installed."""
    import pytest
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def lab_page(
    lab: dict, *, height: int = 950, width: int = 1500, browser=None, path: str = "/lab"
) -> Iterator:
    """A headless chromium page on ``lab``'s JupyterLab (from :func:`running_lab`) at ``path``
    (a notebook's: ``/lab/tree/<file>``), closed afterwards, in a browser context of its own (no
    cookie, storage or cache of another page): in ``browser`` (from :func:`chromium`) where
    given, else in a chromium of its own; the calling test is skipped where chromium is not
    installed."""
    if browser is None:
        with chromium() as own, lab_page(lab, height=height, width=width, browser=own, path=path) as page:
            yield page
        return
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        page = context.new_page()
        page.goto(f"{lab['url']}{path}?reset&token={lab['token']}")
        yield page
    finally:
        context.close()


def palette(page, label: str) -> None:
    """Run a command by its label from the command palette, as a user does.

    The palette is a modal that closes when it loses focus: call this when no widget is still
    loading (a notebook that connects its kernel takes the focus; see :func:`run_all_cells`).
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    search = page.locator(".lm-CommandPalette-input")
    item = page.locator(f'.lm-CommandPalette-item:has-text("{label}")').first
    # Lab's own late work (a restored panel taking the focus, a kernel status change) closes the
    # modal palette between its opening and the typing, at times no page state announces: a
    # user would open it again, and so does this, a bounded number of times.
    for attempt in range(3):
        page.keyboard.press("Control+Shift+C")
        try:
            search.wait_for(state="visible", timeout=30_000)
            search.fill(label, timeout=10_000)
            item.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            if attempt == 2:
                raise


def wait_notebook_ready(panel) -> None:
    """Until the notebook shows its kernel idle: before that it is still connecting, and it moves
    the focus to its cell when it is done (which would close a palette opened meanwhile)."""
    from playwright.sync_api import expect

    expect(panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')).to_be_attached(
        timeout=180_000
    )


def run_all_cells(page, panel) -> None:
    """Run every cell of a notebook from the Run menu, as a user does, once it is ready and is
    the current widget (the Run menu acts on the current one).

    Lumino decides a menu item's enabled state when the menu opens: a Run menu opened while the
    notebook's kernel was still connecting shows "Run All Cells" disabled, and a click on it does
    nothing.  So the menu is opened (again) until the item is enabled, and the first code cell must
    then show that it runs or ran (its prompt leaves ``[ ]``)."""
    from playwright.sync_api import expect

    wait_notebook_ready(panel)
    panel.locator(".jp-Cell").first.click()
    panel_id = panel.get_attribute("id")
    expect(
        page.locator(f'.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current[data-id="{panel_id}"]')
    ).to_be_attached(timeout=30_000)

    def open_enabled_item() -> bool:
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        item = page.locator(".lm-Menu-item", has_text="Run All Cells").first
        item.wait_for(state="visible", timeout=30_000)
        if "lm-mod-disabled" in (item.get_attribute("class") or ""):
            page.keyboard.press("Escape")
            return False
        item.click()
        return True

    prompt = panel.locator(".jp-CodeCell .jp-InputPrompt").first

    def started() -> bool:
        return prompt.inner_text().strip() not in ("[ ]:", "[ ]", "")

    # Lab's own late focus change can close the menu between the item's look and the click
    # (as it closes the command palette: see the palette's helper), and the click then lands
    # on nothing: a cell queued shows ``[*]`` at once, so a first cell still at ``[ ]`` after
    # the click ran nothing, and the menu is opened again (never a second Run All of cells
    # that started)
    for _ in range(3):
        wait_for(open_enabled_item, timeout=120, interval=0.5)
        try:
            wait_for(started, timeout=30, interval=0.2)
            return
        except AssertionError:
            if started():
                return
    wait_for(started, timeout=30, interval=0.2)
