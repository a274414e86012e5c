"""``JobForm``: every field of a job in widgets, validated as you type, with a Submit button.

The form edits a :class:`~ma_jupyter.models.JobSpec`: mode-dependent fields show only when they
apply (parameter servers and chief for TensorFlow, node count for distributed modes), fault
restart and checkpoint resume exclude each other, specs are a multi-select filled from the
service, mounts (datasets, models, volumes, annotations) are edited row by row.  Every change
re-validates the spec with :func:`ma_jupyter.client.spec.check` and shows the problems inline;
Submit sends it through the client (a script typed into the form is snapshotted exactly like a
``%%ma_train`` cell body).

Why one module (over 600 lines): it is one widget, the job form: its fields, the rules that show
or hide them and the inline validation act on one set of widgets and change together; what it
shares with other front ends (options, text formats, the client) lives in their rooms.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from .... import spectext
from ....client.spec import check, host_path
from ....errors import MaJupyterError
from ....models import (
    Access,
    Convention,
    DatasetSource,
    JobSpec,
    JobType,
    Mode,
    ModelSource,
    PerfPolicy,
    Priority,
)
from ....workspace_paths import ALGORITHM_VIEW, OUTPUTS_VIEW, script_command

if TYPE_CHECKING:
    from ....client import Client

MOUNT_KINDS = ("dataset", "model", "volume", "annotation")
_LAYOUT = {"description_width": "130px"}


def _text(description: str, value: str = "", placeholder: str = "", **kw) -> W.Text:
    return W.Text(
        value=value,
        description=description,
        placeholder=placeholder,
        style=_LAYOUT,
        layout=W.Layout(width="95%"),
        **kw,
    )


def image_from_text(text: str) -> dict:
    """The ``image`` field from what a user types (:mod:`ma_jupyter.spectext`, rule 2)."""
    return spectext.image_from_text(text, lambda path: Path(path).is_dir())


def image_to_text(image: dict) -> str:
    return spectext.image_text(image)


SOURCES = {
    "dataset": [s.value for s in DatasetSource],
    "model": [s.value for s in ModelSource],
}


class MountRow(W.HBox):
    """One mount: kind, source and version (datasets, models), name, host path, read-only."""

    def __init__(self, on_change: Callable[[], None], on_remove: Callable[[MountRow], None], **values: Any):
        self.kind = W.Dropdown(
            options=MOUNT_KINDS, value=values.get("kind", "dataset"), layout=W.Layout(width="110px")
        )
        self.source = W.Dropdown(options=["private"], value="private", layout=W.Layout(width="105px"))
        self.name = W.Text(value=values.get("name", ""), placeholder="name", layout=W.Layout(width="130px"))
        self.version = W.Text(
            value=values.get("version") or "", placeholder="version", layout=W.Layout(width="80px")
        )
        self.path = W.Text(
            value=values.get("path", ""),
            placeholder="host folder or s3://BUCKET/PREFIX",
            layout=W.Layout(width="300px"),
        )
        self.read_only = W.Checkbox(
            value=values.get("read_only", True), description="read-only", indent=False
        )
        self.remove = W.Button(icon="trash", tooltip="remove this mount", layout=W.Layout(width="40px"))
        self.remove.on_click(lambda _b: on_remove(self))
        self._kind_rules()
        if values.get("source") in self.source.options:
            self.source.value = values["source"]
        for w in (self.kind, self.source, self.name, self.version, self.path, self.read_only):
            w.observe(lambda _c: on_change(), names="value")
        self.kind.observe(lambda _c: self._kind_rules(), names="value")
        super().__init__(
            [self.kind, self.source, self.name, self.version, self.path, self.read_only, self.remove]
        )

    def _kind_rules(self) -> None:
        # models and annotations are always read-only, volumes always writable: only datasets
        # choose; only datasets and models have a source and a version
        kind = self.kind.value
        self.read_only.disabled = kind != "dataset"
        if kind in ("model", "annotation"):
            self.read_only.value = True
        elif kind == "volume":
            self.read_only.value = False
        sources = SOURCES.get(kind)
        self.source.options = sources or ["-"]
        self.source.value = "private" if sources else "-"
        self.source.disabled = self.version.disabled = not sources
        if not sources:
            self.version.value = ""

    def entry(self) -> tuple[str, dict]:
        # a host folder made absolute; an object storage URI (s3://, obs://) kept as it is
        path = host_path(self.path.value.strip(), Path.cwd()) if self.path.value.strip() else ""
        item: dict[str, Any] = {"name": self.name.value.strip(), "path": path}
        if self.kind.value in SOURCES:
            item["source"] = self.source.value
            if self.version.value.strip():
                item["version"] = self.version.value.strip()
        if self.kind.value == "dataset":
            item["read_only"] = self.read_only.value
        return {"dataset": "datasets", "model": "models", "volume": "volumes", "annotation": "annotations"}[
            self.kind.value
        ], item


class JobForm(W.VBox):
    """A widget form for one job.

    Args:
        client: the :class:`~ma_jupyter.client.Client` (default: the notebook's shared one).
        spec: a JobSpec (or dict) to start from, e.g. the job being cloned.
        on_submit: called with the new JobHandle after a successful submit.

    Attributes:
        errors: the inline validation messages (an HTML widget).
        submitted: the handles submitted from this form, newest last.
    """

    def __init__(
        self,
        client: Client | None = None,
        spec: JobSpec | dict | None = None,
        on_submit: Callable[[Any], None] | None = None,
    ):
        self._client = client
        self._callbacks: list[Callable[[Any], None]] = [on_submit] if on_submit else []
        self.submitted: list[Any] = []
        self._loading = False

        self.name = _text("name", "train", "letters, digits, - _ .")
        self.type = W.Dropdown(
            options=[t.value for t in JobType], value="regular", description="type", style=_LAYOUT
        )
        self.priority = W.Dropdown(
            options=[p.value for p in Priority], value="normal", description="priority", style=_LAYOUT
        )
        self.access = W.Dropdown(
            options=[
                ("read-only for others", "ro"),
                ("read-write for others", "rw"),
                ("hidden from others", "none"),
            ],
            value=Access.ro.value,
            description="others' access",
            style=_LAYOUT,
        )
        self.mode = W.Dropdown(
            options=[m.value for m in Mode], value="single", description="mode", style=_LAYOUT
        )
        self.convention = W.Dropdown(
            options=[c.value for c in Convention], value="platform", description="convention", style=_LAYOUT
        )
        self.specs = W.SelectMultiple(
            options=self._spec_options(), description="specs", style=_LAYOUT, rows=4
        )
        if "cpu.small" in self.specs.options:
            self.specs.value = ("cpu.small",)
        self.nodes = W.BoundedIntText(value=1, min=1, max=64, description="nodes", style=_LAYOUT)
        self.ps = W.BoundedIntText(value=0, min=0, max=64, description="parameter servers", style=_LAYOUT)
        self.chief = W.Checkbox(value=False, description="chief task", indent=False)
        self.command = _text("command", "", f"default: {script_command('<name>')} for the script below")
        self.code = W.Textarea(
            value="",
            placeholder=f"training script (saved as {ALGORITHM_VIEW}/<name>.py), or leave empty and give an algorithm folder",
            description="script",
            style=_LAYOUT,
            layout=W.Layout(width="95%", height="140px"),
        )
        self.algorithm = _text("algorithm folder", "", f"host folder shipped as {ALGORITHM_VIEW}")
        self.outputs = _text(
            "outputs folder", "", f"host folder shown at {OUTPUTS_VIEW}, or s3://BUCKET/PREFIX (uploaded)"
        )
        self.mount_rows = W.VBox([])
        self.add_mount = W.Button(description="add mount", icon="plus")
        self.add_mount.on_click(lambda _b: self._add_mount())
        self.image = _text(
            "image",
            "",
            "python path, venv folder, conda:<env> or a registered image (default: the service's)",
        )
        self.node_name = _text("node name", "")
        self.driver_version = _text("driver version", "")
        self.pool = _text("dedicated pool", "")
        self.env = W.Textarea(
            value="",
            placeholder="KEY=VALUE, one per line",
            description="environment",
            style=_LAYOUT,
            layout=W.Layout(width="95%", height="60px"),
        )
        self.duration = _text("duration", "", "e.g. 30m, 2h (empty: no limit)")
        self.workdir = _text("workdir", "", f"default {ALGORITHM_VIEW}")
        self.grace = W.BoundedFloatText(
            value=10.0, min=0.1, max=3600, description="stop grace (s)", style=_LAYOUT
        )
        self.fault_restart = W.Checkbox(value=False, description="fault restart", indent=False)
        self.max_restarts = W.BoundedIntText(
            value=3, min=1, max=100, description="max restarts", style=_LAYOUT
        )
        self.checkpoint_resume = W.Checkbox(value=False, description="checkpoint resume", indent=False)
        self.max_resumes = W.BoundedIntText(value=3, min=1, max=100, description="max resumes", style=_LAYOUT)
        self.resume_grace = W.BoundedFloatText(
            value=30.0, min=0.1, max=3600, description="save grace (s)", style=_LAYOUT
        )
        self.elastic_min_nodes = W.BoundedIntText(
            value=0, min=0, max=64, description="elastic min nodes", style=_LAYOUT
        )
        self.allow_scale_up = W.Checkbox(value=False, description="allow scale-up", indent=False)
        self.perf_threshold = W.BoundedFloatText(
            value=0.0, min=0.0, max=1000, description="perf threshold", style=_LAYOUT
        )
        self.perf_policy = W.Dropdown(
            options=[p.value for p in PerfPolicy], value="alert", description="perf policy", style=_LAYOUT
        )
        self.algorithm_writable = W.Checkbox(value=False, description="algorithm writable", indent=False)
        self.data_preparation = W.Checkbox(value=False, description="data preparation", indent=False)
        self.debug_terminal = W.Checkbox(value=False, description="debug terminal", indent=False)
        self.storage_env = W.Checkbox(
            value=False,
            description="storage credentials in the job",
            indent=False,
            tooltip="give your AWS_* object storage credentials to the job's own environment too",
        )
        self.on_start = _text("on start", "", "lifecycle command run on every node first")
        self.on_stop = _text("on stop", "", "lifecycle command run on every node at the end")
        self.tasks = W.Textarea(
            value="",
            placeholder=f"batch tasks, one per line: ALGORITHM_FOLDER{spectext.TASK_SEPARATOR}COMMAND",
            description="tasks",
            style=_LAYOUT,
            layout=W.Layout(width="95%", height="60px"),
        )

        self.name.add_class("ma-form-name")
        self.code.add_class("ma-form-code")
        self.command.add_class("ma-form-command")
        self.errors = W.HTML(value="")
        self.errors.add_class("ma-form-errors")
        self.result = W.HTML(value="")
        self.result.add_class("ma-form-result")
        self.submit_button = W.Button(description="Submit", button_style="primary", icon="play")
        self.submit_button.add_class("ma-form-submit")
        self.submit_button.on_click(lambda _b: self.submit())
        self.plan_button = W.Button(description="Dry run", icon="list")
        self.plan_button.on_click(lambda _b: self.dry_run())

        self.tf_box = W.HBox([self.ps, self.chief])
        self.restart_box = W.HBox([self.fault_restart, self.max_restarts])
        self.resume_options = W.VBox(
            [
                W.HBox([self.max_resumes, self.resume_grace]),
                W.HBox([self.elastic_min_nodes, self.allow_scale_up, self.perf_threshold, self.perf_policy]),
            ]
        )
        self.resume_box = W.VBox([self.checkpoint_resume, self.resume_options])
        self.batch_box = W.VBox([self.tasks])
        advanced = W.VBox(
            [
                self.image,
                self.node_name,
                self.driver_version,
                self.pool,
                self.env,
                self.workdir,
                self.grace,
                self.on_start,
                self.on_stop,
                W.HBox([self.data_preparation, self.debug_terminal, self.storage_env]),
            ]
        )
        self.advanced = W.Accordion(children=[advanced], titles=("advanced",), selected_index=None)
        super().__init__(
            [
                W.HTML("<b>New training job</b>"),
                self.name,
                W.HBox([self.type, self.priority]),
                W.HBox([self.mode, self.convention]),
                self.specs,
                self.nodes,
                self.tf_box,
                self.command,
                self.code,
                self.batch_box,
                W.HBox([self.algorithm, self.algorithm_writable]),
                self.outputs,
                W.HTML(
                    "mounts (datasets read-only unless unticked; models always read-only; volumes writable):"
                ),
                self.mount_rows,
                self.add_mount,
                W.HBox([self.duration]),
                self.restart_box,
                self.resume_box,
                self.access,
                self.advanced,
                self.errors,
                W.HBox([self.submit_button, self.plan_button]),
                self.result,
            ]
        )
        self.add_class("ma-job-form")
        for w in self._inputs():
            w.observe(self._changed, names="value")
        self.fault_restart.observe(self._exclusive, names="value")
        self.checkpoint_resume.observe(self._exclusive, names="value")
        if spec is not None:
            self.load(spec)
        self._refresh_visibility()
        self.validate()

    # ----------------------------------------------------------------------------- plumbing

    @property
    def client(self) -> Any:
        if self._client is None:
            from ..session import get_client

            self._client = get_client()
        return self._client

    def _spec_options(self) -> list[str]:
        try:
            return [s.name for s in self.client.specs()]
        except MaJupyterError:
            return ["cpu.small"]

    def _inputs(self) -> list[W.Widget]:
        return [
            self.name,
            self.type,
            self.priority,
            self.access,
            self.mode,
            self.convention,
            self.specs,
            self.nodes,
            self.ps,
            self.chief,
            self.command,
            self.code,
            self.algorithm,
            self.outputs,
            self.image,
            self.node_name,
            self.driver_version,
            self.pool,
            self.env,
            self.duration,
            self.workdir,
            self.grace,
            self.fault_restart,
            self.max_restarts,
            self.checkpoint_resume,
            self.max_resumes,
            self.resume_grace,
            self.elastic_min_nodes,
            self.allow_scale_up,
            self.perf_threshold,
            self.perf_policy,
            self.algorithm_writable,
            self.data_preparation,
            self.debug_terminal,
            self.storage_env,
            self.on_start,
            self.on_stop,
            self.tasks,
        ]

    def on_submit(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(handle)`` after each successful submit."""
        self._callbacks.append(callback)

    def _changed(self, _change: Any = None) -> None:
        if self._loading:
            return
        self._refresh_visibility()
        self.validate()

    def _exclusive(self, change: Any) -> None:
        # fault restart and checkpoint resume exclude each other: ticking one unticks the other
        if change["new"]:
            other = self.checkpoint_resume if change["owner"] is self.fault_restart else self.fault_restart
            other.value = False

    def _refresh_visibility(self) -> None:
        tensorflow = self.mode.value == Mode.tensorflow.value
        self.tf_box.layout.display = None if tensorflow else "none"
        if not tensorflow:
            self.ps.value = 0
            self.chief.value = False
        single = self.mode.value == Mode.single.value
        self.nodes.layout.display = "none" if single else None
        if single:
            self.nodes.value = 1
        batch = self.type.value == JobType.batch.value
        self.batch_box.layout.display = None if batch else "none"
        self.command.layout.display = "none" if batch else None
        self.code.layout.display = "none" if batch else None
        self.resume_box.layout.display = "none" if batch else None
        self.max_restarts.layout.display = None if self.fault_restart.value else "none"
        self.resume_options.layout.display = None if self.checkpoint_resume.value else "none"

    def _add_mount(self, **values: Any) -> MountRow:
        row = MountRow(self._changed, self._remove_mount, **values)
        self.mount_rows.children = (*self.mount_rows.children, row)
        self._changed()
        return row

    def add_mount_row(self, kind: str, name: str, path: str, read_only: bool = True) -> MountRow:
        """Add a mount row (what the "add mount" button does), filled in."""
        return self._add_mount(kind=kind, name=name, path=path, read_only=read_only)

    def _remove_mount(self, row: MountRow) -> None:
        self.mount_rows.children = tuple(r for r in self.mount_rows.children if r is not row)
        self._changed()

    # ----------------------------------------------------------------------------- the spec

    def spec_dict(self) -> dict:
        """The job the form describes, as the dict :func:`parse_spec` takes (not validated)."""
        name = self.name.value.strip()
        spec: dict[str, Any] = {
            "name": name,
            "type": self.type.value,
            "priority": self.priority.value,
            "access": self.access.value,
            "mode": self.mode.value,
            "convention": self.convention.value,
            "specs": list(self.specs.value),
            "nodes": self.nodes.value,
            "grace_period": self.grace.value,
            "data_preparation": self.data_preparation.value,
            "debug_terminal": self.debug_terminal.value,
            "storage_env": self.storage_env.value,
        }
        if self.mode.value == Mode.tensorflow.value:
            spec["ps"] = self.ps.value
            spec["chief"] = self.chief.value
        if self.type.value == JobType.batch.value:
            tasks = []
            for line in self.tasks.value.splitlines():
                if line.strip():
                    # a form's task line may be a bare command (spectext rule 1)
                    parts = spectext.split_task(line)
                    tasks.append(
                        {"command": line.strip()}
                        if parts is None
                        else {"algorithm": parts[0], "command": parts[1]}
                    )
            spec["tasks"] = tasks
        else:
            command = self.command.value.strip()
            if not command and self.code.value.strip():
                command = script_command(name)
            spec["command"] = command or None
        for field, widget in (
            ("algorithm", self.algorithm),
            ("outputs", self.outputs),
            ("workdir", self.workdir),
        ):
            value = widget.value.strip()
            if value:
                spec[field] = value if field == "workdir" else host_path(value, Path.cwd())
        for field, widget in (
            ("node_name", self.node_name),
            ("driver_version", self.driver_version),
            ("pool", self.pool),
        ):
            if widget.value.strip():
                spec[field] = widget.value.strip()
        if self.duration.value.strip():
            spec["duration"] = self.duration.value.strip()
        image = image_from_text(self.image.value)
        if image:
            spec["image"] = image
        env = {}
        for line in self.env.value.splitlines():
            if line.strip():
                key, _, value = line.partition("=")
                env[key.strip()] = value
        if env:
            spec["env"] = env
        for row in self.mount_rows.children:
            field, item = row.entry()
            spec.setdefault(field, []).append(item)
        if self.fault_restart.value:
            spec["fault_restart"] = {"max_restarts": self.max_restarts.value}
        if self.checkpoint_resume.value:
            resume: dict[str, Any] = {
                "max_resumes": self.max_resumes.value,
                "grace_period": self.resume_grace.value,
            }
            if self.elastic_min_nodes.value:
                resume["elastic_min_nodes"] = self.elastic_min_nodes.value
                resume["allow_scale_up"] = self.allow_scale_up.value
            if self.perf_threshold.value:
                resume["perf_threshold"] = self.perf_threshold.value
                resume["perf_policy"] = self.perf_policy.value
            spec["checkpoint_resume"] = resume
        if self.algorithm_writable.value:
            spec["algorithm_read_only"] = False
        lifecycle = {
            k: w.value.strip()
            for k, w in (("on_start", self.on_start), ("on_stop", self.on_stop))
            if w.value.strip()
        }
        if lifecycle:
            spec["lifecycle"] = lifecycle
        return spec

    def validate(self) -> JobSpec | None:
        """Check the form with the wire model; show the problems inline; the spec when valid."""
        try:
            spec = check(self.spec_dict())
        except MaJupyterError as exc:
            items = "".join(f"<li>{escape(p.strip())}</li>" for p in exc.message.split(";") if p.strip())
            self.errors.value = f"<ul style='color:#b00020;margin:0'>{items}</ul>"
            self.submit_button.disabled = True
            return None
        self.errors.value = "<span style='color:#2e7d32'>ready to submit</span>"
        self.submit_button.disabled = False
        return spec

    def load(self, spec: JobSpec | dict) -> None:
        """Fill the form from a spec (e.g. a job to clone)."""
        spec = check(spec) if isinstance(spec, dict) else spec
        self._loading = True
        try:
            self.name.value = spec.name
            self.type.value = spec.type.value
            self.priority.value = spec.priority.value
            self.access.value = spec.access.value
            self.mode.value = spec.mode.value
            self.convention.value = spec.convention.value
            known = list(self.specs.options)
            self.specs.options = known + [s for s in spec.specs if s not in known]
            self.specs.value = tuple(spec.specs)
            self.nodes.value = spec.nodes
            self.ps.value = spec.ps
            self.chief.value = spec.chief
            self.command.value = spec.command or ""
            self.code.value = ""
            self.algorithm.value = spec.algorithm or ""
            self.outputs.value = spec.outputs or ""
            self.image.value = image_to_text(spec.image.model_dump(exclude_none=True))
            self.node_name.value = spec.node_name or ""
            self.driver_version.value = spec.driver_version or ""
            self.pool.value = spec.pool or ""
            self.env.value = "\n".join(f"{k}={v}" for k, v in spec.env.items())
            self.duration.value = f"{spec.duration:g}s" if spec.duration else ""
            self.workdir.value = spec.workdir or ""
            self.grace.value = spec.grace_period
            self.fault_restart.value = spec.fault_restart is not None
            if spec.fault_restart:
                self.max_restarts.value = spec.fault_restart.max_restarts
            self.checkpoint_resume.value = spec.checkpoint_resume is not None
            if spec.checkpoint_resume:
                resume = spec.checkpoint_resume
                self.max_resumes.value = resume.max_resumes
                self.resume_grace.value = resume.grace_period
                self.elastic_min_nodes.value = resume.elastic_min_nodes or 0
                self.allow_scale_up.value = resume.allow_scale_up
                self.perf_threshold.value = resume.perf_threshold or 0.0
                self.perf_policy.value = resume.perf_policy.value
            self.algorithm_writable.value = not spec.algorithm_read_only
            self.data_preparation.value = spec.data_preparation
            self.debug_terminal.value = spec.debug_terminal
            self.storage_env.value = spec.storage_env
            self.on_start.value = spec.lifecycle.on_start or ""
            self.on_stop.value = spec.lifecycle.on_stop or ""
            self.tasks.value = "\n".join(spectext.task_text(t.algorithm, t.command) for t in spec.tasks)
            self.mount_rows.children = ()
            for kind, items in (
                ("dataset", spec.datasets),
                ("model", spec.models),
                ("volume", spec.volumes),
                ("annotation", spec.annotations),
            ):
                for item in items:
                    self.mount_rows.children = (
                        *self.mount_rows.children,
                        MountRow(
                            self._changed,
                            self._remove_mount,
                            kind=kind,
                            name=item.name,
                            path=item.path,
                            source=getattr(getattr(item, "source", None), "value", None),
                            version=getattr(item, "version", None),
                            read_only=getattr(item, "read_only", kind != "volume"),
                        ),
                    )
        finally:
            self._loading = False
        self._refresh_visibility()
        self.validate()

    # ----------------------------------------------------------------------------- actions

    def _final_spec(self) -> dict | None:
        spec = self.validate()
        if spec is None:
            return None
        data = spec.model_dump(mode="json", exclude_none=True, exclude={"creator"})
        body = self.code.value
        if body.strip() and self.type.value == JobType.regular.value:
            from ..snapshot import snapshot_algorithm

            data["algorithm"] = str(snapshot_algorithm(spec.name, body, spec.algorithm))
        return data

    def dry_run(self) -> Any:
        """Show the per-node plan of the form's job (nothing is submitted)."""
        spec = self.validate()
        if spec is None:
            return None
        from ...render import plan_summary

        try:
            plan = self.client.plan(spec.model_dump(mode="json", exclude_none=True, exclude={"creator"}))
        except MaJupyterError as exc:
            self.result.value = f"<span style='color:#b00020'>{escape(exc.message)}</span>"
            return None
        self.result.value = f"<pre>{escape(plan_summary(plan))}</pre>"
        return plan

    def submit(self) -> Any:
        """Submit the form's job; the JobHandle, or None when the form is invalid or refused."""
        try:
            data = self._final_spec()
            if data is None:
                return None
            handle = self.client.submit(data)
        except MaJupyterError as exc:
            self.result.value = f"<span style='color:#b00020'>{escape(exc.message)}</span>"
            return None
        self.submitted.append(handle)
        from .. import record as notebook_record

        notebook_record.remember(handle.id, handle.name)
        self.result.value = f"submitted job <code>{escape(handle.id)}</code> ({escape(handle.name)})"
        for callback in self._callbacks:
            callback(handle)
        return handle
