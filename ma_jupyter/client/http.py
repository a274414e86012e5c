"""The HTTP client of the job service: the one way the front ends reach jobs.

:class:`Client` finds the service of ``$MA_JUPYTER_HOME`` through its runtime file
(``service.json``: url, the owner's token, pid), or at ``$MA_JUPYTER_URL``.  It acts as the user
of its token: ``Client(token=...)``, else ``$MA_JUPYTER_TOKEN``, else the service owner's token
from the runtime file (which only the owner's account can read).  If no service answers there, it starts one
(``python -m ma_jupyter.service``, detached in its own session so it outlives the kernel) under an
``fcntl`` lock, so two kernels starting at the same moment end up with one service.  Error
responses come back as the typed errors of :mod:`ma_jupyter.errors`, the same ones local
validation raises.

:class:`JobHandle` is what ``submit`` returns: a job by id, with ``status``, ``wait``, ``logs``
(optionally following the log with the service's long-poll, line by line, nothing lost or
repeated), ``events``, ``stop`` and ``delete``.

The client is composed of rooms of one concern each: the session with the service (finding
and starting it, the token, one connection per thread, timeouts, retries, error answers as
typed errors: ``client/session.py``, over the socket HTTP of ``client/transport.py``), and one
resource group per module, each a mixin over that session: jobs, their logs and TensorBoards
(``client/jobs.py``), exports, debug terminals and dev environments (``client/devtools.py``),
the catalog, nodes and the cluster view (``client/cluster.py``), users, notifications,
algorithms, caches, prepared data and images (``client/account.py``); the job handle is
``client/handle.py``.
"""

from __future__ import annotations

from .account import KEEP, AccountCalls
from .cluster import ClusterCalls
from .devtools import DevToolCalls
from .handle import JobHandle
from .jobs import JobCalls
from .session import ENV_TOKEN, ENV_URL, IDEMPOTENCY_HEADER, RETRY_FOR

__all__ = ["ENV_TOKEN", "ENV_URL", "IDEMPOTENCY_HEADER", "KEEP", "RETRY_FOR", "Client", "JobHandle"]


class Client(JobCalls, DevToolCalls, ClusterCalls, AccountCalls):
    """A connection to the job service of ``$MA_JUPYTER_HOME``.

    Args:
        url: the service's base URL (``http://127.0.0.1:PORT``); default ``$MA_JUPYTER_URL``,
            else from the runtime file.
        token: the token of the user this client acts as; default ``$MA_JUPYTER_TOKEN``, else
            the service owner's from the runtime file.  The service knows the user by it alone.
        autostart: start the service when none answers (only without an explicit ``url``).
        timeout: seconds for one ordinary request (a long-poll adds its wait to it).
        local_logs: read log bytes straight from the job's files where the service says they
            are on this machine (see :class:`LogLines`); the service still decides what may be
            read and when a log ends.
        retry_for: seconds a request is retried while the service is unreachable or drops the
            connection (a restart): every request of this client is safe to repeat (submits
            carry an idempotency key), so a retry never runs anything twice.
        service_args: options given to a service this client starts (``--backend ray
            --ray-address HOST:PORT``); without them it follows ``cluster.toml``.
        plain: answer jobs, pages, log chunks, events, users, specs, nodes, resource samples
            and the cluster view as read-only views of the service's
            JSON (:class:`~ma_jupyter.client.plain.Plain`: the models' field names, read
            without pydantic) and leave a submitted spec's validation to the service, whose
            refusal is the same :class:`~ma_jupyter.errors.InvalidSpec`; and its first call
            goes to the service of the runtime file (or ``url``) without asking ``/health``
            first: only when nothing answers there is the service looked for (and started) as
            :meth:`connect` does, before the call is sent again.  What a command line uses, to
            start fast.  Default: validated pydantic models, the service probed first.

    Nothing is contacted until the first call (or :meth:`connect`).
    """
