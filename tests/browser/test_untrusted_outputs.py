"""A notebook from someone else (a job's outputs, a shared file) cannot run anything through the
extension's outputs: the debug terminal's offer is an inert note until the notebook is trusted,
a job id or node name with control characters is never acted on, and the terminal is started
with an argv, never by typing into a shell (a real JupyterLab, the real service, Debian's
chromium)."""

from __future__ import annotations

import nbformat
import pytest
import requests

from ma_jupyter.frontends.notebook.magics import SHELL_MIME
from tests.browser.lab import REPO, lab_page, palette, running_lab, wait_notebook_ready
from tests.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

SHOTS = REPO / "test-output" / "screenshots"


@pytest.fixture(scope="module")
def ma_lab(tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        yield lab


def _terminals(lab: dict) -> list[dict]:
    """The Jupyter server's running terminals."""
    answer = requests.get(f"{lab['url']}/api/terminals", params={"token": lab["token"]}, timeout=60)
    answer.raise_for_status()
    return answer.json()


def _offer(job: str, node: str) -> dict:
    """A cell whose saved output is ``%ma_shell``'s bundle naming ``job`` and ``node``."""
    cell = nbformat.v4.new_code_cell(f"%ma_shell {job!r}")
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={SHELL_MIME: {"job": job, "node": node}, "text/plain": f"debug terminal of {node!r}"},
        )
    ]
    return cell


def test_the_server_extension_starts_no_terminal_for_a_hostile_id(ma_lab):
    pwned = ma_lab["work"] / "pwned-by-post"
    url = f"{ma_lab['url']}/ma-jupyter/debug-terminal"
    headers = {"Authorization": f"token {ma_lab['token']}"}
    for body, field in [
        ({"job": f"train-1\u0015touch {pwned}\r", "node": "worker-0"}, "job"),
        ({"job": "train-1", "node": f"worker-0\u0015touch {pwned}\r"}, "node"),
        ({"job": "--help", "node": "worker-0"}, "job"),
        ({"job": ["train-1"], "node": "worker-0"}, "job"),
    ]:
        answer = requests.post(url, headers=headers, json=body, timeout=60)
        assert answer.status_code == 400, answer.text
        assert answer.json()["field"] == field
        message = answer.json()["message"]
        assert "\x15" not in message and "\r" not in message  # control characters shown escaped
        if any("\x15" in str(value) for value in body.values()):
            assert "\\x15" in message
    for wrong in ({}, {"Authorization": "token wrong"}):  # Jupyter's authentication first
        answer = requests.post(url, headers=wrong, json={"job": "train-1", "node": "worker-0"}, timeout=60)
        assert answer.status_code == 403, answer.text
    answer = requests.post(url, headers=headers, data=b"[1]", timeout=60)
    assert answer.status_code == 400 and '{"job": ID, "node": N}' in answer.json()["message"]
    assert _terminals(ma_lab) == []
    assert not pwned.exists()


def test_an_untrusted_notebook_offers_no_terminal_and_runs_nothing(ma_lab):
    from playwright.sync_api import expect

    base = f"{ma_lab['url']}/ma-jupyter/api/v1"
    headers = {"Authorization": f"token {ma_lab['token']}"}

    def api(method, path, **kw):
        r = requests.request(method, f"{base}/{path}", headers=headers, timeout=120, **kw)
        assert r.status_code < 300, r.text
        return r.json() if r.content else None

    # a real job with a terminal: the one offer that is fine once the notebook is trusted
    job = api(
        "POST",
        "jobs",
        json={
            "name": "dbg-shared",
            "command": "python -c \"import time; print('job running', flush=True); time.sleep(600)\"",
            "debug_terminal": True,
            "grace_period": 1,
        },
    )

    def events() -> list[str]:
        return [e["reason"] for e in api("GET", f"jobs/{job['id']}/events")]

    pwned_by_job, pwned_by_node = ma_lab["work"] / "pwned-by-job", ma_lab["work"] / "pwned-by-node"
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [
        _offer(f"train-1\u0015touch {pwned_by_job}\r", "worker-0"),  # the reproduction
        _offer(job["id"], f"worker-0\u0015touch {pwned_by_node}\r"),
        _offer(job["id"], "worker-0"),
    ]
    nbformat.write(notebook, ma_lab["root"] / "shared.ipynb")  # unsigned: not trusted
    wait_for(lambda: any(r.startswith("running on spec") for r in events()), timeout=120, interval=0.5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab_page(ma_lab, path="/lab/tree/shared.ipynb") as page:
        panel = page.locator(".jp-NotebookPanel").last
        expect(panel).to_be_visible(timeout=90_000)
        offers = panel.locator(".ma-shell-offer")
        expect(offers).to_have_count(3, timeout=90_000)
        wait_notebook_ready(panel)

        def click_everything(*which: int) -> None:
            """What a curious user does: click the offers, and every button or link in them (DOM
            clicks: a terminal tab one of them opened must not hide the next)."""
            for i in which:
                offers.nth(i).dispatch_event("click")
                things = offers.nth(i).locator("button, a")
                for k in range(things.count()):
                    things.nth(k).dispatch_event("click")

        click_everything(0, 1, 2)
        assert panel.locator(".ma-shell-offer :is(button, a)").count() == 0, (
            "an untrusted output is actionable"
        )
        untrusted = [offers.nth(i).locator("[data-ma-shell-inert]") for i in range(3)]
        expect(untrusted[0]).to_have_attribute("data-ma-shell-inert", "invalid")
        expect(untrusted[1]).to_have_attribute("data-ma-shell-inert", "invalid")
        expect(untrusted[2]).to_have_attribute("data-ma-shell-inert", "untrusted")
        expect(untrusted[2]).to_contain_text("trust this notebook to open the terminal")
        expect(untrusted[0]).to_contain_text("not a job id")
        assert "\u0015" not in untrusted[0].inner_text() and "\\u0015" in untrusted[0].inner_text()
        page.screenshot(path=str(SHOTS / "untrusted-shell-offer.png"))

        # trusted by its user, the notebook's well-formed offer becomes a button; the hostile ones
        # stay inert notes
        palette(page, "Trust Notebook")
        page.locator(".jp-Dialog button", has_text="Trust").click()
        button = offers.nth(2).locator(".ma-shell-open")
        expect(button).to_have_text(f"Open the debug terminal of worker-0 ({job['id']})", timeout=60_000)
        expect(offers.nth(0).locator('[data-ma-shell-inert="invalid"]')).to_be_visible()
        expect(offers.nth(1).locator('[data-ma-shell-inert="invalid"]')).to_be_visible()
        click_everything(0, 1)
        button.click()  # the one terminal this test may open
        terminal = page.locator(f'[data-ma-debug-terminal="{job["id"]}/worker-0"]')
        expect(terminal).to_be_visible(timeout=60_000)
        # every click's work is done once the button's terminal reached the node
        wait_for(lambda: any("a debug terminal opened on worker-0" in r for r in events()), timeout=60)
        page.screenshot(path=str(SHOTS / "trusted-shell-offer.png"))
        assert len(_terminals(ma_lab)) == 1  # the button's, started by the server extension
    assert not pwned_by_job.exists() and not pwned_by_node.exists()
    api("POST", f"jobs/{job['id']}/stop")
