"""The job service's REST API under ``/api/v1``: one FastAPI router per resource.

========================  ==================================================================
module                    routes
========================  ==================================================================
:mod:`.meta`              ``GET /health``, ``GET /openapi.json``
:mod:`.jobs`              ``POST /jobs``, ``POST /plan``, ``GET /jobs``, ``GET|PATCH|DELETE
                          /jobs/{id}``, ``GET /jobs/{id}/status``, ``POST /jobs/{id}/stop``,
                          ``GET /jobs/{id}/events``, ``GET /jobs/{id}/resources``
:mod:`.export`            ``POST /export``, ``GET /jobs/{id}/export``, ``GET /jobs/{id}/devenv``
:mod:`.algorithms`        ``GET /algorithms``, ``POST|DELETE /algorithms/favourites``
:mod:`.shell`             websocket ``/jobs/{id}/shell``
:mod:`.logs`              ``GET /jobs/{id}/logs``, ``GET /jobs/{id}/logs/read``
:mod:`.nodes`             ``GET /specs``, ``GET /nodes``, ``POST /nodes/{name}/drain|undrain``
:mod:`.cluster`           ``GET /cluster``
:mod:`.tensorboard`       ``POST|GET|DELETE /jobs/{id}/tensorboard``
:mod:`.caches`            ``GET|DELETE /cache``
:mod:`.data`              ``GET /data``, ``DELETE /data/{key}``
:mod:`.users`             ``GET /users/me``, ``GET|POST /users``, ``DELETE /users/{name}``,
                          ``POST /users/{name}/token``, ``GET|PUT /users/me/notify``
:mod:`.images`            ``GET|POST /images``, ``DELETE /images/{name}``
========================  ==================================================================

Every route is behind the token and takes what it uses from :class:`.deps.Services`;
:func:`ma_jupyter.service.app.create_app` builds that bundle and includes :data:`ROUTERS`.
"""

from __future__ import annotations

from fastapi import APIRouter

from . import (
    algorithms,
    caches,
    cluster,
    data,
    export,
    images,
    jobs,
    logs,
    meta,
    nodes,
    shell,
    tensorboard,
    users,
)

#: every router of the API, in the order the app includes them
ROUTERS: tuple[APIRouter, ...] = tuple(
    module.router
    for module in (
        meta,
        jobs,
        export,
        algorithms,
        shell,
        logs,
        nodes,
        cluster,
        tensorboard,
        caches,
        data,
        users,
        images,
    )
)
