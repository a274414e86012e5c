"""The JupyterLab sidebar and its server extension in a real JupyterLab.

JupyterLab runs on loopback with a token and temporary folders; the sidebar and the server
extension come from the installed package (``./dev setup`` builds and installs them), and the
job service is started by the server extension on first use, on a temporary
``MA_JUPYTER_HOME``.  Debian's chromium is driven through Python Playwright.
"""

from __future__ import annotations

import re
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.browser.lab import REPO, chromium, lab_page, running_lab
from tests.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

OUTPUT = REPO / "test-output" / "screenshots"
INSTALLED = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "ma_jupyter" / "package.json"

TRAIN = """import time
for i in range(600):
    print(f"sidebar line {i}", flush=True)
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def ma_lab(tmp_path_factory):
    """JupyterLab with the installed sidebar, on its own job-service home (see tests/browser/lab.py)."""
    if not INSTALLED.exists():
        pytest.fail(
            f"the sidebar is not installed in {sys.prefix}: run ./dev setup (it builds labextension/)"
        )
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        yield lab


@pytest.fixture(scope="module")
def ma_browser():
    """One chromium for the module's pages (each test opens a page of its own in it)."""
    with chromium() as browser:
        yield browser


def _api(ma_lab, path: str) -> str:
    return f"{ma_lab['url']}/ma-jupyter/api/v1/{path}"


def test_server_extension_needs_jupyter_auth_and_maps_typed_errors(ma_lab):
    headers = {"Authorization": f"token {ma_lab['token']}"}
    # without Jupyter's token: 403, and the job service is never reached
    assert requests.get(_api(ma_lab, "specs"), timeout=30).status_code == 403
    assert requests.post(_api(ma_lab, "jobs"), json={"name": "x"}, timeout=30).status_code == 403

    specs = requests.get(_api(ma_lab, "specs"), headers=headers, timeout=60)
    assert specs.status_code == 200, specs.text
    assert "cpu.small" in [s["name"] for s in specs.json()]

    bad = requests.post(
        _api(ma_lab, "jobs"), json={"name": "bad", "command": "A=1 python x.py"}, headers=headers, timeout=30
    )
    assert bad.status_code == 400
    assert bad.json()["error"] == "invalid_spec"
    assert "bash -c" in bad.json()["message"]

    missing = requests.get(_api(ma_lab, "jobs/no-such-job"), headers=headers, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"

    page = requests.get(_api(ma_lab, "jobs"), params={"status": "bogus"}, headers=headers, timeout=30)
    assert page.status_code == 400 and page.json()["field"] == "status"

    plan = requests.post(
        _api(ma_lab, "plan"), json={"name": "dry", "command": "python train.py"}, headers=headers, timeout=30
    )
    assert plan.status_code == 200, plan.text
    assert plan.json()["nodes"][0]["name"] == "worker-0"
    # a dry run creates nothing
    listing = requests.get(_api(ma_lab, "jobs"), params={"name": "dry"}, headers=headers, timeout=30).json()
    assert listing["total"] == 0


def test_log_long_poll_does_not_block_the_jupyter_server(ma_lab):
    headers = {"Authorization": f"token {ma_lab['token']}"}
    quiet = ma_lab["work"] / "quiet"
    quiet.mkdir()
    (quiet / "train.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    spec = {"name": "quiet-job", "command": "python /workspace/algorithm/train.py", "algorithm": str(quiet)}
    created = requests.post(_api(ma_lab, "jobs"), json=spec, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    def read(offset: int, wait: float) -> dict:
        r = requests.get(
            _api(ma_lab, f"jobs/{job_id}/logs/read"),
            params={"node": "worker-0", "offset": offset, "wait": wait},
            headers=headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.json()

    # print() writes the text and its newline apart when stdout is unbuffered: wait for both
    first = wait_for(lambda: (c := read(0, 5)) and "started\n" in c["data"] and c, timeout=60)
    assert first["next_offset"] == len("started\n") and not first["eof"]

    # a long-poll past the end waits for bytes that never come...
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(read, first["next_offset"], 20)
        # ...while other requests are answered meanwhile: the wait runs off the IOLoop
        for _ in range(3):
            assert requests.get(_api(ma_lab, "specs"), headers=headers, timeout=30).status_code == 200
            job = requests.get(_api(ma_lab, f"jobs/{job_id}"), headers=headers, timeout=30).json()
            assert job["status"] == "running"
        assert not pending.done()
        # stopping the job ends the long-poll with eof and nothing new
        requests.post(_api(ma_lab, f"jobs/{job_id}/stop"), headers=headers, timeout=30).raise_for_status()
        chunk = pending.result(timeout=60)
    assert chunk["data"] == "" or "started" not in chunk["data"]
    final = wait_for(lambda: (c := read(first["next_offset"], 5)) and c["eof"] and c, timeout=60)
    assert final["offset"] == first["next_offset"]


def test_sidebar_create_follow_stop(ma_lab, ma_browser):
    from playwright.sync_api import expect

    algorithm = ma_lab["work"] / "algo"
    algorithm.mkdir()
    (algorithm / "train.py").write_text(TRAIN)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    name = "sidebar-job"

    with lab_page(ma_lab, browser=ma_browser, width=1400, height=1000) as page:
        tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="ma-jupyter-sidebar"]')
        expect(tab).to_be_visible(timeout=60_000)
        tab.click()
        sidebar = page.locator("#ma-jupyter-sidebar")
        expect(sidebar).to_be_visible()
        expect(sidebar.locator(".ma-list-summary")).to_contain_text(re.compile(r"\bjobs\b"), timeout=30_000)

        # "New job" opens the create form in the main area
        sidebar.locator(".ma-new-job").click()
        form = page.locator('[data-ma-view="form"]').last
        expect(form).to_be_visible(timeout=30_000)
        expect(form.locator('[data-spec="cpu.small"] input')).to_be_attached(timeout=60_000)
        # the empty form is quiet: no error, no dry run asked (not even after its 5 s re-ask)
        plans: list[str] = []
        page.on("request", lambda r: plans.append(r.url) if "/plan" in r.url else None)
        prediction = form.locator("[data-ma-prediction]")
        expect(prediction).to_have_attribute("data-state", "empty", timeout=30_000)
        expect(prediction).to_contain_text("Type the command to run")
        page.wait_for_timeout(6_000)
        assert plans == [], plans
        expect(form.locator(".ma-field-invalid, .ma-message.ma-error, .ma-prediction-error")).to_have_count(0)
        form.locator('[data-ma-input="name"]').fill(name)
        form.locator('[data-ma-input="command"]').fill("python /workspace/algorithm/train.py")
        form.locator('[data-ma-input="algorithm"]').fill(str(algorithm))
        form.locator('[data-ma-input="env"]').fill("GREETING=hello")
        # ps is for TensorFlow only: the form shows it only there
        expect(form.locator('.ma-field[data-field="ps"]')).to_be_hidden()
        form.locator('[data-ma-input="mode"]').select_option("tensorflow")
        expect(form.locator('.ma-field[data-field="ps"]')).to_be_visible()
        form.locator('[data-ma-input="mode"]').select_option("single")
        # a typed error from the service shows at the field it names
        form.locator('[data-ma-input="duration"]').fill("soon")
        duration = form.locator('.ma-field[data-field="duration"]')
        expect(duration).to_have_class(re.compile("ma-field-invalid"), timeout=30_000)
        expect(duration.locator(".ma-field-error")).to_contain_text("duration")
        form.locator('[data-ma-input="duration"]').fill("1h")
        expect(duration).not_to_have_class(re.compile("ma-field-invalid"), timeout=30_000)
        page.screenshot(path=str(OUTPUT / "sidebar-form.png"))
        form.locator('[data-ma-action="submit"]').click()
        submitted = form.locator("[data-ma-submitted]")
        expect(submitted).to_be_attached(timeout=30_000)
        job_id = submitted.get_attribute("data-job-id")
        assert plans, "the edited form asks the dry run"
        # the sidebar's times carry their date, 24-hour; its service line no raw address
        meta = sidebar.locator(f'.ma-job-row[data-job-id="{job_id}"] .ma-job-meta')
        expect(meta).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), timeout=30_000)
        expect(meta).not_to_contain_text(re.compile("AM|PM"))
        service = sidebar.locator(".ma-service")
        expect(service).to_contain_text("Job service running (pid", timeout=30_000)
        expect(service).not_to_contain_text("http")

        # the job's page opens in the main area and follows its log
        job_page = page.locator(f'[data-ma-view="job"][data-job-id="{job_id}"]')
        expect(job_page).to_be_visible(timeout=30_000)
        expect(job_page.locator(".ma-job-title")).to_have_text(name)
        job_page.locator('.ma-tab[data-tab="logs"]').click()
        log = job_page.locator(".ma-log-main")
        expect(log).to_contain_text("sidebar line 3", timeout=90_000)
        expect(job_page.locator(".ma-job-head .ma-status-running")).to_be_visible(timeout=30_000)
        # the log keeps streaming while the job runs
        expect(log).to_contain_text("sidebar line 8", timeout=30_000)
        page.screenshot(path=str(OUTPUT / "sidebar-running.png"))
        job_page.locator('.ma-tab[data-tab="events"]').click()
        expect(job_page.locator(".ma-events-table")).to_contain_text("running", timeout=30_000)

        job_page.locator(".ma-op-stop").click()
        page.locator(".jp-Dialog button.jp-mod-warn").click()
        expect(job_page.locator(".ma-job-head .ma-status-stopped")).to_be_visible(timeout=60_000)
        expect(job_page.locator(".ma-op-stop")).to_be_disabled()
        expect(log).to_have_attribute("data-eof", "true", timeout=30_000)
        # the streamed log is exactly what the job wrote: nothing lost, nothing repeated
        written = (ma_lab["home"] / "jobs" / job_id / "logs" / "worker-0.log").read_text()
        assert "sidebar line 8" in written
        assert log.text_content() == written
        page.screenshot(path=str(OUTPUT / "sidebar-stopped.png"))

        row = sidebar.locator(f'.ma-job-row[data-job-name="{name}"]')
        expect(row.locator(".ma-status-stopped")).to_be_visible(timeout=30_000)
        # status filter: only running jobs hides it, stopped shows it again
        sidebar.locator(".ma-chip-running input").check()
        expect(row).to_have_count(0, timeout=10_000)
        sidebar.locator(".ma-chip-running input").uncheck()
        sidebar.locator(".ma-chip-stopped input").check()
        expect(row).to_have_count(1, timeout=10_000)
        # name filter
        sidebar.locator(".ma-filter-name").fill("no-such-name")
        expect(row).to_have_count(0, timeout=10_000)
        sidebar.locator(".ma-filter-name").fill("sidebar")
        expect(row).to_have_count(1, timeout=10_000)
        page.screenshot(path=str(OUTPUT / "sidebar-list.png"))

        # a click on a listed job brings its page to the front; Clone opens the main-area
        # form filled with the whole job
        row.click()
        expect(job_page).to_be_visible(timeout=30_000)
        job_page.locator(".ma-op-clone").click()
        clone = page.locator('[data-ma-view="form"]').last
        expect(clone.locator('[data-ma-input="name"]')).to_have_value(f"{name}-copy", timeout=30_000)
        expect(clone.locator('[data-ma-input="command"]')).to_have_value(
            "python /workspace/algorithm/train.py"
        )
        expect(clone.locator('[data-ma-input="algorithm"]')).to_have_value(str(algorithm))
        expect(clone.locator('[data-ma-input="env"]')).to_have_value("GREETING=hello")
        expect(clone.locator('[data-ma-input="duration"]')).to_have_value("3600")
        expect(clone.locator("[data-ma-prediction]")).to_have_attribute("data-state", "now", timeout=60_000)
        page.screenshot(path=str(OUTPUT / "sidebar-clone-form.png"))

        # delete asks first, then the job's tab closes and the job leaves the list
        row.click()
        expect(job_page).to_be_visible(timeout=30_000)
        job_page.locator(".ma-op-delete").click()
        page.locator(".jp-Dialog button.jp-mod-warn").click()
        expect(job_page).to_have_count(0, timeout=30_000)
        expect(sidebar.locator(f'.ma-job-row[data-job-name="{name}"]')).to_have_count(0, timeout=10_000)

    headers = {"Authorization": f"token {ma_lab['token']}"}
    jobs = requests.get(_api(ma_lab, "jobs"), params={"name": name}, headers=headers, timeout=30).json()
    assert jobs["total"] == 0


RANKED = """import os
import time
for i in range(600):
    print(f"rank {os.environ['RANK']} line {i}", flush=True)
    time.sleep(0.2)
"""


@pytest.mark.torch
def test_sidebar_streams_each_rank_of_a_distributed_job(ma_lab, ma_browser):
    from playwright.sync_api import expect

    algorithm = ma_lab["work"] / "ranked"
    algorithm.mkdir()
    (algorithm / "train.py").write_text(RANKED)
    headers = {"Authorization": f"token {ma_lab['token']}"}
    spec = {
        "name": "ranked-job",
        "mode": "pytorch",
        "nodes": 2,
        "command": "python /workspace/algorithm/train.py",
        "algorithm": str(algorithm),
    }
    created = requests.post(_api(ma_lab, "jobs"), json=spec, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    with lab_page(ma_lab, browser=ma_browser, width=1400, height=1000) as page:
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="ma-jupyter-sidebar"]').click()
        sidebar = page.locator("#ma-jupyter-sidebar")
        sidebar.locator(f'.ma-job-row[data-job-id="{job_id}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{job_id}"]')
        detail.locator('.ma-tab[data-tab="logs"]').click()
        streams = detail.locator(".ma-log-stream")
        # one combined log per node, and one per rank
        expect(streams.locator('option[value="worker-1/rank-1"]')).to_be_attached(timeout=90_000)
        expect(streams.locator('option[value="worker-0"]')).to_be_attached()
        log = detail.locator(".ma-log-main")
        # a job of several nodes opens on every node's lines, each prefixed with its node
        expect(streams.locator("option").first).to_have_attribute("value", "*")
        expect(streams).to_have_value("*")
        expect(log).to_contain_text("[worker-0] [rank 0] rank 0 line 2", timeout=60_000)
        expect(log).to_contain_text("[worker-1] [rank 1] rank 1 line 2", timeout=60_000)
        streams.select_option("worker-1/rank-1")
        expect(log).to_contain_text("rank 1 line 2", timeout=60_000)
        expect(log).not_to_contain_text("rank 0 line")
        page.screenshot(path=str(OUTPUT / "sidebar-ranks.png"))
        detail.locator(".ma-op-stop").click()
        page.locator(".jp-Dialog button.jp-mod-warn").click()
        expect(detail.locator(".ma-job-head .ma-status-stopped")).to_be_visible(timeout=60_000)


# a job's TensorBoard event file with one scalar, written as SummaryWriter does
WRITES_EVENTS = (
    "import sys, time, types\n"
    "sys.modules['tensorboard.compat.notf'] = types.ModuleType('tensorboard.compat.notf')  # no TensorFlow\n"
    "from tensorboard.compat.proto.event_pb2 import Event\n"
    "from tensorboard.compat.proto.summary_pb2 import Summary\n"
    "from tensorboard.summary.writer.event_file_writer import EventFileWriter\n"
    "w = EventFileWriter('/workspace/outputs')\n"
    "w.add_event(Event(wall_time=time.time(), step=1, summary=Summary(value=[Summary.Value(tag='loss', simple_value=0.5)])))\n"
    "w.close()\n"
)


def test_sidebar_tensorboard_button_opens_the_proxied_board(ma_lab, ma_browser):
    from playwright.sync_api import expect

    outputs = ma_lab["work"] / "board-outputs"  # made for the job, owned by the account it runs as
    headers = {"Authorization": f"token {ma_lab['token']}"}
    spec = {
        "name": "board-job",
        "command": f"python -c {shlex.quote(WRITES_EVENTS)}",
        "outputs": str(outputs),
    }
    created = requests.post(_api(ma_lab, "jobs"), json=spec, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    with lab_page(ma_lab, browser=ma_browser, width=1400, height=1000) as page:
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="ma-jupyter-sidebar"]').click()
        sidebar = page.locator("#ma-jupyter-sidebar")
        sidebar.locator(f'.ma-job-row[data-job-id="{job_id}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{job_id}"]')
        expect(detail.locator(".ma-job-head .ma-status-succeeded")).to_be_visible(timeout=60_000)
        # the detail embeds the board through the Jupyter proxy, and links to it
        detail.locator(".ma-op-tensorboard").click()
        frame = detail.locator("iframe.ma-tensorboard")
        expect(frame).to_have_attribute(
            "src", re.compile(f"/ma-jupyter/tensorboard/{job_id}/"), timeout=120_000
        )
        expect(page.frame_locator("iframe.ma-tensorboard").locator("body")).not_to_be_empty(timeout=60_000)
        with page.expect_popup(timeout=120_000) as popup_info:
            detail.locator(".ma-tb-link").click()
        board = popup_info.value
        board.wait_for_load_state()
        assert f"/ma-jupyter/tensorboard/{job_id}/" in board.url
        expect(board).to_have_title("TensorBoard", timeout=60_000)
        board.close()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / "job-tensorboard.png"))

        # a job that names no outputs folder gets one made for it, and its board too
        plain = requests.post(
            _api(ma_lab, "jobs"),
            json={"name": "board-default", "command": "python -V"},
            headers=headers,
            timeout=30,
        ).json()
        sidebar.locator(f'.ma-job-row[data-job-id="{plain["id"]}"]').click()
        detail = page.locator(f'[data-ma-view="job"][data-job-id="{plain["id"]}"]')
        expect(detail.locator(".ma-job-head .ma-status-succeeded")).to_be_visible(timeout=60_000)
        expect(detail.locator(".ma-op-tensorboard")).to_be_enabled()
        detail.locator(".ma-op-tensorboard").click()
        # it wrote no event files: a note says so (never TensorBoard's blank page), with a link
        empty = detail.locator("[data-ma-tb-empty]")
        expect(empty).to_contain_text("No TensorBoard event files in ", timeout=120_000)
        expect(empty).to_contain_text(f"/jobs/{plain['id']}/outputs.")
        expect(empty).to_contain_text("This job ended without writing any there")
        expect(empty.locator(".ma-tb-link")).to_have_attribute(
            "href", re.compile(f"/ma-jupyter/tensorboard/{plain['id']}/")
        )
        expect(detail.locator("iframe.ma-tensorboard")).to_have_count(0)

    # the same board through the proxy, outside the browser
    started = requests.post(_api(ma_lab, f"jobs/{job_id}/tensorboard"), headers=headers, timeout=120)
    assert started.status_code == 200, started.text
    # the service's own answer: the board's loopback address; the sidebar opens it through the proxy
    assert started.json()["url"].startswith("http://127.0.0.1:")
    proxy = f"/ma-jupyter/tensorboard/{job_id}/"
    # the proxy is behind Jupyter's authentication too
    assert requests.get(ma_lab["url"] + proxy, timeout=30, allow_redirects=False).status_code in (302, 403)
    page = requests.get(ma_lab["url"] + proxy, headers=headers, timeout=60)
    assert page.status_code == 200 and "<title>TensorBoard</title>" in page.text
    assert page.headers["Content-Type"].startswith("text/html")
    runs = requests.get(ma_lab["url"] + proxy + "data/runs", headers=headers, timeout=60)
    assert runs.status_code == 200 and runs.json() == ["."]
    # its assets stay under the proxy: the fonts' root-absolute URLs were made relative, and load
    assert "url(/" not in page.text
    fonts = re.findall(r"url\((font-roboto/[^)]+\.woff2)\)", page.text)
    assert fonts, page.text[:2000]
    font = requests.get(ma_lab["url"] + proxy + fonts[0], headers=headers, timeout=60)
    assert font.status_code == 200 and len(font.content) > 100, font.status_code
    stopped = requests.delete(_api(ma_lab, f"jobs/{job_id}/tensorboard"), headers=headers, timeout=60)
    assert stopped.status_code == 204

    # delete through the extension: the job has ended, so no force is needed; then it is gone
    assert requests.delete(_api(ma_lab, f"jobs/{job_id}"), headers=headers, timeout=30).status_code == 204
    assert requests.get(_api(ma_lab, f"jobs/{job_id}"), headers=headers, timeout=30).status_code == 404
