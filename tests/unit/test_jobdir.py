"""The job folder's layout is an on-disk format: a new service re-attaches to jobs an older one
launched, so every name is pinned here as a literal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ma_jupyter import config, jobdir
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.jobdir import PLACEHOLDER, JobDir, NodeDir

ROOT = Path("/home/u/.ma_jupyter/jobs/j-1")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_name_of_the_job_folder():
    jd = JobDir(ROOT)
    assert jd.job_id == "j-1"
    assert rel(jd.logs) == "logs"
    assert rel(jd.node_log("worker-0")) == "logs/worker-0.log"
    assert rel(jd.rank_dir("worker-0")) == "logs/worker-0"
    assert rel(jd.rank_log("worker-0", 3)) == "logs/worker-0/rank-3.log"
    assert rel(jd.log("worker-0")) == "logs/worker-0.log"
    assert rel(jd.log("worker-0", 1)) == "logs/worker-0/rank-1.log"
    assert jd.log_relative("worker-0") == "logs/worker-0.log"
    assert jd.log_relative("worker-0", 2) == "logs/worker-0/rank-2.log"
    assert rel(jd.nodes) == "nodes"
    nd = jd.node("worker-0")
    assert rel(nd.root) == "nodes/worker-0"
    assert rel(nd.exit_code) == "nodes/worker-0/exit_code"
    assert rel(nd.failure) == "nodes/worker-0/failure.json"
    assert jd.failure_relative("worker-0") == "nodes/worker-0/failure.json"
    assert rel(nd.marker) == "nodes/worker-0/marker"
    assert rel(nd.run_record) == "nodes/worker-0/run.json"
    assert rel(nd.runner_spec) == "nodes/worker-0/node-run.json"
    assert rel(nd.view_record) == "nodes/worker-0/view.json"
    assert rel(nd.hosts) == "nodes/worker-0/hosts"
    assert rel(nd.hostname) == "nodes/worker-0/hostname"
    assert rel(nd.workdir_record) == "nodes/worker-0/workdir.json"
    assert rel(nd.files) == "nodes/worker-0/view"
    assert rel(nd.tree) == "nodes/worker-0/workspace"
    assert rel(nd.home) == "nodes/worker-0/home"
    assert rel(nd.tmp) == "nodes/worker-0/tmp"
    assert rel(nd.heartbeat) == "nodes/worker-0/heartbeat"
    assert rel(nd.kept) == "nodes/worker-0/kept.json"
    assert rel(nd.stop_claim) == "nodes/worker-0/stop-claim"
    assert NodeDir.STALE == (
        "exit_code",
        "failure.json",
        "not-distributed.json",
        "heartbeat",
        "kept.json",
        "stop-claim",
    )
    assert rel(jd.outputs) == "outputs"
    assert rel(jd.prepared) == "prepared"
    assert rel(jd.workdirs) == "workdir"
    assert rel(jd.workdir("worker-0")) == "workdir/worker-0"
    assert rel(jd.prepared_dataset("private", "mnist", "v1")) == "prepared/private-mnist-v1"
    assert rel(jd.prepared_dataset("private", "mnist", "")) == "prepared/private-mnist-"


def test_names_seen_inside_a_node():
    assert jobdir.RANK_LOG_VIEW == "/job/logs"
    assert jobdir.RANK_LOG_ENV == "MA_RANK_LOG_DIR"
    assert jobdir.FAILURE_REPORT == "failure.json"
    assert jobdir.rank_log_name(7) == "rank-7.log"
    assert jobdir.rank_of("rank-7.log") == 7
    for other in ("rank-x.log", "rank-7.txt", "worker-0.log", "rank-.log"):
        assert jobdir.rank_of(other) is None


def test_the_dry_run_placeholder_and_the_deleted_name():
    assert str(PLACEHOLDER.outputs) == "<jobs>/<job-id>/outputs"
    doomed = JobDir(ROOT).doomed()
    assert doomed.parent == ROOT.parent and doomed.name.startswith(".deleted-j-1-")
    assert len(doomed.name) == len(".deleted-j-1-") + 6


@pytest.mark.parametrize("node", ["", "../x", "a/b", ".hidden", "x\0y"])
def test_node_names_that_could_leave_the_folder_are_refused(node):
    with pytest.raises(InvalidSpec) as info:
        JobDir(ROOT).log_relative(node)
    assert info.value.field == "node"


def test_a_negative_rank_is_refused():
    with pytest.raises(InvalidSpec) as info:
        JobDir(ROOT).log_relative("worker-0", -1)
    assert info.value.field == "rank"


def test_listing_looks_without_following(tmp_path):
    jd = JobDir(tmp_path / "j")
    assert jd.node_logs() == [] and jd.rank_logs("worker-0") == []
    jd.rank_dir("worker-0").mkdir(parents=True)
    jd.node_log("worker-1").write_text("")
    jd.node_log("worker-0").write_text("")
    for rank in (10, 2):
        jd.rank_log("worker-0", rank).write_text("")
    (jd.rank_dir("worker-0") / "rank-x.log").write_text("")
    assert jd.node_logs() == ["worker-0", "worker-1"]
    assert jd.rank_logs("worker-0") == [(2, jd.rank_log("worker-0", 2)), (10, jd.rank_log("worker-0", 10))]
    # a rank folder replaced by a symlink is not looked into
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-0.log").write_text("")
    os.symlink(elsewhere, jd.rank_dir("worker-1"))
    assert jd.rank_logs("worker-1") == []


def test_config_gives_the_job_folder(ma_home):
    jd = config.jobdir("j-1")
    assert jd.root == config.jobs_root() / "j-1"
    for bad in ("", "a/b", ".deleted-x"):
        with pytest.raises(InvalidSpec):
            config.jobdir(bad)
