"""The client's calls on what a user holds: who they are, their notifications, users and
tokens (admins), their algorithm folders and favourites, their cache, prepared data and
registered images.

A mixin of :class:`~ma_jupyter.client.Client` over its :class:`~.session.ServiceSession`;
every method is documented as ``Client``'s.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from .session import ServiceSession, segment
from .spec import host_path

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any

    from ..models import (
        Algorithm,
        CacheInfo,
        NotifySettings,
        PreparedData,
        RegisteredImage,
        User,
        UserToken,
    )

#: a field :meth:`Client.set_notify` leaves as it is
KEEP = object()


class AccountCalls(ServiceSession):
    """Users, notifications, algorithms, caches, prepared data and images (``/users``,
    ``/algorithms``, ``/cache``, ``/data``, ``/images``)."""

    # -------------------------------------------------------------------------- users

    def whoami(self) -> User:
        """The user this client acts as (its token's)."""
        return self._answer("User", self._request("GET", "/users/me"))

    def notify_settings(self) -> NotifySettings:
        """Where your own jobs' alerts and terminal states go (``GET /users/me/notify``)."""
        return self._answer("NotifySettings", self._request("GET", "/users/me/notify"))

    def set_notify(
        self, webhook: str | None | object = KEEP, *, address: str | None | object = KEEP
    ) -> NotifySettings:
        """Send your jobs' alerts and terminal states to ``webhook`` (an http(s) URL getting
        each event as a JSON POST), and name ``address`` (a mail address, a chat handle: it is
        in each event the administrator's ``[notify]`` command gets, which delivers it there);
        None forgets one, :data:`KEEP` (the default) leaves it as it is (``PUT /users/me/notify``)."""
        body = {k: v for k, v in (("webhook", webhook), ("address", address)) if v is not KEEP}
        return self._answer("NotifySettings", self._request("PUT", "/users/me/notify", json_body=body))

    def users(self) -> list[User]:
        """Every user of the service (admins only; tokens are never shown).

        Raises:
            Forbidden: this client's user is no admin.
        """
        return [self._answer("User", u) for u in self._request("GET", "/users")]

    def add_user(self, name: str, admin: bool = False) -> UserToken:
        """Add a user; the answer carries its token, shown this once (admins only).

        Raises:
            Forbidden: this client's user is no admin.
            Conflict: the user exists.
            InvalidSpec: the name is not a user name.
        """
        body = {"name": name, "admin": admin}
        return self._answer("UserToken", self._request("POST", "/users", json_body=body, retry_for=0))

    def new_token(self, name: str) -> UserToken:
        """Give a user a new token (its old one stops working); shown this once (admins only)."""
        data = self._request("POST", f"/users/{segment(name)}/token", retry_for=0)
        return self._answer("UserToken", data)

    def remove_user(self, name: str) -> None:
        """Remove a user: its token stops working at once; its jobs stay (admins only)."""
        self._request("DELETE", f"/users/{segment(name)}")

    # -------------------------------------------------------------------- algorithms

    def algorithms(self) -> list[Algorithm]:
        """This user's algorithm folders: their favourites first, then the folders their own
        jobs ran, each with how many of their jobs used it."""
        return [self._answer("Algorithm", a) for a in self._request("GET", "/algorithms")]

    def favourite(self, path: str) -> Algorithm:
        """Mark an algorithm folder (relative to the current directory) a favourite of this user."""
        body = {"path": host_path(path, Path.cwd())}
        return self._answer("Algorithm", self._request("POST", "/algorithms/favourites", json_body=body))

    def unfavourite(self, path: str) -> None:
        """Unmark a favourite algorithm folder.

        Raises:
            NotFound: it was not a favourite.
        """
        self._request("DELETE", "/algorithms/favourites", params={"path": host_path(path, Path.cwd())})

    # ------------------------------------------------------------------------ caches

    def cache(self, every_user: bool = False) -> list[CacheInfo]:
        """The size of the caller's persistent cache (``~/.cache`` in their jobs); with
        ``every_user``, of every user's (admins only)."""
        params = {"all": "true"} if every_user else None
        return [self._answer("CacheInfo", c) for c in self._request("GET", "/cache", params=params)]

    def clear_cache(self) -> CacheInfo:
        """Empty the caller's persistent cache; what it held.  Refused (Conflict) while a job of
        the caller runs."""
        return self._answer("CacheInfo", self._request("DELETE", "/cache"))

    def prepared_data(self) -> list[PreparedData]:
        """Data preparation's shared copies that the caller's jobs took (every one for admins),
        with their sizes and the jobs using them; expired ones are removed first."""
        return [self._answer("PreparedData", d) for d in self._request("GET", "/data")]

    def remove_prepared_data(self, key: str) -> PreparedData:
        """Remove one prepared copy now; what it was.  Refused (Conflict) while a job uses it."""
        return self._answer("PreparedData", self._request("DELETE", f"/data/{key}"))

    # ------------------------------------------------------------------------ images

    def images(self) -> list[RegisteredImage]:
        """The registered images the caller may use (public ones and their own; admins: all)."""
        return [self._answer("RegisteredImage", i) for i in self._request("GET", "/images")]

    def register_image(self, image: RegisteredImage | dict[str, Any]) -> RegisteredImage:
        """Register an image (``POST /images``): ``name``, ``environment`` (``{"python": PATH}``,
        ``{"venv": DIR}`` or ``{"conda_env": ENV}``), ``card_type``, ``scopes``, ``visibility``
        (``public``: admins only), ``description``; what the service stored."""
        body = image if isinstance(image, dict) else image.model_dump(mode="json", exclude_none=True)
        return self._answer("RegisteredImage", self._request("POST", "/images", json_body=body))

    def remove_image(self, name: str) -> None:
        """Remove a registered image of the caller's (an admin: any)."""
        self._request("DELETE", f"/images/{quote(name, safe='')}")
