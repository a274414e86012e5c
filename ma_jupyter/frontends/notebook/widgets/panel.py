"""``panel()``: the job form, a live jobs table, and the monitor of the job you pick.

A background thread refreshes the table every second (only re-drawing when a job appeared,
disappeared or changed status); clicking a job's button opens its monitor below, and a job
submitted from the form opens its monitor at once.
"""

from __future__ import annotations

import threading
from html import escape
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from ....errors import MaJupyterError
from ...render import status_badge
from .form import JobForm
from .monitor import JobMonitor

if TYPE_CHECKING:
    from ....client import Client


TABLE_REFRESH = 1.0


class JobsPanel(W.VBox):
    """The form, the jobs table and a monitor slot (what :func:`panel` returns).

    Args:
        client: the Client (default: the notebook's shared one).
        limit: how many of the newest jobs the table shows.
    """

    def __init__(self, client: Client | None = None, *, limit: int = 20, start: bool = True):
        if client is None:
            from ..session import get_client

            client = get_client()
        self.client = client
        self.limit = limit
        self.form = JobForm(client=client, on_submit=self.open_job)
        self.table = W.VBox([])
        self.table.add_class("ma-panel-jobs")
        self.refresh_button = W.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.monitor_slot = W.VBox([])
        self.monitor_slot.add_class("ma-panel-monitor")
        self.monitor: JobMonitor | None = None
        self._signature: tuple = ()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        form_box = W.Accordion(children=[self.form], titles=("new job",), selected_index=0)
        super().__init__(
            [form_box, W.HBox([W.HTML("<b>Jobs</b>"), self.refresh_button]), self.table, self.monitor_slot]
        )
        self.add_class("ma-jobs-panel")
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="ma-panel", daemon=True)
        if start:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(TABLE_REFRESH):
            try:
                self.refresh()
            except Exception:  # the service may restart; the next round tries again
                pass

    def refresh(self) -> None:
        """Re-read the newest jobs and redraw the table if anything changed."""
        try:
            handles = self.client.jobs(limit=self.limit)
        except MaJupyterError as exc:
            self.table.children = [W.HTML(f"<span style='color:#b00020'>{escape(exc.message)}</span>")]
            return
        # the listing's summaries: a handle's whole job (info) would be one request per row
        jobs = [h.summary or h.info for h in handles]
        signature = tuple((j.id, j.status.value, j.queue_position) for j in jobs)
        with self._lock:
            if signature == self._signature:
                return
            self._signature = signature
            rows = []
            for job in jobs:
                button = W.Button(
                    description=job.spec.name, tooltip=f"open job {job.id}", layout=W.Layout(width="200px")
                )
                button.add_class("ma-panel-job")
                button.on_click(lambda _b, job_id=job.id: self.open_job(job_id))
                where = f" #{job.queue_position + 1}" if job.queue_position is not None else ""
                rows.append(
                    W.HBox(
                        [
                            button,
                            W.HTML(status_badge(job.status) + escape(where), layout=W.Layout(width="130px")),
                            W.HTML(f"<code>{escape(job.id)}</code>", layout=W.Layout(width="220px")),
                            W.HTML(escape(job.created_at.astimezone().strftime("%H:%M:%S"))),
                        ]
                    )
                )
            self.table.children = rows or [W.HTML("<i>no jobs yet</i>")]

    def open_job(self, job: Any) -> JobMonitor:
        """Show the monitor of ``job`` (a handle or an id) below the table."""
        if self.monitor is not None:
            self.monitor.close_monitor()
        self.monitor = JobMonitor(job, client=self.client, on_clone=self._clone_into_form)
        self.monitor_slot.children = [self.monitor]
        self.refresh()
        return self.monitor

    def _clone_into_form(self, form: JobForm) -> None:
        self.form.load(form.validate() or form.spec_dict())

    def close_panel(self) -> None:
        """Stop the background threads of the table and the monitor."""
        self._stop.set()
        if self.monitor is not None:
            self.monitor.close_monitor()

    def close(self) -> None:
        self.close_panel()
        super().close()


def panel(client: Client | None = None, *, limit: int = 20) -> JobsPanel:
    """The form plus a live jobs table; clicking a job opens its monitor."""
    return JobsPanel(client, limit=limit)
