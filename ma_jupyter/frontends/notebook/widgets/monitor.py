"""``JobMonitor``: one job live in widgets — status, logs (a multi-node job's "all nodes" tab
first, then per node and per rank), events, actions.

A background thread does all the work (refreshing the job, long-polling every log stream,
reading new events) and only sets widget values, so the notebook stays usable while logs
stream.  Buttons stop the job, open a pre-filled form to clone it, and show its TensorBoard
(an IFrame on the per-job TensorBoard, or its scalars drawn as a PNG); :class:`.JobActions`
changes its priority and duration.  A line still being written (a progress bar redrawn with
``\r``) shows under its tab's lines as it stands, replaced until its newline comes.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from ....client.logs import LogStreams, several_nodes, stream_label
from ....errors import MaJupyterError
from ....models import Job, clone_name
from ...render import events_html, status_badge, status_line
from .. import live
from .actions import JobActions

if TYPE_CHECKING:
    from ....client import Client, JobHandle
    from .form import JobForm


REFRESH = 0.5  # seconds between job refreshes
#: the "all nodes" tab of a multi-node job: every node's lines in arrival order, "[node] "-prefixed
ALL_NODES: live.StreamKey = ("", None)
LOG_RENDER = 0.1  # seconds between log widget updates per stream


class JobMonitor(W.VBox):
    """Live view of one job.

    Args:
        job: a JobHandle, a Job or a job id.
        client: the Client (default: the notebook's shared one).
        max_lines: newest lines kept per log tab.
        on_clone: called with a :class:`~ma_jupyter.frontends.notebook.widgets.JobForm` pre-filled from this job
            when Clone is pressed (default: the form opens inside the monitor).
        start: start the background thread now.
    """

    def __init__(
        self,
        job: str | Job | JobHandle,
        client: Client | None = None,
        *,
        max_lines: int = live.DEFAULT_MAX_LINES,
        on_clone: Callable[[JobForm], None] | None = None,
        start: bool = True,
    ):
        if client is None:
            from ..session import get_client

            client = get_client()
        self.client = client
        job_id = job if isinstance(job, str) else job.id
        self.job_id = job_id
        self.job: Job = client.job(job_id).info
        self.max_lines = max_lines
        self._on_clone = on_clone
        self._buffers: dict[live.StreamKey, live.LogBuffer] = {}
        self._log_widgets: dict[live.StreamKey, W.HTML] = {}
        self._dirty: set[live.StreamKey] = set()
        #: each stream's line still being written (a progress bar), as it stands: under its lines
        self._partials: dict[live.StreamKey, str] = {}
        self._events: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.follower = LogStreams(client, job_id)

        self.badge = W.HTML(status_badge(self.job.status))
        self.badge.add_class("ma-monitor-badge")
        self.title = W.HTML(f"<b>{escape(self.job.spec.name)}</b> <code>{escape(job_id)}</code>")
        self.info = W.HTML(escape(status_line(self.job)))
        self.info.add_class("ma-monitor-info")
        self.tabs = W.Tab(children=[])
        self.tabs.add_class("ma-monitor-logs")
        self.events = W.HTML("")
        self.events.add_class("ma-monitor-events")
        self.message = W.HTML("")
        self.message.add_class("ma-monitor-message")
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="danger")
        self.stop_button.add_class("ma-monitor-stop")
        self.clone_button = W.Button(description="Clone", icon="copy")
        self.clone_button.add_class("ma-monitor-clone")
        self.tb_button = W.Button(description="TensorBoard", icon="line-chart")
        self.tb_button.add_class("ma-monitor-tensorboard")
        self.plot_button = W.Button(description="Plot scalars", icon="image")
        self.extra = W.VBox([])
        self.actions = JobActions(client, self.job, on_change=self._apply_job, on_message=self._show_message)
        self.stop_button.on_click(lambda _b: self.stop())
        self.clone_button.on_click(lambda _b: self.clone())
        self.tb_button.on_click(lambda _b: self.open_tensorboard())
        self.plot_button.on_click(lambda _b: self.plot_scalars())
        events_box = W.Accordion(children=[self.events], titles=("events",), selected_index=None)
        super().__init__(
            [
                W.HBox([self.badge, self.title]),
                self.info,
                W.HBox([self.stop_button, self.clone_button, self.tb_button, self.plot_button]),
                self.actions,
                self.message,
                self.tabs,
                events_box,
                self.extra,
            ]
        )
        self.add_class("ma-job-monitor")
        self._apply_job(self.job)
        if start:
            self.start()

    # ----------------------------------------------------------------------------- thread

    def start(self) -> None:
        """Start following the job in a background thread (idempotent)."""
        if self._thread and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"ma-monitor-{self.job_id}", daemon=True)
        self._thread.start()

    def close_monitor(self) -> None:
        """Stop the background thread (the widgets stay as they are)."""
        self._stop.set()
        self.follower.stop()

    def close(self) -> None:
        self.close_monitor()
        super().close()

    @property
    def following(self) -> bool:
        return bool(self._thread and self._thread.is_alive())

    def _run(self) -> None:
        last_refresh = 0.0
        last_render = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now - last_refresh >= REFRESH:
                    last_refresh = now
                    self.job = self.client.job(self.job_id).info
                    for stream in self.client.log_streams(self.job_id):
                        self.follower.follow((stream.node, stream.rank))
                    for node in self.job.nodes:
                        self.follower.follow((node.name, None))
                    self._read_events()
                    self._apply_job(self.job)
            except MaJupyterError as exc:
                self.message.value = f"<span style='color:#b00020'>{escape(exc.message)}</span>"
            except Exception as exc:  # the service may be restarting: say so, keep going
                self.message.value = f"<span style='color:#b00020'>{escape(str(exc))}</span>"
            self._add(self.follower.drain(timeout=0.05))
            self._add_partials(self.follower.take_partials())
            if self._dirty and time.monotonic() - last_render >= LOG_RENDER:
                self._render_logs()
                last_render = time.monotonic()
            if self.job.status.is_terminal() and (self.follower.finished() or not self.follower.streams):
                try:
                    # streams that appeared at the very end are followed before finishing
                    added = [
                        self.follower.follow((s.node, s.rank)) for s in self.client.log_streams(self.job_id)
                    ]
                    if any(added):
                        continue
                    self._read_events()
                except Exception:
                    pass
                self._add(self.follower.drain())
                self._add_partials(self.follower.take_partials())
                self._render_logs()
                self._apply_job(self.job)
                break
        self.follower.stop()

    # ----------------------------------------------------------------------------- rendering

    def _add(self, items: list[tuple[live.StreamKey, str]]) -> None:
        """Each line to its stream's tab; a node's own lines also to the "all nodes" tab (the
        first one) when the job has several nodes."""
        several = several_nodes(self.job)
        for key, line in items:
            self._buffer(key).extend([(key, line)])
            self._dirty.add(key)
            if several and key[1] is None:
                self._buffer(ALL_NODES).extend([(key, line)])
                self._dirty.add(ALL_NODES)

    def _add_partials(self, changed: dict[live.StreamKey, str]) -> None:
        """Each stream's unfinished line (:meth:`LogStreams.take_partials`), shown under its
        lines and replaced as it changes; "" once its newline came (it is a line then)."""
        several = several_nodes(self.job)
        for key, text in changed.items():
            if text:
                self._partials[key] = text
            else:
                self._partials.pop(key, None)
            self._buffer(key)
            self._dirty.add(key)
            if several and key[1] is None:
                self._buffer(ALL_NODES)
                self._dirty.add(ALL_NODES)

    def _partial_lines(self, key: live.StreamKey) -> list[str]:
        if key == ALL_NODES:
            return [
                f"[{stream_label(k)}] {live.shown_line(text)}"
                for k, text in self._partials.items()
                if k[1] is None
            ]
        text = self._partials.get(key)
        return [live.shown_line(text)] if text else []

    def _buffer(self, key: live.StreamKey) -> live.LogBuffer:
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = live.LogBuffer(self.max_lines)
            html = W.HTML("<pre class='ma-log-text'></pre>")
            html.add_class("ma-monitor-log")
            self._log_widgets[key] = html
            keys = sorted(self._log_widgets, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
            self.tabs.children = [self._log_widgets[k] for k in keys]
            self.tabs.titles = tuple("all nodes" if k == ALL_NODES else stream_label(k) for k in keys)
        return buf

    def _render_logs(self) -> None:
        for key in list(self._dirty):
            buf = self._buffers[key]
            skipped = f"… {buf.skipped} earlier lines not shown\n" if buf.skipped else ""
            lines = buf.text_lines(several=True) if key == ALL_NODES else [line for _k, line in buf.lines]
            text = skipped + "\n".join(lines + self._partial_lines(key))
            self._log_widgets[key].value = (
                "<pre class='ma-log-text' style='max-height:360px;overflow:auto;margin:0'>"
                f"{escape(text)}</pre>"
            )
            self._dirty.discard(key)

    def _apply_job(self, job: Job) -> None:
        self.badge.value = status_badge(job.status)
        self.info.value = escape(status_line(job))
        self.stop_button.disabled = job.status.is_terminal()
        self.actions.show(job)
        if job.status.is_terminal() and self.message.value.startswith("stop requested"):
            self.message.value = ""

    def _read_events(self) -> None:
        after = self._events[-1].seq if self._events else 0
        new = self.client.events(self.job_id, after=after)
        if not new:
            return
        self._events.extend(new)
        self.events.value = events_html(self._events)

    def log_text(self, node: str = "worker-0", rank: int | None = None) -> str:
        """The lines a log tab shows now (for scripts and tests); ``node=""``: the "all nodes"
        tab of a multi-node job."""
        buf = self._buffers.get((node, rank))
        if buf is None:
            return ""
        partial = self._partial_lines((node, rank))
        if (node, rank) == ALL_NODES:
            return "\n".join(buf.text_lines(several=True) + partial)
        return "\n".join([line for _k, line in buf.lines] + partial)

    # ----------------------------------------------------------------------------- actions

    def _show_message(self, html: str) -> None:
        self.message.value = html

    def stop(self) -> None:
        """Ask the service to stop the job."""
        try:
            job = self.client.stop(self.job_id)
        except MaJupyterError as exc:
            self.message.value = f"<span style='color:#b00020'>{escape(exc.message)}</span>"
            return
        self.message.value = f"stop requested ({job.status.value})"
        self._apply_job(job)

    def clone(self) -> Any:
        """A JobForm pre-filled from this job (shown below, or handed to ``on_clone``)."""
        from .form import JobForm

        spec = self.job.spec.model_copy(update={"name": clone_name(self.job.spec.name)})
        form = JobForm(client=self.client, spec=spec)
        if self._on_clone:
            self._on_clone(form)
        else:
            self.extra.children = [form]
        return form

    def open_tensorboard(self, height: int = 600) -> str | None:
        """Start the job's TensorBoard and show it in an IFrame below; its URL."""
        try:
            url = self.client.tensorboard(self.job_id)
        except MaJupyterError as exc:
            self.message.value = f"<span style='color:#b00020'>{escape(exc.message)}</span>"
            return None
        frame = W.HTML(
            f"<a href='{escape(url)}' target='_blank'>{escape(url)}</a>"
            f"<iframe src='{escape(url)}' style='width:100%;height:{height}px;border:0'></iframe>"
        )
        frame.add_class("ma-monitor-tensorboard-frame")
        self.extra.children = [frame]
        return url

    def plot_scalars(self) -> bytes | None:
        """Draw the job's TensorBoard scalars below as a PNG; the PNG bytes."""
        from ..scalars import scalars_png

        outputs = self.job.outputs_folder or self.job.spec.outputs
        if not outputs:
            self.message.value = "this job has no outputs folder: nothing to plot"
            return None
        try:
            png = scalars_png(outputs, title=self.job.spec.name)
        except MaJupyterError as exc:
            self.message.value = f"<span style='color:#b00020'>{escape(exc.message)}</span>"
            return None
        image = W.HTML(f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}'/>")
        self.extra.children = [image]
        return png
