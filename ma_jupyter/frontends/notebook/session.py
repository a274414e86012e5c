"""The notebook's shared client: one :class:`~ma_jupyter.client.Client` per ``$MA_JUPYTER_HOME``,
used by the magics and the widgets alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import statehome

if TYPE_CHECKING:
    from ...client import Client

_clients: dict[str, Client] = {}


def get_client() -> Client:
    """The Client for the current ``$MA_JUPYTER_HOME`` (one per home, created on first use)."""
    from ...client import Client  # requests is loaded on first use, not with the magics

    home = str(statehome.home())
    client = _clients.get(home)
    if client is None:
        client = _clients[home] = Client()
    return client
