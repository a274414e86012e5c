"""What every router of the REST API is given: the bundle of services, the caller, the bounds.

Rules:

1. A router reaches the service's parts only through :class:`Services`, the one bundle
   :func:`Services.of` builds from the supervisor when the app is made: the job actions are the
   supervisor's public methods, the rest (store, scheduler, backend, node health, queue index,
   resource sampler, users, TensorBoards, favourites) are the bundle's own fields.  No router
   reaches through the supervisor's attributes.
2. Routes take the bundle with :data:`ServicesDep` and the caller with :data:`CallerDep`
   (``Authorization`` only: who calls comes from the token, see :mod:`..users`); routes open
   to every token name :data:`AUTH` in their ``dependencies``.
3. Every query and path parameter is bounded (the constants below): nothing unbounded reaches
   SQLite or a file read, so an out-of-range value is a 400 naming the parameter, never a 500.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Path, Request
from starlette.requests import HTTPConnection

from ...backends.base import Backend
from ...config import Limits
from ...errors import NotFound
from ...models import FORWARDED_USER_HEADER, JobStatus
from .. import access
from ..algorithms import Favourites
from ..health import NodeHealth
from ..images import Images
from ..queue import QueueIndex
from ..resources import ResourceSampler
from ..scheduler import Scheduler
from ..sessions import SessionCaps
from ..store import Store
from ..tensorboard import TensorBoardManager
from ..users import Caller, Directory

if TYPE_CHECKING:
    from ..supervisor import Supervisor

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: SQLite's INTEGER is 64-bit, and a listing offset past a billion jobs finds nothing anyway
MAX_OFFSET = 1_000_000_000
MAX_BYTE_OFFSET = 1 << 53
MAX_RANK = 65535
#: a job id, a node name (``worker-0``) or a user name in a path or a query
MAX_ID = 128
MAX_TEXT = 4096
MAX_STATUSES = len(JobStatus)
JobId = Path(max_length=MAX_ID, description="A job id as POST /jobs answered it.")


@dataclass(frozen=True)
class Services:
    """The parts of one job service its routes use (rule 1).

    Attributes:
        supervisor: the job actions (``submit``, ``update``, ``plan``, ``request_stop``,
            ``delete``, ``fail_job``, ``clear_cache``, ``queue_position``, ``estimated_start``,
            ``usage``, ``drain``, ``undrain``, ``prepared_data``, ``remove_prepared``).
        store: jobs, events, users.
        scheduler: the cluster's specs and nodes, placements.
        backend: where jobs run: their logs, code, caches, debug terminals.
        health: the nodes' health marks.
        queue: the supervisor's index of queued jobs.
        resources: the running jobs' resource samples.
        users: authentication and the admin's user management.
        tensorboards: the per-job TensorBoards (None: not available in this service).
        favourites: each user's favourite algorithm folders.
        images: the registered images (:mod:`..images`).
        urgent_lock: held while an urgent submit or priority raise counts the creator's urgent
            jobs and adds one, so two at once cannot both pass the cap (:func:`.access.check_urgent_quota`).
        sessions: the debug terminals and log followers open, capped per job and per user, and
            the thread pool that reaches into nodes (:mod:`..sessions`).
    """

    supervisor: Supervisor
    store: Store
    scheduler: Scheduler
    backend: Backend
    health: NodeHealth
    queue: QueueIndex
    resources: ResourceSampler
    users: Directory
    tensorboards: TensorBoardManager | None
    favourites: Favourites
    images: Images
    urgent_lock: threading.Lock = field(default_factory=threading.Lock, compare=False)
    sessions: SessionCaps = field(default_factory=lambda: SessionCaps(Limits), compare=False)

    @classmethod
    def of(
        cls, supervisor: Supervisor, users: Directory, tensorboards: TensorBoardManager | None = None
    ) -> Services:
        """The bundle of ``supervisor``'s service (the one place that reads its attributes)."""
        return cls(
            supervisor=supervisor,
            store=supervisor.store,
            scheduler=supervisor.scheduler,
            backend=supervisor.backend,
            health=supervisor.health,
            queue=supervisor.queue,
            resources=supervisor.resources,
            users=users,
            tensorboards=tensorboards,
            favourites=Favourites(supervisor.store),
            images=Images(supervisor.store),
            sessions=SessionCaps(lambda: supervisor.scheduler.cluster.limits),
        )

    def can_see(self, job_id: str, user: Caller) -> bool:
        """Whether ``user`` may see job ``job_id`` (False once it is gone)."""
        try:
            return access.can_see(self.store.get(job_id), user)
        except NotFound:
            return False


async def services(connection: HTTPConnection) -> Services:
    """The app's bundle (an HTTP request's or a websocket's); async: no thread hop for it."""
    return connection.app.state.services


ServicesDep = Annotated[Services, Depends(services)]


def authenticate(request: Request, bundle: ServicesDep) -> Caller:
    """The caller of ``request`` (rule 2); 401 without a valid token."""
    # Only the Authorization header: a token in the URL would land in logs and browser
    # history.  Who calls comes from the token alone (a header naming a user is ignored,
    # but the proxy's forwarded user with the proxy token: see users.Directory).
    return bundle.users.authenticate(
        request.headers.get("authorization", ""), request.headers.get(FORWARDED_USER_HEADER)
    )


CallerDep = Annotated[Caller, Depends(authenticate)]
#: the ``dependencies`` of a route any valid token may call
AUTH = [Depends(authenticate)]
