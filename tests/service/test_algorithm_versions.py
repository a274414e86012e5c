"""Algorithm folders known by their content and origin, through a real service and real jobs:
every job shipped from a folder is found by it, a copy of its code anywhere is found by content,
the listing says which ran the folder's current content, the algorithms listing groups a
folder's versions, and the service records the content it read itself (a digest sent with the
job is replaced; a link in the folder is a link)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from ma_jupyter.algorithm_content import digest
from ma_jupyter.client.snapshot import copy_folder
from ma_jupyter.models import JobStatus
from tests.helpers import wait_for

PY = sys.executable
CODE_ROOT = "/home/ma-user/modelarts/user-job-dir"
FORGED = "sha256:" + "0" * 64


def _listing(ma_cli, *args: str) -> dict[str, str]:
    """``ma-jupyter jobs ARGS`` as {job name: its CODE column}."""
    out = ma_cli("jobs", *args)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[0]
    assert header.split()[-2:] == ["CODE", "REASON"], lines  # REASON: the one free-text column, last
    code = slice(header.index("CODE"), header.index("REASON"))
    return {line.split()[1]: line[code].strip() for line in lines[1:]}


def test_a_folders_versions_its_copies_and_the_modelarts_name(ma_module_cli, tmp_path):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    train = mnist / "train.py"
    for version in ("v1", "v2"):  # one edit between two shipped snapshots of one folder
        train.write_text(f"import os\nprint('{version} ran in', os.getcwd())\n")
        out = ma_module_cli(
            "submit",
            "--follow",
            "--name",
            version,
            "--convention",
            "modelarts",
            "--",
            "python",
            f"{CODE_ROOT}/mnist/train.py",
        )
        assert out.returncode == 0, out.stderr + out.stdout
        assert f"shipped {mnist}" in out.stderr
        # the layout names the code folder as the user knows it, not after its snapshot
        assert f"{version} ran in {CODE_ROOT}/mnist" in out.stdout
    copy = tmp_path / "elsewhere" / "mnist-copy"  # the same code in another place, used as is
    shutil.copytree(mnist, copy)
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.py").write_text("print('other')\n")
    for name, folder in (("copied", "elsewhere/mnist-copy"), ("unrelated", "other")):
        out = ma_module_cli(
            "submit", "--wait", "--name", name, "--code-dir", folder, "--", "python", "train.py"
        )
        assert out.returncode == 0, out.stderr + out.stdout

    # by origin: both snapshots, v1 an older version; by content: the copy
    assert _listing(ma_module_cli, "--algorithm", "mnist") == {
        "v2": "current",
        "v1": "older",
        "copied": "current",
    }
    page = json.loads(ma_module_cli("jobs", "--algorithm", "mnist", "--json").stdout)
    jobs = {j["spec"]["name"]: j["spec"] for j in page["items"]}
    assert page["algorithm_digest"] == digest(mnist)
    assert jobs["v1"]["algorithm_origin"] == jobs["v2"]["algorithm_origin"] == str(mnist)
    assert jobs["v1"]["algorithm"] != jobs["v2"]["algorithm"]  # two snapshots
    assert (
        jobs["v1"]["algorithm_digest"] != jobs["v2"]["algorithm_digest"] == jobs["copied"]["algorithm_digest"]
    )
    assert jobs["copied"]["algorithm"] == str(copy)
    # the copy's own folder finds it too, and the shipped jobs of the same content
    assert _listing(ma_module_cli, "--algorithm", "elsewhere/mnist-copy") == {
        "copied": "current",
        "v2": "current",
    }

    # the algorithms listing: the folder's two versions, newest first; the copy ran one of them
    found = {a["path"]: a for a in json.loads(ma_module_cli("algorithms", "--json").stdout)}
    versions = [(v["digest"], v["jobs"]) for v in found[str(mnist)]["versions"]]
    assert versions == [(jobs["v2"]["algorithm_digest"], 1), (jobs["v1"]["algorithm_digest"], 1)]
    assert found[str(mnist)]["jobs"] == 2
    assert [v["digest"] for v in found[str(copy)]["versions"]] == [jobs["v2"]["algorithm_digest"]]
    table = ma_module_cli("algorithms", "--versions").stdout
    assert f"version {jobs['v1']['algorithm_digest'][7:19]}" in table, table

    # the folder back at its first version: v1 is current, the copy no longer this content
    train.write_text("import os\nprint('v1 ran in', os.getcwd())\n")
    assert _listing(ma_module_cli, "--algorithm", "mnist") == {"v2": "older", "v1": "current"}
    # a folder that cannot be read now: its jobs by origin, their versions unknown
    shutil.rmtree(mnist)
    assert _listing(ma_module_cli, "--algorithm", "mnist") == {"v2": "-", "v1": "-"}


def test_the_service_records_the_content_it_reads_not_what_the_client_says(ma_module_service, tmp_path):
    api = ma_module_service.api
    owner = ma_module_service.session()
    folder = tmp_path / "algo"
    folder.mkdir()
    (folder / "train.py").write_text("print(open('settings.txt').read())\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("print('same bytes')\n")
    (folder / "settings.txt").symlink_to(secret)  # a link planted in the folder, towards outside
    reply = owner.post(
        f"{api}/jobs",
        json={
            "name": "forged",
            "algorithm": str(folder),
            "algorithm_digest": FORGED,
            "command": f"{PY} -c pass",
        },
        timeout=60,
    )
    assert reply.status_code == 201, reply.text
    job = reply.json()
    recorded = job["spec"]["algorithm_digest"]
    assert recorded != FORGED and recorded == digest(folder)
    # the link was digested as a link: a snapshot (which keeps links) has the same content,
    # the folder with the link's target in its place another
    kept = tmp_path / "kept"
    copy_folder(folder, kept)
    assert digest(kept) == recorded
    followed = tmp_path / "followed"
    shutil.copytree(folder, followed, symlinks=False)
    assert digest(followed) != recorded

    def listing(**params) -> dict:
        page = owner.get(f"{api}/jobs", params=params, timeout=30)
        assert page.status_code == 200, page.text
        return page.json()

    # the forged content finds nothing; the real one finds the job, wherever searched from
    assert listing(algorithm_digest=FORGED)["total"] == 0
    assert [j["id"] for j in listing(algorithm_digest=recorded)["items"]] == [job["id"]]
    # the link's target changing is no change of the folder
    secret.write_text("print('changed')\n")
    page = listing(algorithm=str(followed), algorithm_digest=digest(folder))
    assert [j["id"] for j in page["items"]] == [job["id"]] and page["algorithm_digest"] == recorded
    bad = owner.get(f"{api}/jobs", params={"algorithm_digest": "md5:abc"}, timeout=30)
    assert bad.status_code == 400 and "sha256:" in bad.json()["message"]

    # a batch job: each task's folder is read, forged values replaced, shared folders once
    tasks = [
        {"algorithm": str(folder), "command": f"{PY} -c pass", "algorithm_digest": FORGED},
        {"algorithm": str(kept), "command": f"{PY} -c pass"},
    ]
    batch = owner.post(f"{api}/jobs", json={"name": "sweep", "type": "batch", "tasks": tasks}, timeout=60)
    assert batch.status_code == 201, batch.text
    assert [t["algorithm_digest"] for t in batch.json()["spec"]["tasks"]] == [recorded, recorded]
    found = {j["id"] for j in listing(algorithm_digest=recorded)["items"]}
    assert found == {job["id"], batch.json()["id"]}


@pytest.mark.small_cluster
def test_a_folder_used_as_is_edited_while_its_job_queued_is_recorded_as_it_ran(ma_client, tmp_path):
    folder = tmp_path / "algo"
    folder.mkdir()
    (folder / "train.py").write_text("print('first version')\n")
    # a cpu.medium job fills the node "tiny", so the next job pinned there queues
    blocker = ma_client.submit(
        name="blocker",
        command=f"{PY} -c 'import time; time.sleep(300)'",
        specs=["cpu.medium"],
        node_name="tiny",
    )
    wait_for(lambda: blocker.status is JobStatus.running, timeout=60)
    queued = ma_client.submit(
        name="queued", algorithm=str(folder), command="python train.py", node_name="tiny"
    )
    assert queued.status is JobStatus.queued
    at_submit = queued.info.spec.algorithm_digest
    assert at_submit == digest(folder)
    (folder / "train.py").write_text("print('second version')\n")  # edited while it waits
    blocker.stop()
    assert queued.wait(timeout=120).status is JobStatus.succeeded
    assert "second version" in "\n".join(queued.logs())
    ran = queued.info.spec.algorithm_digest
    assert ran == digest(folder) != at_submit
    said = [e.reason for e in queued.events()]
    assert any(f"algorithm folder {folder} changed since the submit" in r for r in said), said
    found = [h.id for h in ma_client.jobs(algorithm=str(folder))]
    assert queued.id in found
    page = ma_client.job_page(algorithm_digest=at_submit)
    assert queued.id not in [j.id for j in page.items]  # the version it did not run


def test_a_folder_with_a_file_the_jobs_account_cannot_read_has_no_recorded_content(
    ma_module_service, tmp_path
):
    """The service (root here) reads with its own rights; the user's jobs run as another
    account (``[users] job_account``, nobody): a file only root reads makes the content unknown,
    else the recorded digest would change with that file."""
    api = ma_module_service.api
    owner = ma_module_service.session()
    folder = tmp_path / "algo"
    folder.mkdir()
    folder.chmod(0o755)
    (folder / "train.py").write_text("print('hi')\n")
    private = folder / "private.txt"
    private.write_text("only root reads this\n")
    private.chmod(0o600)

    def recorded() -> str | None:
        body = {"name": "unreadable", "algorithm": str(folder), "command": f"{PY} -c pass"}
        reply = owner.post(f"{api}/jobs", json=body, timeout=60)
        assert reply.status_code == 201, reply.text
        return reply.json()["spec"]["algorithm_digest"]

    assert digest(folder) is not None  # root reads it whole
    assert recorded() is None
    private.write_text("changed, still only root's\n")
    assert recorded() is None  # nothing of its change shows
    private.chmod(0o644)
    assert recorded() == digest(folder) is not None


@pytest.mark.small_cluster
def test_a_folder_edited_past_the_read_limit_while_queued_is_not_read_again_at_the_start(ma_client, tmp_path):
    """The first start reads a folder used as is again under the supervisor's lock: more than
    64 MB of changed files are not read there, and the content is recorded as unknown."""
    folder = tmp_path / "algo"
    folder.mkdir()
    (folder / "train.py").write_text("print('first version')\n")
    blocker = ma_client.submit(
        name="blocker",
        command=f"{PY} -c 'import time; time.sleep(300)'",
        specs=["cpu.medium"],
        node_name="tiny",
    )
    wait_for(lambda: blocker.status is JobStatus.running, timeout=60)
    queued = ma_client.submit(
        name="queued", algorithm=str(folder), command="python train.py", node_name="tiny"
    )
    assert queued.status is JobStatus.queued
    assert queued.info.spec.algorithm_digest == digest(folder) is not None
    with open(folder / "weights.bin", "wb") as weights:  # 65 MB added while it waits
        for _ in range(65):
            weights.write(b"\1" * (1 << 20))
    blocker.stop()
    assert queued.wait(timeout=120).status is JobStatus.succeeded
    assert queued.info.spec.algorithm_digest is None
    said = [e.reason for e in queued.events()]
    assert any(f"{folder} changed since the submit" in r and "not read again" in r for r in said), said


def test_a_code_folder_holding_a_chain_too_deep_is_refused_at_the_submit(ma_module_service, tmp_path):
    """A 1,100-deep chain of folders in an algorithm folder (a recursive walk raised
    RecursionError on it, and the submit answered 500): the submit is refused with 422, naming
    the folder and the bound, and nothing is made."""
    from ma_jupyter.foldersize import MAX_DEPTH, remove_tree

    folder = tmp_path / "algo"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):  # each made relative to its parent's descriptor, as a job would
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    session = ma_module_service.session()
    try:
        for body in (
            {"name": "deep", "algorithm": str(folder), "command": f"{PY} -c pass"},
            {
                "name": "deep",
                "type": "batch",
                "tasks": [{"algorithm": str(folder), "command": f"{PY} -c pass"}],
            },
        ):
            reply = session.post(f"{ma_module_service.api}/jobs", json=body, timeout=120)
            assert reply.status_code == 422, reply.text
            answer = reply.json()
            assert answer["error"] == "folder_refused", answer
            assert str(folder) in answer["message"] and f"more than {MAX_DEPTH} deep" in answer["message"], (
                answer
            )
        # nothing made (the module's service is shared: the jobs of this test's name)
        made = session.get(f"{ma_module_service.api}/jobs", params={"name": "deep"}, timeout=10)
        assert made.json()["total"] == 0
    finally:
        assert remove_tree(folder).complete  # pytest's own clean-up would recurse
