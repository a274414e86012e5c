"""The notebook's shared client: one :class:`~ma_jupyter.client.Client` per ``$MA_JUPYTER_HOME``,
used by the magics and the widgets alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import statehome

if TYPE_CHECKING:
    from ...client import Client

_clients: dict[str, Client] = {}
#: the plain clients, by home (apart: ``_clients`` is the one a home's calls and tests reach)
_plain_clients: dict[str, Client] = {}


def get_client(*, plain: bool = False) -> Client:
    """The Client for the current ``$MA_JUPYTER_HOME`` (one per home, created on first use).

    ``plain``: the home's plain client instead (``Client(plain=True)``: answers read without
    pydantic, a spec validated by the service), what ``%%ma_train`` submits with so that a
    fresh kernel's first submit does not wait for pydantic and the models to load."""
    from ...client import Client  # requests is loaded on first use, not with the magics

    home = str(statehome.home())
    clients = _plain_clients if plain else _clients
    client = clients.get(home)
    if client is None:
        client = clients[home] = Client(plain=plain)
    return client
