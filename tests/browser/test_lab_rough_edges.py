"""What a user sees of the Lab's smaller views, in one real JupyterLab (one Lab start for all).

The Lab's job service runs a small cluster (``n1`` with two emulated A100 cards, ``n2`` CPU
only) and three jobs: one that fails, one of two nodes that prints lines stamped with times
that alternate between its nodes, one that sleeps.  The test looks at them as a user does: the
Launcher's cards, the cluster view, the create form, the jobs table and the job pages.
"""

from __future__ import annotations

import re

import pytest
import requests

from tests.browser.lab import REPO, lab_page, palette, running_lab
from tests.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

SHOTS = REPO / "test-output" / "screenshots"

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

[[node]]
name = "n1"
cpus = 4
memory_gb = 4
accelerators = 2
accelerator_type = "gpu"
accelerator_model = "A100"
emulated = true

[[node]]
name = "n2"
cpus = 4
memory_gb = 4
"""

# each node prints three lines stamped with made-up times: worker-0 at :00, :02, :04 and
# worker-1 at :01, :03, :05, so by time they alternate whenever each node actually ran
STEPS = """import os
rank = int(os.environ.get("RANK", "0"))
for i in range(3):
    print(f"2026-01-01 00:00:0{2 * i + rank} step {i} of rank {rank}", flush=True)
"""

#: a line of "All nodes": its time, its node, then the line as the node wrote it
MERGED_LINE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} \[(worker-\d)\] .*step (\d) of rank (\d)$")


class Api:
    """The job service through the Lab's proxy, as the Jupyter user."""

    def __init__(self, lab):
        self.base = f"{lab['url']}/ma-jupyter/api/v1"
        self.headers = {"Authorization": f"token {lab['token']}"}

    def __call__(self, method: str, path: str, **kw):
        r = requests.request(method, f"{self.base}/{path}", headers=self.headers, timeout=120, **kw)
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        cluster = lab["home"] / "cluster.toml"
        cluster.write_text(cluster.read_text() + CLUSTER)
        yield lab


def wait_status(api: Api, job_id: str, statuses: set[str], timeout: float = 300) -> dict:
    return wait_for(
        lambda: (j := api("GET", f"jobs/{job_id}"))["status"] in statuses and j, timeout=timeout, interval=1
    )


def test_what_a_user_sees_of_launcher_cluster_form_table_and_job_pages(lab):
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    api = Api(lab)
    work = lab["work"]
    # the user's folder, and the snapshot of it the job runs from (as a client ships it)
    (work / "mycode").mkdir()
    (work / "mycode" / "steps.py").write_text(STEPS)
    (work / "snapshot-7f3a").mkdir()
    (work / "snapshot-7f3a" / "steps.py").write_text(STEPS)
    failing = api(
        "POST", "jobs", json={"name": "fails-on-purpose", "command": "python -c 'import sys; sys.exit(3)'"}
    )
    steps = api(
        "POST",
        "jobs",
        json={
            "name": "two-nodes",
            "mode": "pytorch",
            "nodes": 2,
            "command": "python steps.py",
            "algorithm": str(work / "snapshot-7f3a"),
            "algorithm_origin": str(work / "mycode"),
        },
    )
    sleeper = api(
        "POST", "jobs", json={"name": "sleeper", "command": "python -c 'import time; time.sleep(600)'"}
    )
    wait_status(api, failing["id"], {"error"})
    wait_status(api, steps["id"], {"succeeded"})
    wait_status(api, sleeper["id"], {"running"})

    with lab_page(lab, height=950) as page:
        page.locator(".jp-LabShell").wait_for(timeout=90_000)

        # the Launcher's cards of the create form and of the cluster view have their icons
        for label in ("New Training Job", "Cluster Resources"):
            card = page.locator(".jp-LauncherCard", has_text=label)
            expect(card).to_be_visible(timeout=90_000)
            expect(card.locator(".jp-LauncherCard-icon svg")).to_be_visible()

        # the cluster view marks the emulated cards, and only those
        palette(page, "Cluster Resources")
        cluster = page.locator('[data-ma-view="cluster"]')
        expect(cluster.locator('.ma-node-card[data-node="n1"]')).to_be_visible(timeout=60_000)
        expect(cluster.locator('.ma-node-card[data-node="n1"] [data-ma-emulated]')).to_have_text("emulated")
        expect(cluster.locator('.ma-node-card[data-node="n2"] [data-ma-emulated]')).to_have_count(0)
        expect(cluster.locator('tr[data-spec="gpu.one"]')).to_contain_text("(emulated)")
        page.screenshot(path=str(SHOTS / "edges-cluster.png"))

        # the form: specs, mode and nodes before the code and the interpreter; Submit in view
        palette(page, "New Training Job")
        form = page.locator('[data-ma-view="form"]').last
        expect(form.locator('[data-spec="cpu.small"] input')).to_be_attached(timeout=60_000)

        def top(selector: str) -> float:
            return form.locator(selector).first.bounding_box()["y"]

        assert top('[data-field="specs"]') < top('[data-field="mode"]') <= top('[data-field="nodes"]')
        assert (
            top('[data-field="nodes"]') < top('[data-field="command"]') < top('[data-field="image.python"]')
        )
        assert top('[data-field="nodes"]') < top('[data-field="secret_env"]')
        submit = form.locator('button[data-ma-action="submit"]')
        box = submit.bounding_box()
        assert box["y"] + box["height"] <= 950, f"Submit is {box['y']:.0f} px down a 950 px window"
        # the dry run: one readable block per node, with its environment and mounts
        form.locator('[data-field="command"] textarea').fill("python train.py --lr 0.1")
        form.locator('[data-field="outputs"] input').fill(str(work / "out"))
        form.locator('[data-field="env"] textarea').fill("MY_FLAG=on")
        node = form.locator("details.ma-plan-node").first
        expect(node.locator('[data-ma-plan="env"]')).to_contain_text("MY_FLAG=on", timeout=60_000)
        expect(node.locator('[data-ma-plan="mounts"]')).to_contain_text("/workspace/outputs")
        expect(node).to_contain_text("python train.py --lr 0.1")
        runs = node.locator("dd pre").first
        # the command on one or two lines, not a column of single characters
        assert runs.bounding_box()["height"] < 4 * runs.evaluate(
            "e => parseFloat(getComputedStyle(e).lineHeight)"
        )
        page.screenshot(path=str(SHOTS / "edges-form.png"))

        # the jobs table says why a job failed
        palette(page, "Open jobs")
        table = page.locator('[data-ma-view="jobs"]')
        expect(table.locator("th.ma-col-reason")).to_have_text("Reason", timeout=30_000)
        failed_row = table.locator(f'tr[data-job-id="{failing["id"]}"]')
        expect(failed_row.locator("td.ma-col-reason")).to_contain_text("code 3", timeout=30_000)
        expect(table.locator(f'tr[data-job-id="{steps["id"]}"] td.ma-col-reason')).to_have_text("")

        # a finished job's page: a disabled Stop looks disabled beside an enabled Delete
        failed_row.click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{failing["id"]}"]')
        stop, delete = detail.locator('button[data-op="stop"]'), detail.locator('button[data-op="delete"]')
        expect(stop).to_be_disabled(timeout=30_000)
        expect(delete).to_be_enabled()
        look = "e => { const s = getComputedStyle(e); return [s.backgroundColor, s.cursor, s.opacity]; }"
        stop_look, delete_look = stop.evaluate(look), delete.evaluate(look)
        assert stop_look[0] != delete_look[0], (stop_look, delete_look)
        assert stop_look[1] == "not-allowed" and float(stop_look[2]) < 0.8, stop_look
        page.screenshot(path=str(SHOTS / "edges-disabled-stop.png"))

        # the two-node job's overview names the user's folder, not the snapshot, nor the digest
        page.locator('.lm-TabBar-tab[data-id="ma-jupyter-jobs"]').click()
        table.locator(f'tr[data-job-id="{steps["id"]}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{steps["id"]}"]')
        spec = detail.locator("table.ma-spec-table")
        expect(spec.locator('tr[data-field="algorithm"]')).to_contain_text(
            str(work / "mycode"), timeout=30_000
        )
        expect(spec).not_to_contain_text("snapshot-7f3a")
        expect(spec.locator('tr[data-field="mode"]')).to_contain_text("pytorch × 2 nodes")
        expect(detail.get_by_text("algorithm_digest")).not_to_be_visible()
        page.screenshot(path=str(SHOTS / "edges-overview.png"))

        # its "All nodes" log: each line with its time and node, the nodes' lines by time
        detail.locator('.ma-tab[data-tab="logs"]').click()
        log = detail.locator("pre.ma-log-main")
        expect(log).to_have_attribute("data-stream", "*", timeout=30_000)
        expect(log).to_have_attribute("data-eof", "true", timeout=60_000)
        lines = [m for m in map(MERGED_LINE.match, log.inner_text().splitlines()) if m]
        assert [(m[1], m[2]) for m in lines] == [
            ("worker-0", "0"),
            ("worker-1", "0"),
            ("worker-0", "1"),
            ("worker-1", "1"),
            ("worker-0", "2"),
            ("worker-1", "2"),
        ], log.inner_text()
        assert all(m[1] == f"worker-{m[3]}" for m in lines)
        page.screenshot(path=str(SHOTS / "edges-all-nodes.png"))

        # the running job's TensorBoard tab shows that it loads, then what it loaded
        page.locator('.lm-TabBar-tab[data-id="ma-jupyter-jobs"]').click()
        table.locator(f'tr[data-job-id="{sleeper["id"]}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{sleeper["id"]}"]')
        detail.locator('.ma-tab[data-tab="tensorboard"]').click()
        section = detail.locator('section[data-section="tensorboard"]')
        expect(section.locator("[data-ma-tb-loading] .ma-spinner")).to_be_visible(timeout=10_000)
        expect(section.locator("[data-ma-tb-empty], iframe.ma-tensorboard").first).to_be_visible(
            timeout=120_000
        )
        expect(section.locator("[data-ma-tb-loading]")).to_have_count(0, timeout=60_000)
        api("POST", f"jobs/{sleeper['id']}/stop")
