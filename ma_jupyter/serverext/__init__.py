"""Jupyter server extension: the JupyterLab sidebar's authenticated way to the job service.

Enabled by ``etc/jupyter/jupyter_server_config.d/ma_jupyter.json`` (installed with the wheel),
it is one reverse proxy behind Jupyter's own authentication: ``<base_url>/ma-jupyter/api/v1/...``
is the job service's REST API (found, and started on first use, by
:class:`ma_jupyter.client.Client`), ``<base_url>/ma-jupyter/tensorboard/<job>/...`` a job's
TensorBoard.  See :mod:`ma_jupyter.serverext.handlers` for the routes.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "ma-jupyter"


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """Tell Jupyter Server which module holds the extension (this one)."""
    return [{"module": "ma_jupyter.serverext"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Register the handlers on a running Jupyter server.

    Args:
        serverapp: the ``jupyter_server.serverapp.ServerApp`` loading the extension.
    """
    from .handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info(
        "ma_jupyter server extension: the job service's API proxied under %s/api/v1", NAMESPACE
    )
