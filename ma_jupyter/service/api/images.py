"""Registered images (:mod:`..images`): ``GET /images`` (those the caller may use), ``POST
/images`` (register one; public ones by admins only), ``DELETE /images/{name}`` (its owner or
an admin)."""

from __future__ import annotations

from fastapi import APIRouter, Path
from fastapi.responses import Response

from ...models import API_PREFIX, NAME_PATTERN, RegisteredImage
from .deps import CallerDep, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/images", response_model=list[RegisteredImage])
def list_images(services: ServicesDep, user: CallerDep) -> list[RegisteredImage]:
    return services.images.visible(user)


@router.post("/images", status_code=201, response_model=RegisteredImage)
def register_image(services: ServicesDep, user: CallerDep, body: RegisteredImage) -> RegisteredImage:
    return services.images.register(user, body)


@router.delete("/images/{name}", status_code=204)
def remove_image(services: ServicesDep, user: CallerDep, name: str = Path(pattern=NAME_PATTERN)) -> Response:
    services.images.remove(user, name)
    return Response(status_code=204)
