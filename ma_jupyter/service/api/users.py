"""Users (:mod:`..users`): ``GET /users/me``, and for admins ``GET|POST /users``, ``DELETE
/users/{name}``, ``POST /users/{name}/token`` (a new token, shown once); ``GET|PUT
/users/me/notify``: the caller's own webhook (:mod:`..webhooks`)."""

from __future__ import annotations

from fastapi import APIRouter, Path
from fastapi.responses import Response

from ... import config
from ...errors import InvalidSpec
from ...models import API_PREFIX, NewUser, NotifySettings, User, UserToken
from ..webhooks import check_url
from .deps import MAX_ID, CallerDep, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/users/me", response_model=User)
def whoami(services: ServicesDep, user: CallerDep) -> User:
    return services.store.user(user.name)


@router.get("/users/me/notify", response_model=NotifySettings)
def my_notify(services: ServicesDep, user: CallerDep) -> NotifySettings:
    store = services.store
    return NotifySettings(webhook=store.notify_webhook(user.name), address=store.notify_address(user.name))


@router.put("/users/me/notify", response_model=NotifySettings)
def set_my_notify(services: ServicesDep, user: CallerDep, body: NotifySettings) -> NotifySettings:
    """Change the fields the body names (null forgets one); the others stay."""
    given = body.model_fields_set
    address = (body.address or "").strip() or None
    if address and address.startswith("-"):  # checked first: a refused PUT changes nothing
        # the admin's command may pass it to a mailer as an argument, which reads it as an option
        raise InvalidSpec(
            f"address {address[:40]!r} starts with '-', which a mailer given it as an argument "
            "reads as an option: name a mail address or a handle",
            field="address",
        )
    if "webhook" in given:
        url = check_url(body.webhook, config.load_webhook_allow()) if body.webhook else None
        services.store.set_notify_webhook(user.name, url)
    if "address" in given:
        services.store.set_notify_address(user.name, address)
    return my_notify(services, user)


@router.get("/users", response_model=list[User])
def list_users(services: ServicesDep, user: CallerDep) -> list[User]:
    return services.users.list(user)


@router.post("/users", status_code=201, response_model=UserToken)
def add_user(services: ServicesDep, user: CallerDep, body: NewUser) -> UserToken:
    return services.users.add(user, body.name, body.admin)


@router.post("/users/{name}/token", response_model=UserToken)
def new_token(services: ServicesDep, user: CallerDep, name: str = Path(max_length=MAX_ID)) -> UserToken:
    return services.users.new_token(user, name)


@router.delete("/users/{name}", status_code=204)
def remove_user(services: ServicesDep, user: CallerDep, name: str = Path(max_length=MAX_ID)) -> Response:
    services.users.remove(user, name)
    return Response(status_code=204)
