"""A plain client's views (``ma_jupyter/client/plain.py``) read a job as its pydantic model does:
the field table is the model's, every field has the model's value, the rest is the model's own,
and the CLI's texts of a view are those of the model."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

from ma_jupyter import models
from ma_jupyter.client import plain
from ma_jupyter.client.plain import FIELDS, Plain
from ma_jupyter.frontends import render


def test_the_field_table_is_the_models():
    written = Path(plain.__file__).with_name("plain_fields.py").read_text()
    assert written == plain.fields_source(), "regenerate it: python -m ma_jupyter.client.plain"
    assert set(FIELDS["Job"]) == set(models.Job.model_fields)


def _job() -> models.Job:
    """A batch job that ran (tasks, nodes with ranks, every time set, a devenv origin unset)."""
    started = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    return models.Job.model_validate(
        {
            "id": "batch-1a2b",
            "spec": {
                "name": "batch",
                "type": "batch",
                "tasks": [{"command": "python a.py"}, {"command": "python b.py"}],
                "duration": 3600,
                "priority": "urgent",
                "datasets": [{"name": "d", "path": "/data/d"}],
                "checkpoint_resume": None,
            },
            "status": "error",
            "reason": "task-1 exited with code 3\nlast log lines:\nboom",
            "created_at": started.isoformat(),
            "started_at": started.isoformat(),
            "finished_at": "2026-01-02T04:05:06Z",
            "exit_code": 3,
            "nodes": [
                {"name": "task-0", "state": "exited", "exit_code": 0, "pid": 12, "ranks": [0]},
                {"name": "task-1", "state": "exited", "exit_code": 3, "host": "big", "ranks": [1]},
            ],
        }
    )


def _same(view, model, where: str) -> None:
    """Every field of ``view`` equals ``model``'s, nested views field by field."""
    for field in FIELDS[plain.model_name(view)]:
        ours, theirs = getattr(view, field), getattr(model, field)
        if isinstance(ours, Plain):
            _same(ours, theirs, f"{where}.{field}")
        elif isinstance(ours, list) and ours and isinstance(ours[0], Plain):
            assert len(ours) == len(theirs), f"{where}.{field}"
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                _same(a, b, f"{where}.{field}[{i}]")
        else:
            assert ours == theirs and type(ours) is type(theirs), f"{where}.{field}: {ours!r} != {theirs!r}"
            if isinstance(ours, Enum):
                assert ours is theirs, f"{where}.{field}"


def test_a_view_reads_every_field_as_the_model_and_leaves_the_rest_to_it():
    job = _job()
    data = job.model_dump(mode="json")
    view = Plain("Job", data)
    _same(view, job, "Job")
    assert view.status is models.JobStatus.error and view.started_at.tzinfo is not None
    # rule 3: methods and properties are the model's own, validated on first use
    assert view._model is None
    assert view.log_node == job.log_node == "task-0"
    assert view.rank_elsewhere("task-0", 1) == job.rank_elsewhere("task-0", 1)
    assert view.model_dump(mode="json") == data
    # the CLI's texts
    assert render.format_job(view) == render.format_job(job)
    assert render.status_line(view) == render.status_line(job)
    summary = models.JobSummary.of(job)
    page = models.JobPage(items=[summary], total=1)
    page_view = Plain("JobPage", page.model_dump(mode="json"))
    _same(page_view, page, "JobPage")
    listed = page_view.items[0]
    assert (render.list_reason(listed), render.elapsed(listed), render.task_summary(listed)) == (
        render.list_reason(summary),
        render.elapsed(summary),
        render.task_summary(summary),
    )
