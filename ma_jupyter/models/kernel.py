"""How a running dev environment's kernel is reached: its kernel folder, or the relay on
the machine that runs it."""

from __future__ import annotations

from pydantic import Field

from .common import Strict


class KernelRelay(Strict):
    """The relay of a dev environment's kernel on the machine that runs it (Ray): a TCP listener
    there that carries one kernel socket's bytes per connection, once the connection proves
    ``secret`` (``ma_jupyter.kernel_access`` spells the wire)."""

    host: str = Field(description="The address of the machine (Ray node) that runs the dev environment.")
    port: int = Field(ge=1, le=65535)
    secret: str = Field(description="The relay's own secret: in no file, and never seen by the job.")


class KernelRoute(Strict):
    """How a running dev environment's kernel is reached (``POST /jobs/{id}/kernel``, its owner
    or an admin): through its kernel folder on the service's machine (``folder``), or through
    the relay on the machine that runs it (``relay``); exactly one is set."""

    node: str
    folder: str | None = Field(
        default=None, description="The node's kernel folder on the service's machine (local backend)."
    )
    relay: KernelRelay | None = None
