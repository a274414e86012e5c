"""Notebook widgets (ipywidgets 8): :class:`JobForm`, :class:`JobMonitor` and :func:`panel`."""

from __future__ import annotations

from .form import JobForm
from .monitor import JobMonitor
from .panel import JobsPanel, panel

__all__ = ["JobForm", "JobMonitor", "JobsPanel", "panel"]
