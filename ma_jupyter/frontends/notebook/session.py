"""The notebook's shared client: one :class:`~ma_jupyter.client.Client` per ``$MA_JUPYTER_HOME``,
used by the magics and the widgets alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import statehome

if TYPE_CHECKING:
    from ...client import Client

_clients: dict[tuple[str, bool], Client] = {}


def get_client(*, plain: bool = False) -> Client:
    """The Client for the current ``$MA_JUPYTER_HOME`` (one per home, created on first use).

    ``plain``: the home's plain client instead (``Client(plain=True)``: answers read without
    pydantic, a spec validated by the service), what ``%%ma_train`` submits with so that a
    fresh kernel's first submit does not wait for pydantic and the models to load."""
    from ...client import Client  # requests is loaded on first use, not with the magics

    key = (str(statehome.home()), plain)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = Client(plain=plain)
    return client
