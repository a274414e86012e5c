"""``JobActions``: the monitor's controls that change a job: its priority and its duration.

The seed's 操作 menu lets a user raise a queued job's priority and change a queued or running
job's duration.  Both go through :meth:`ma_jupyter.client.Client.update` (the service's
``PATCH /jobs/{id}``), so the access rules, the urgent cap and the events naming who changed
what are the service's, as for ``ma-jupyter update`` and ``%ma_update``.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING

import ipywidgets as W

from ....errors import MaJupyterError
from ....models import Job, JobStatus, Priority

if TYPE_CHECKING:
    from ....client import Client


class JobActions(W.HBox):
    """A priority menu and a duration box, each with its own button.

    Args:
        client: the Client the change goes through.
        job: the job as last seen (its id, status and current values).
        on_change: called with the job the service returned after a change.
        on_message: called with a sentence (HTML) saying what happened, or why not.
    """

    def __init__(
        self,
        client: Client,
        job: Job,
        *,
        on_change: Callable[[Job], None] | None = None,
        on_message: Callable[[str], None] | None = None,
    ):
        self.client = client
        self.job = job
        self._on_change = on_change
        self._on_message = on_message
        self.priority = W.Dropdown(
            options=[p.value for p in Priority],
            value=job.spec.priority.value,
            description="priority",
            layout=W.Layout(width="200px"),
        )
        self.priority_button = W.Button(description="Set priority", icon="sort-amount-asc")
        self.priority_button.add_class("ma-monitor-set-priority")
        self.duration = W.Text(
            value="", placeholder="e.g. 2h, 30m, 3600", description="duration", layout=W.Layout(width="220px")
        )
        self.duration_button = W.Button(description="Set duration", icon="clock-o")
        self.duration_button.add_class("ma-monitor-set-duration")
        self.priority_button.on_click(lambda _b: self.set_priority(self.priority.value))
        self.duration_button.on_click(lambda _b: self.set_duration(self.duration.value))
        super().__init__([self.priority, self.priority_button, self.duration, self.duration_button])
        self.add_class("ma-monitor-actions")
        self.show(job)

    def show(self, job: Job) -> None:
        """Enable what the job's status allows: a priority while queued, a duration until it ends."""
        self.job = job
        self.priority_button.disabled = job.status is not JobStatus.queued
        self.duration_button.disabled = job.status.is_terminal()

    def set_priority(self, priority: str) -> Job | None:
        """Change the queued job's priority; the job as the service answered, or None (said why)."""
        return self._update(priority=priority)

    def set_duration(self, duration: str | float) -> Job | None:
        """Change the job's duration (seconds or ``2h``); the job, or None (said why)."""
        if isinstance(duration, str) and not duration.strip():
            self._say("<span style='color:#b00020'>give a duration, e.g. 2h, 30m or 3600</span>")
            return None
        return self._update(duration=duration)

    def _update(self, **change: str | float) -> Job | None:
        try:
            job = self.client.update(self.job.id, **change)
        except MaJupyterError as exc:
            self._say(f"<span style='color:#b00020'>{escape(exc.message)}</span>")
            return None
        what = ", ".join(
            f"priority {job.spec.priority.value}"
            if key == "priority"
            else f"duration {job.spec.duration:g} s"
            for key in change
        )
        self._say(escape(f"{what} set"))
        self.show(job)
        if self._on_change:
            self._on_change(job)
        return job

    def _say(self, html: str) -> None:
        if self._on_message:
            self._on_message(html)
