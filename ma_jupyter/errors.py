"""Typed errors a user can cause, each mapped to one HTTP status.

Every error carries a message that says what to do.  The service turns them into a 4xx/5xx
JSON body ``{"error": <kind>, "message": ..., "field": ...}``; the client turns such a body back
into the same exception class, so a magic or the CLI can print one readable line.
"""

from __future__ import annotations

# The bottom room: this module imports nothing of the package, not even for type hints (a
# type-only import of the models would close the circle errors -> models -> commands -> errors).


class MaJupyterError(Exception):
    """Base class: ``kind`` names the error on the wire, ``status`` is its HTTP status."""

    kind = "error"
    status = 500

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def to_body(self) -> dict:
        """The JSON body the service returns for this error."""
        return {"error": self.kind, "message": self.message, "field": self.field}


class InvalidSpec(MaJupyterError):
    """The job description is wrong; the message names the field and the fix."""

    kind = "invalid_spec"
    status = 400


class Unauthorized(MaJupyterError):
    """No token, or a wrong one."""

    kind = "unauthorized"
    status = 401


class Forbidden(MaJupyterError):
    """The caller may not do this to that job (others' access rules)."""

    kind = "forbidden"
    status = 403


class NotFound(MaJupyterError):
    """No such job, spec, node or log stream."""

    kind = "not_found"
    status = 404


class Conflict(MaJupyterError):
    """The job's status does not allow the request (e.g. deleting a running job)."""

    kind = "conflict"
    status = 409


class BackendUnavailable(MaJupyterError):
    """The service or the chosen backend cannot be reached or cannot run jobs right now."""

    kind = "backend_unavailable"
    status = 503


class NodeLost(MaJupyterError):
    """The machine (e.g. the Ray node) that ran a job node is gone, and what is asked for (its
    log) went with it.  Never retried: unlike :class:`BackendUnavailable` it does not pass when
    the service comes back.  The message names the node and says why, e.g. "the logs of
    worker-1 are unavailable: the Ray node ray-3f2a1c0e that ran it left the cluster".
    """

    kind = "node_lost"
    status = 410


class RefusedFile(MaJupyterError):
    """A file a job could write is not what the service may read (a FIFO, a symlink, too big...).

    The message says what the job left where, e.g. "worker-0 left a FIFO at /job/logs/rank-0.log".
    """

    kind = "refused_file"
    status = 422


class PayloadTooLarge(MaJupyterError):
    """A request body is larger than the service accepts."""

    kind = "payload_too_large"
    status = 413


class FolderRefused(MaJupyterError):
    """A folder a job or a user wrote could not be walked within the walk's bounds
    (:mod:`ma_jupyter.foldersize`: more folders deep, more entries or more seconds than it
    allows).  The one error every folder walk raises and every caller handles: a measure,
    a digest or a copy of that folder is refused, never a thread ended or a 500.  The message
    names the folder, the bound and its value; ``bound`` which bound (``depth``, ``entries``,
    ``seconds``); ``counted`` what was counted before the refusal (a
    :class:`ma_jupyter.foldersize.FolderSize`, or None)."""

    kind = "folder_refused"
    status = 422
    bound: str | None = None
    counted: object = None


class LimitReached(MaJupyterError):
    """The caller already holds as much of something as one user may (queued jobs, running
    TensorBoards, debug terminals, dev environments, log followers); the message names the
    ``[limits]`` setting, its value and what frees room."""

    kind = "limit_reached"
    status = 429


class DiskFull(MaJupyterError):
    """A disk the service or a job writes to is full; the message names the folder."""

    kind = "disk_full"
    status = 507


class JobFailed(MaJupyterError):
    """A followed job ended in error (or expired).

    The message is what the user reads under the job's output: the status, the reason and the
    log's last line (the follower showed the log already, so it is not repeated); ``log_tail``
    keeps the last lines for whoever inspects them (a hint on a ``NameError``); ``job`` is the
    ended :class:`~ma_jupyter.models.Job` (typed ``object`` here: see the imports above).
    """

    kind = "job_failed"
    status = 500

    def __init__(self, message: str, *, job: object | None = None, log_tail: str = ""):
        super().__init__(message)
        self.job = job
        self.log_tail = log_tail


ERRORS_BY_KIND: dict[str, type[MaJupyterError]] = {
    cls.kind: cls
    for cls in (
        MaJupyterError,
        InvalidSpec,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        BackendUnavailable,
        NodeLost,
        RefusedFile,
        PayloadTooLarge,
        FolderRefused,
        LimitReached,
        DiskFull,
        JobFailed,
    )
}


def error_from_body(status: int, body: dict | None) -> MaJupyterError:
    """Rebuild the typed error from a service response body (used by the client)."""
    body = body or {}
    cls = ERRORS_BY_KIND.get(str(body.get("error")), MaJupyterError)
    message = body.get("message") or f"the job service answered HTTP {status}"
    return cls(message, field=body.get("field"))


# ------------------------------------------------------------------ control flow of the front ends
# Not wire errors: they end a command line or a magic early.


class OptionsExit(Exception):
    """argparse wanted to exit (``--help`` was printed): ``status`` is the exit status it asked for.

    Raised instead of :class:`SystemExit` so a magic can return quietly after the help text; the
    CLI turns it into its exit code.
    """

    def __init__(self, status: int = 0, message: str | None = None):
        super().__init__(message or f"exit {status}")
        self.status = status
        self.message = message


class HelpShown(Exception):
    """A magic's ``--help`` was printed: the magic has nothing else to do."""


# ------------------------------------------------------------------ errors inside the package
# Not wire errors either: each is raised and handled between rooms (or inside one) and never
# reaches a user as its own kind.  They live here so that every error type has one owner; the
# module that raises them re-exports the name where callers import it from there.  The one
# exception: ``nodeside/`` runs inside a node as plain scripts (``python -I -S workdir.py``),
# which cannot import this package, so its own errors (``workdir.OverLimit``) stay there.


class NodeGone(BackendUnavailable):
    """The Ray node (or its agent) of a job node is gone (:mod:`ma_jupyter.backends.ray`)."""


class ServerUnavailable(OSError):
    """No runner was forked and none will be: the runners' fork server cannot be started or
    reached, or said it cannot fork this one (the caller starts the runner the slow way;
    :mod:`ma_jupyter.nodehost.forkserver`)."""


class Cancelled(Exception):
    """A dataset's copy was cancelled (its job stopped); nothing of it is left
    (:mod:`ma_jupyter.nodehost.datacopy`)."""


class StorageError(Exception):
    """An object storage transfer failed; the message names the URI and the reason (shown to
    the user; :mod:`ma_jupyter.objectstore`)."""


class AddressRefused(Exception):
    """An address the service sends no object-storage request to: loopback, link-local,
    private, reserved or multicast (the message names the name and the address)."""


class WebhookRefused(ValueError):
    """A webhook's destination that the webhooks' rule 1 refuses (the message says why and what
    to do; :mod:`ma_jupyter.service.webhooks`, where it is also named ``Refused``)."""


class TransportError(Exception):
    """No answer came from the service (:mod:`ma_jupyter.client.transport`)."""


class ConnectionDropped(Exception):
    """The client transport's signal that a kept-alive connection ended before any byte of the
    answer (``client/transport.py`` rule 2: the request is sent once more on a new connection);
    never seen outside the transport."""


class Unreachable(TransportError):
    """The service could not be reached, or dropped the connection before its whole answer."""


class ReadTimedOut(TransportError):
    """The service took longer than the request's timeout to answer."""


class ContentUnknown(Exception):
    """An algorithm folder's content cannot be told whole (:mod:`ma_jupyter.algorithm_content`,
    its rule 4)."""


class ReadBudgetSpent(Exception):
    """Telling an algorithm folder's content would read more than the read limit
    (:mod:`ma_jupyter.algorithm_content`, its rule 6)."""


class StoreTooNew(MaJupyterError):
    """The service's database was written by a newer ma_jupyter (its schema version is above
    the one this code knows: :mod:`ma_jupyter.service.store_schema`); nothing of it is changed.
    The message names the file, both versions and what to do."""

    kind = "store_too_new"
    status = 503
