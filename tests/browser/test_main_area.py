"""The main-area jobs table and job detail in a real JupyterLab, against a real job service and
real jobs (Debian's chromium through Python Playwright; see tests/browser/lab.py).

Screenshots of every view go to ``test-output/screenshots/``; the delay between a job printing
a line and the detail's log pane showing it goes to ``test-output/log_latency.json``.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import requests

from tests.browser.lab import REPO, chromium, lab_page, run_all_cells, running_lab
from tests.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

OUTPUT = REPO / "test-output"
SHOTS = OUTPUT / "screenshots"
DATE_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


@pytest.fixture(scope="module")
def ma_lab(tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        yield lab


class Api:
    """The job service through the Lab's proxy, as the Jupyter user."""

    def __init__(self, lab):
        self.base = f"{lab['url']}/ma-jupyter/api/v1"
        self.headers = {"Authorization": f"token {lab['token']}"}

    def __call__(self, method: str, path: str, **kw):
        r = requests.request(method, f"{self.base}/{path}", headers=self.headers, timeout=120, **kw)
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def submit(self, **spec) -> dict:
        return self("POST", "jobs", json=spec)


@pytest.fixture(scope="module")
def ma_browser():
    """One chromium for the module's pages (each test opens a page of its own in it)."""
    with chromium() as browser:
        yield browser


@pytest.fixture
def browser_page(ma_lab, ma_browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab_page(ma_lab, browser=ma_browser) as page:
        yield page


def _open_table(page):
    from playwright.sync_api import expect

    # the Launcher's card opens the jobs table in the main area
    card = page.locator(".jp-LauncherCard", has_text="Training jobs")
    expect(card).to_be_visible(timeout=90_000)
    card.click()
    table = page.locator('[data-ma-view="jobs"]')
    expect(table).to_be_visible(timeout=30_000)
    return table


def test_jobs_table_sort_filter_paging_and_multi_delete(ma_lab, browser_page):
    from playwright.sync_api import expect

    api, page = Api(ma_lab), browser_page
    api.submit(name="alpha-table", command="true", outputs=str(ma_lab["root"] / "alpha-out"))
    # it runs longer than alpha by more than a loaded machine adds to a node's start (the elapsed
    # sort below); the 101 jobs after it take longer than that anyway
    api.submit(name="zeta-table", command="sleep 10")
    # more than one page (100) of small jobs, submitted in parallel through the proxy
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: api.submit(name=f"bulk-{i:03d}", command="true"), range(101)))
    wait_for(
        lambda: api("GET", "jobs", params={"status": "succeeded", "limit": 1})["total"] == 103,
        timeout=600,
        interval=2,
    )

    table = _open_table(page)
    rows = table.locator("tr.ma-jobs-row")
    expect(rows).to_have_count(100, timeout=30_000)
    expect(table.locator(".ma-page-label")).to_have_text("1–100 of 103")
    first = rows.first
    assert first.get_attribute("data-job-id")
    assert DATE_TIME.match(first.locator(".ma-col-created").inner_text()), first.inner_text()
    me = api("GET", "users/me")["name"]
    assert first.locator(".ma-col-creator").inner_text() == me
    page.screenshot(path=str(SHOTS / "jobs-table.png"))

    # a live refresh keeps the scroll position
    scroller = table.locator(".ma-table-scroll")
    scroller.evaluate("e => { e.scrollTop = 400; }")
    time.sleep(2.5)
    assert scroller.evaluate("e => e.scrollTop") == 400

    table.locator(".ma-page-next").click()
    expect(table.locator(".ma-page-label")).to_have_text("101–103 of 103", timeout=30_000)
    expect(rows).to_have_count(3)
    table.locator(".ma-page-prev").click()
    expect(rows).to_have_count(100, timeout=30_000)
    # a column the service sorts by orders every job: the two oldest jobs were on page 2
    table.locator('th[data-sort="name"]').click()  # ascending
    expect(rows.first.locator(".ma-col-name")).to_have_text("alpha-table", timeout=30_000)
    table.locator('th[data-sort="name"]').click()  # descending
    expect(rows.first.locator(".ma-col-name")).to_have_text("zeta-table", timeout=30_000)
    expect(rows.nth(1).locator(".ma-col-name")).to_have_text("bulk-100")

    # the name filter is the service's: one job matches
    table.locator(".ma-filter-name").fill("-table")
    expect(rows).to_have_count(2, timeout=30_000)
    table.locator('th[data-sort="name"]').click()  # ascending
    expect(rows.first.locator(".ma-col-name")).to_have_text("alpha-table")
    table.locator('th[data-sort="name"]').click()  # descending
    expect(rows.first.locator(".ma-col-name")).to_have_text("zeta-table")
    table.locator(".ma-filter-status").select_option("running")
    expect(rows).to_have_count(0, timeout=30_000)
    table.locator(".ma-filter-status").select_option("")
    table.locator(".ma-filter-creator").fill("nobody-else")
    expect(rows).to_have_count(0, timeout=30_000)
    table.locator(".ma-filter-creator").fill(me)
    expect(rows).to_have_count(2, timeout=30_000)
    # what each row says of its job
    zeta = table.locator("tr.ma-jobs-row", has_text="zeta-table")
    expect(zeta.locator(".ma-col-mode")).to_have_text("single × 1")
    expect(zeta.locator(".ma-col-spec")).to_have_text("cpu.small")
    expect(zeta.locator(".ma-col-status")).to_contain_text("succeeded")
    assert re.search(r"\d+(\.\d+)?s|\dm", zeta.locator(".ma-col-elapsed").inner_text())
    expect(
        table.locator("tr.ma-jobs-row", has_text="alpha-table").locator(".ma-col-outputs")
    ).to_contain_text("alpha-out")
    # columns of the view the service sorts by as well: the job that slept ran longer
    table.locator('th[data-sort="elapsed"]').click()  # ascending
    expect(rows.first.locator(".ma-col-name")).to_have_text("alpha-table", timeout=30_000)
    table.locator('th[data-sort="elapsed"]').click()  # descending
    expect(rows.first.locator(".ma-col-name")).to_have_text("zeta-table", timeout=30_000)
    # the spec and outputs filters are the service's too
    table.locator(".ma-filter-spec").fill("cpu.medium")
    expect(rows).to_have_count(0, timeout=30_000)
    table.locator(".ma-filter-spec").fill("cpu.small")
    expect(rows).to_have_count(2, timeout=30_000)
    table.locator(".ma-filter-outputs").fill("alpha-out")
    expect(rows).to_have_count(1, timeout=30_000)
    expect(rows.first.locator(".ma-col-name")).to_have_text("alpha-table")
    table.locator(".ma-filter-outputs").fill("")
    table.locator(".ma-filter-spec").fill("")
    expect(rows).to_have_count(2, timeout=30_000)
    page.screenshot(path=str(SHOTS / "jobs-table-filtered.png"))

    # select three bulk jobs and delete them after the confirmation
    table.locator(".ma-filter-name").fill("bulk-00")
    expect(rows).to_have_count(10, timeout=30_000)
    doomed = [rows.nth(i).get_attribute("data-job-id") for i in range(3)]
    for job_id in doomed:
        table.locator(f'tr[data-job-id="{job_id}"] .ma-row-select').check()
    time.sleep(2.5)  # one live refresh passes: the checks stay
    for job_id in doomed:
        expect(table.locator(f'tr[data-job-id="{job_id}"] .ma-row-select')).to_be_checked()
    table.locator(".ma-delete-selected").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Delete 3 jobs?")
    page.screenshot(path=str(SHOTS / "jobs-delete-confirm.png"))
    dialog.locator("button.jp-mod-warn").click()
    expect(rows).to_have_count(7, timeout=60_000)
    assert api("GET", "jobs", params={"name": "bulk-00", "limit": 50})["total"] == 7
    for job_id in doomed:
        r = requests.get(f"{api.base}/jobs/{job_id}", headers=api.headers, timeout=30)
        assert r.status_code == 404

    # the table's toolbar opens the create form and the cluster view; the Launcher has both too
    table.locator(".ma-table-new-job").click()
    expect(page.locator('[data-ma-view="form"]')).to_be_visible(timeout=30_000)
    page.locator('.lm-TabBar-tab[data-id="ma-jupyter-jobs"]').click()
    table.locator(".ma-table-cluster").click()
    expect(page.locator('[data-ma-view="cluster"]')).to_be_visible(timeout=30_000)
    page.locator(".jp-LauncherCard", has_text="Cluster Resources").wait_for(state="attached", timeout=30_000)
    page.locator(".jp-LauncherCard", has_text="New Training Job").wait_for(state="attached", timeout=30_000)


PRINTER = """import time
open("/workspace/outputs/metrics.txt", "w").write("loss 0.1\\n")
print("ready", flush=True)
for i in range(600):
    time.sleep(0.5)
    print(f"tick {i} at {time.time():.3f}", flush=True)
"""
# records, for each tick line, when the job printed it and when the log pane first showed it
WATCH_TICKS = """(pre) => {
  window.maSeen = {};
  const note = () => {
    for (const m of pre.textContent.matchAll(/tick (\\d+) at (\\d+\\.\\d+)/g)) {
      if (!(m[1] in window.maSeen)) window.maSeen[m[1]] = [parseFloat(m[2]), Date.now() / 1000];
    }
  };
  note();
  window.maBefore = Object.keys(window.maSeen);
  new MutationObserver(note).observe(pre, {childList: true, characterData: true, subtree: true});
}"""
BURNER = """import time
blocks, end = [], time.time() + 300
while time.time() < end:
    t = time.time() + 0.3
    while time.time() < t:
        pass
    if len(blocks) < 8:
        blocks.append(b'x' * (16 << 20))
"""


def _round_steps(step: float) -> set[float]:
    """The round grid steps (1, 2, 2.5 or 5 times a power of ten) of ``step``'s power of ten."""
    import math

    power = 10 ** math.floor(math.log10(step))
    return {round(m * power, 9) for m in (1, 2, 2.5, 5, 10)}


def test_job_detail_logs_resources_priority_stop_delete(ma_lab, browser_page):
    from playwright.sync_api import expect

    api, page = Api(ma_lab), browser_page
    work = ma_lab["work"]
    (work / "printer").mkdir(exist_ok=True)
    (work / "printer" / "p.py").write_text(PRINTER)
    (work / "burner").mkdir(exist_ok=True)
    (work / "burner" / "b.py").write_text(BURNER)
    printer = api.submit(
        name="printer",
        command="python /workspace/algorithm/p.py",
        algorithm=str(work / "printer"),
        outputs=str(ma_lab["root"] / "printer-out"),  # under the Lab root: Lab lists and opens it
    )
    burner = api.submit(
        name="burner", command="python /workspace/algorithm/b.py", algorithm=str(work / "burner")
    )

    table = _open_table(page)
    table.locator(f'tr[data-job-id="{printer["id"]}"]').click()
    detail = page.locator(f'[data-ma-view="job"][data-job-id="{printer["id"]}"]')
    expect(detail).to_be_visible(timeout=30_000)
    expect(detail.locator(".ma-overview")).to_contain_text("worker-0", timeout=60_000)
    page.screenshot(path=str(SHOTS / "job-overview.png"))

    # the printed line shows while the job still runs
    detail.locator('.ma-tab[data-tab="logs"]').click()
    log = detail.locator(".ma-log-main")
    expect(log).to_contain_text("ready", timeout=120_000)
    # lines printed while the pane is open show while the job still runs
    log.evaluate(WATCH_TICKS)
    wait_for(
        lambda: page.evaluate("Object.keys(window.maSeen).length - window.maBefore.length") >= 8, timeout=120
    )
    assert api("GET", f"jobs/{printer['id']}")["status"] == "running"
    seen = page.evaluate("Object.entries(window.maSeen).filter(([k]) => !window.maBefore.includes(k))")
    delays = sorted(round(shown - printed, 3) for _, (printed, shown) in seen)
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / "log_latency.json").write_text(
        json.dumps(
            {
                "lines": len(delays),
                "median_s": delays[len(delays) // 2],
                "max_s": delays[-1],
                "delays_s": delays,
            }
        )
    )
    page.screenshot(path=str(SHOTS / "job-logs.png"))
    detail.locator(".ma-log-search-input").fill("no such text")
    expect(detail.locator(".ma-log-search")).to_contain_text("no line contains")
    detail.locator(".ma-log-search-input").fill("")

    # the outputs folder lies under the Lab root: its files are listed and open in Lab
    detail.locator('.ma-tab[data-tab="outputs"]').click()
    outputs = detail.locator('[data-section="outputs"]')
    expect(outputs.locator('tr[data-path="printer-out/metrics.txt"]')).to_be_visible(timeout=30_000)
    page.screenshot(path=str(SHOTS / "job-outputs-in-lab.png"))
    outputs.locator('tr[data-path="printer-out/metrics.txt"] a').click()
    expect(page.locator('.lm-TabBar-tab:has-text("metrics.txt")')).to_be_visible(timeout=30_000)
    page.locator(f'.lm-TabBar-tab[data-id="ma-jupyter-job-{printer["id"]}"]').click()
    # and the folder shows in Lab's file browser
    outputs.locator(".ma-open-folder").click()
    expect(page.locator("#filebrowser .jp-BreadCrumbs")).to_contain_text("printer-out", timeout=30_000)
    expect(page.locator('#filebrowser .jp-DirListing-item[title*="metrics.txt"]')).to_be_visible(
        timeout=30_000
    )

    # create dev environment saves the job as a notebook and opens it (see the devenv test below)
    detail.locator(".ma-op-devenv").click()
    page.locator(".jp-Dialog .ma-devenv-notebook").click()  # the other choice: the job's own kernel
    expect(detail.locator(".ma-message")).to_contain_text("Saved and opened", timeout=60_000)
    page.locator(f'.lm-TabBar-tab[data-id="ma-jupyter-job-{printer["id"]}"]').click()

    # stop with the confirmation
    expect(detail.locator(".ma-op-priority")).to_be_disabled()
    assert "queued" in detail.locator(".ma-op-priority").get_attribute("title")
    detail.locator(".ma-op-stop").click()
    page.locator(".jp-Dialog button.jp-mod-warn").click()
    expect(detail.locator(".ma-job-head .ma-status-stopped")).to_be_visible(timeout=120_000)
    expect(detail.locator(".ma-op-stop")).to_be_disabled()

    # the burner's resources: at least three samples drawn
    table_tab = page.locator('.lm-TabBar-tab[data-id="ma-jupyter-jobs"]')
    table_tab.click()
    table.locator(f'tr[data-job-id="{burner["id"]}"]').click()
    burn = page.locator(f'[data-ma-view="job"][data-job-id="{burner["id"]}"]')
    burn.locator('.ma-tab[data-tab="resources"]').click()
    section = burn.locator('[data-section="resources"]')
    wait_for(lambda: int(section.get_attribute("data-samples") or 0) >= 3, timeout=120, interval=1)
    expect(section.locator("svg.ma-chart polyline").first).to_be_attached()
    # each chart is scaled to what was used, with round ticks, and says now / mean / peak
    for chart in section.locator("svg.ma-chart").all():
        peak = float(chart.locator(".ma-chart-figures").first.get_attribute("data-peak"))
        top = float(chart.get_attribute("data-max"))
        assert peak <= top <= 1.6 * peak + 1, (peak, top)
        ticks = [
            float(t) for t in chart.locator("text.ma-chart-tick[text-anchor=end]").all_text_contents()[:-1]
        ]
        step = ticks[1] - ticks[0]
        assert all(round(t / step, 6).is_integer() for t in ticks), ticks
        assert round(step, 9) in _round_steps(step), ticks  # 0/5/10/15, never 28/55/83/110
        figures = chart.locator(".ma-chart-figures").first.text_content()
        assert re.match(r"now [\d.]+ · mean [\d.]+ · peak [\d.]+ ", figures), figures
    memory = section.locator("svg.ma-chart").nth(1)
    limit = memory.locator(".ma-chart-limit-text")
    if float(limit.get_attribute("data-limit")) > float(memory.get_attribute("data-max")):
        expect(limit).to_contain_text("off the scale")
    page.screenshot(path=str(SHOTS / "job-resources.png"))
    burn.locator('.ma-tab[data-tab="events"]').click()
    expect(burn.locator(".ma-events-table")).to_contain_text("running")
    page.screenshot(path=str(SHOTS / "job-events.png"))
    burn.locator('.ma-tab[data-tab="outputs"]').click()
    expect(burn.locator('[data-section="outputs"]')).to_contain_text("Outputs folder", timeout=30_000)
    page.screenshot(path=str(SHOTS / "job-outputs.png"))
    # a running job's duration changes through the dialog
    burn.locator(".ma-op-duration").click()
    page.locator(".jp-Dialog .ma-duration-input").fill("2h")
    page.locator(".jp-Dialog button.jp-mod-accept").click()
    expect(burn.locator(".ma-message")).to_contain_text("Duration set to 2h 00m", timeout=30_000)
    assert api("GET", f"jobs/{burner['id']}")["spec"]["duration"] == 7200
    api("POST", f"jobs/{burner['id']}/stop")

    # delete with the confirmation closes the tab; the job is gone
    page.locator(f'.lm-TabBar-tab[data-id="ma-jupyter-job-{printer["id"]}"]').click()
    detail.locator(".ma-op-delete").click()
    page.locator(".jp-Dialog button.jp-mod-warn").click()
    expect(detail).to_have_count(0, timeout=60_000)
    r = requests.get(f"{api.base}/jobs/{printer['id']}", headers=api.headers, timeout=30)
    assert r.status_code == 404


LOUD = """import time
for i in range(30000):
    print(f"line {i:06d} " + "x" * 88)
print("bulk done", flush=True)
for i in range(600):
    time.sleep(0.3)
    print(f"after {i}", flush=True)
"""
AT_BOTTOM = "pre => pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4"


def test_a_large_log_opens_at_its_tail_follows_wraps_and_downloads_whole(ma_lab, browser_page):
    from playwright.sync_api import expect

    api, page = Api(ma_lab), browser_page
    (ma_lab["work"] / "loud").mkdir(exist_ok=True)
    (ma_lab["work"] / "loud" / "loud.py").write_text(LOUD)
    job = api.submit(
        name="loud", command="python /workspace/algorithm/loud.py", algorithm=str(ma_lab["work"] / "loud")
    )
    path = ma_lab["home"] / "jobs" / job["id"] / "logs" / "worker-0.log"
    wait_for(lambda: path.exists() and b"after 2" in path.read_bytes(), timeout=180, interval=0.5)
    assert path.stat().st_size > 2_000_000

    table = _open_table(page)
    table.locator(f'tr[data-job-id="{job["id"]}"]').click()
    detail = page.locator(f'[data-ma-view="job"][data-job-id="{job["id"]}"]')
    detail.locator('.ma-tab[data-tab="logs"]').click()
    log = detail.locator(".ma-log-main")
    # only the tail is read and rendered: the newest lines, not the first ones
    expect(log).to_contain_text("line 029999", timeout=60_000)
    expect(log).to_contain_text("after 3", timeout=60_000)
    assert "line 000000" not in log.text_content()
    assert int(log.get_attribute("data-start-at")) > 1_500_000
    expect(detail.locator(".ma-log-tail-note")).to_contain_text("Download saves all of it")
    # follow keeps the newest line in view
    wait_for(lambda: log.evaluate(AT_BOTTOM), timeout=30, interval=0.2)
    page.screenshot(path=str(SHOTS / "job-logs-large.png"))

    # follow off: new lines arrive, and the place the user scrolled to stays
    detail.locator(".ma-log-follow").uncheck()
    log.evaluate("pre => { pre.scrollTop = 0; }")
    shown = log.text_content().count("after ")
    wait_for(lambda: log.text_content().count("after ") >= shown + 3, timeout=60, interval=0.3)
    assert log.evaluate("pre => pre.scrollTop") == 0
    # follow on again: back at the newest line
    detail.locator(".ma-log-follow").check()
    wait_for(lambda: log.evaluate(AT_BOTTOM), timeout=30, interval=0.2)

    # wrap: long lines break at the pane's width instead of scrolling sideways
    assert log.evaluate("pre => getComputedStyle(pre).whiteSpace") == "pre"
    detail.locator(".ma-log-wrap").check()
    assert log.evaluate("pre => getComputedStyle(pre).whiteSpace") == "pre-wrap"
    page.screenshot(path=str(SHOTS / "job-logs-wrapped.png"))

    # Download saves the whole stream, from its first byte
    with page.expect_download(timeout=120_000) as download_info:
        detail.locator(".ma-log-download").click()
    download = download_info.value
    assert download.suggested_filename == f"{job['id']}-worker-0.log"
    saved = Path(download.path()).read_bytes()
    assert saved.startswith(b"line 000000 ") and b"line 029999" in saved and b"bulk done" in saved
    assert saved == path.read_bytes()[: len(saved)]
    api("POST", f"jobs/{job['id']}/stop")


def test_priority_change_on_a_queued_job_reorders_the_queue(ma_lab, browser_page):
    from playwright.sync_api import expect

    api, page = Api(ma_lab), browser_page
    # the default cluster has 4 GPU cards on each of 2 nodes: four 2-card jobs take them all
    blockers = [
        api.submit(name=f"blocker-{i}", command="sleep 300", specs=["gpu.emu-2"], duration=3600)
        for i in range(4)
    ]
    wait_for(
        lambda: all(api("GET", f"jobs/{b['id']}")["status"] == "running" for b in blockers),
        timeout=180,
        interval=1,
    )
    first = api.submit(name="waits-first", command="true", specs=["gpu.emu-2"])
    second = api.submit(name="waits-second", command="true", specs=["gpu.emu-2"])
    assert api("GET", f"jobs/{second['id']}")["queue_position"] == 1
    try:
        table = _open_table(page)
        table.locator(f'tr[data-job-id="{second["id"]}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{second["id"]}"]')
        expect(detail.locator(".ma-overview")).to_contain_text("Queue position", timeout=30_000)
        # the blockers end at their duration (an hour): then both waiting jobs fit, side by side
        expect(detail.locator(".ma-overview")).to_contain_text(
            re.compile(r"Estimated start\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(in about (1h 00m|59m)")
        )
        starts = [
            datetime.fromisoformat(api("GET", f"jobs/{j['id']}")["estimated_start"]).timestamp()
            for j in (first, second)
        ]
        assert abs(starts[0] - starts[1]) < 10  # each as a blocker's hour ends
        expect(detail.locator(".ma-op-priority")).to_be_enabled()
        detail.locator(".ma-op-priority").click()
        page.locator(".jp-Dialog .ma-priority-select").select_option("urgent")
        page.screenshot(path=str(SHOTS / "job-priority-dialog.png"))
        page.locator(".jp-Dialog button.jp-mod-accept").click()
        expect(detail.locator(".ma-message")).to_contain_text("queue position 1", timeout=30_000)
        assert api("GET", f"jobs/{second['id']}")["queue_position"] == 0
        assert api("GET", f"jobs/{first['id']}")["queue_position"] == 1
        page.locator('.lm-TabBar-tab[data-id="ma-jupyter-jobs"]').click()
        expect(table.locator(f'tr[data-job-id="{first["id"]}"] .ma-col-status')).to_contain_text(
            "#2", timeout=30_000
        )
        page.screenshot(path=str(SHOTS / "jobs-queue.png"))
        # the sidebar's compact list counts the jobs of each status
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="ma-jupyter-sidebar"]').click()
        counts = page.locator("#ma-jupyter-sidebar .ma-status-counts")
        expect(counts.locator('[data-status="running"]')).to_have_text("running 4", timeout=30_000)
        expect(counts.locator('[data-status="queued"]')).to_have_text("queued 2")
        page.screenshot(path=str(SHOTS / "sidebar-counts.png"))
    finally:
        for job in (*blockers, first, second):
            requests.post(f"{api.base}/jobs/{job['id']}/stop", headers=api.headers, timeout=60)


def test_create_dev_environment_opens_a_notebook_whose_cell_runs_the_job_again(ma_lab, browser_page):
    from playwright.sync_api import expect

    api, page = Api(ma_lab), browser_page
    work = ma_lab["work"]
    (work / "devenv").mkdir(exist_ok=True)
    # a job as a %%ma_train cell makes it: its code is <name>.py in its algorithm folder
    (work / "devenv" / "devenv-src.py").write_text("print('devenv job ran', 6 * 7, flush=True)\n")
    first = api.submit(
        name="devenv-src",
        command="python /workspace/algorithm/devenv-src.py",
        algorithm=str(work / "devenv"),
        env={"MODE": "again"},
    )
    wait_for(lambda: api("GET", f"jobs/{first['id']}")["status"] == "succeeded", timeout=180, interval=0.5)

    table = _open_table(page)
    table.locator(f'tr[data-job-id="{first["id"]}"]').click()
    detail = page.locator(f'[data-ma-view="job"][data-job-id="{first["id"]}"]')
    expect(detail).to_be_visible(timeout=30_000)
    detail.locator(".ma-op-devenv").click()
    page.locator(".jp-Dialog .ma-devenv-notebook").click()  # the other choice: the job's own kernel
    expect(detail.locator(".ma-message")).to_contain_text("Saved and opened", timeout=60_000)
    saved = re.search(r"Saved and opened (\S+\.ipynb)", detail.locator(".ma-message").inner_text()).group(1)
    notebook = json.loads((ma_lab["root"] / saved).read_text())
    # after the header and the cell loading the magics, the job's own %%ma_train cell with its code
    code = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code[0].startswith("%load_ext ma_jupyter"), code
    assert code[1].startswith("%%ma_train --name devenv-src "), code
    assert "--env MODE=again" in code[1] and code[1].endswith("print('devenv job ran', 6 * 7, flush=True)")
    panel = page.locator(".jp-NotebookPanel").last
    expect(panel).to_be_visible(timeout=60_000)
    page.screenshot(path=str(SHOTS / "job-devenv-notebook.png"))

    # run every cell, as a user does from the Run menu
    run_all_cells(page, panel)

    def again() -> list[dict]:
        items = api("GET", "jobs", params={"name": "devenv-src", "limit": 50})["items"]
        return [j for j in items if j["id"] != first["id"]]

    (job,) = wait_for(again, timeout=180, interval=1)
    wait_for(
        lambda: api("GET", f"jobs/{job['id']}")["status"] in ("succeeded", "error"), timeout=180, interval=0.5
    )
    job = api("GET", f"jobs/{job['id']}")
    assert job["status"] == "succeeded", job
    assert job["spec"]["env"] == {"MODE": "again"} and job["spec"]["command"] == first["spec"]["command"]
    log = api("GET", f"jobs/{job['id']}/logs/read", params={"node": "worker-0", "offset": 0})
    assert "devenv job ran 42" in log["data"]
    page.screenshot(path=str(SHOTS / "job-devenv-ran.png"))


def test_html_in_a_jobs_command_env_log_and_events_shows_as_text(ma_lab, browser_page):
    """A hostile job's HTML (in its command, environment, log and, through the log's tail, its
    failure event) is shown as text in the job page's overview, log pane and events: no element
    is made of it and no handler of it runs."""
    import shlex

    from playwright.sync_api import expect

    api, page = Api(ma_lab), browser_page
    payload = '<img src=x onerror="window.maXss=1"><b class="ma-xss">bold</b>'
    script = f"import sys\nprint({payload!r}, flush=True)\nsys.exit(3)\n"
    job = api.submit(
        name="html-job", command=f"python -c {shlex.quote(script)} {shlex.quote(payload)}", env={"X": payload}
    )
    wait_for(lambda: api("GET", f"jobs/{job['id']}")["status"] == "error", timeout=120)

    table = _open_table(page)
    table.locator(f'tr[data-job-id="{job["id"]}"]').click()
    detail = page.locator(f'[data-ma-view="job"][data-job-id="{job["id"]}"]')
    expect(detail).to_be_visible(timeout=30_000)
    expect(detail.locator(".ma-overview")).to_contain_text(payload, timeout=60_000)  # command, env
    detail.locator('.ma-tab[data-tab="logs"]').click()
    expect(detail.locator(".ma-log-main")).to_contain_text(payload, timeout=60_000)
    detail.locator('.ma-tab[data-tab="events"]').click()
    expect(detail.locator(".ma-events-table")).to_contain_text(payload, timeout=60_000)
    page.screenshot(path=str(SHOTS / "job-html-as-text.png"))
    assert page.locator('img[src="x"]').count() == 0
    assert page.locator("b.ma-xss").count() == 0
    assert page.evaluate("window.maXss") is None


SLOW_LINE = "this iteration hardware time is 9.0 and e2e time is 10.0 ms."


def test_a_jobs_performance_alert_shows_as_a_banner_on_its_page(ma_lab, browser_page):
    """The job page shows an alert event at once, whatever tab is open: a banner with the
    count and the latest reason, whose button opens the Events tab."""
    import shlex

    from playwright.sync_api import expect

    api, page = Api(ma_lab), browser_page
    script = f"import time\nprint({SLOW_LINE!r}, flush=True)\ntime.sleep(300)\n"
    job = api.submit(
        name="slow-job",
        command=f"python -c {shlex.quote(script)}",
        checkpoint_resume={"perf_threshold": 0.5, "perf_policy": "alert", "grace_period": 1},
    )
    try:
        table = _open_table(page)
        table.locator(f'tr[data-job-id="{job["id"]}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{job["id"]}"]')
        expect(detail).to_be_visible(timeout=30_000)
        banner = detail.locator(".ma-alert-banner")
        expect(banner).to_contain_text("performance alert on worker-0", timeout=120_000)
        expect(banner).to_contain_text("Alert")
        expect(banner).to_be_visible()
        page.screenshot(path=str(SHOTS / "job-alert-banner.png"))
        banner.locator(".ma-alert-open").click()
        expect(detail.locator(".ma-events-table .ma-event-alert")).to_contain_text("ALERT: performance alert")
    finally:
        api("POST", f"jobs/{job['id']}/stop")
