"""A job as the listing gives it: bounded whatever its spec holds, with what the listings show."""

from __future__ import annotations

from ma_jupyter.frontends import render
from ma_jupyter.models import (
    SUMMARY_FAILED_TASKS,
    SUMMARY_REASON_CHARS,
    BatchTask,
    Job,
    JobSpec,
    JobStatus,
    JobSummary,
    NodeRun,
)

DIGEST = "sha256:" + "a" * 64


def test_a_summary_holds_no_variable_command_or_mount_and_is_small():
    spec = JobSpec(
        name="big",
        command="python train.py " + "x" * 100_000,
        env={f"V{i}": "v" * 900 for i in range(1000)},
        secret_env={"TOKEN": "s3cr3t"},
        algorithm="/data/algo",
        algorithm_digest=DIGEST,
        creator="alice",
    )
    job = Job(id="big-1", spec=spec, status=JobStatus.error, reason="r" * 50_000, allowed=["view"])
    summary = JobSummary.of(job)
    text = summary.model_dump_json()
    assert len(text) < 2048
    assert "vvvv" not in text and "xxxx" not in text and "s3cr3t" not in text
    assert summary.spec.name == "big" and summary.spec.creator == "alice" and summary.name == "big"
    assert summary.algorithm_digests == [DIGEST] and summary.allowed == ["view"]
    assert len(summary.reason) == SUMMARY_REASON_CHARS and summary.reason.endswith("…")


def test_a_batch_jobs_tasks_are_counted_and_its_first_failures_named():
    tasks = [BatchTask(command=f"run {i}", algorithm_digest=DIGEST) for i in range(40)]
    spec = JobSpec(name="batch", type="batch", tasks=tasks)
    nodes = [NodeRun(name=f"task-{i}", state="exited", exit_code=1 if i < 30 else 0) for i in range(35)]
    summary = JobSummary.of(Job(id="b-1", spec=spec, nodes=nodes))
    assert summary.task_counts == {"failed": 30, "succeeded": 5, "queued": 5}
    assert summary.failed_tasks == [f"task-{i}" for i in range(SUMMARY_FAILED_TASKS)]
    assert render.task_summary(summary).startswith("5 queued, 5 succeeded, 30 failed (task-0, task-1")
    assert render.task_summary(summary).endswith(", …)")
    assert len(summary.model_dump_json()) < 2048
