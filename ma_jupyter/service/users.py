"""Who calls the service: users, their tokens, and the proxy that speaks for Jupyter users.

Every request carries ``Authorization: Bearer <token>``; the caller is decided in this order:

1. The proxy token (made at each start, written to the runtime file beside the owner's token,
   held by the Jupyter server extension): the caller is the hub user named by the
   ``X-MA-Forwarded-User`` header, in a namespace of its own: header ``alice`` acts as
   ``hub:alice`` (:data:`~ma_jupyter.models.FORWARDED_PREFIX`), created as a non-admin on first
   sight.  No service user's name has a ``:``, so a hub user named like the owner, an admin or
   any other user is never that user: it sees only its own jobs (and those shared with others)
   and is never an admin, whatever the store says.  The proxy token without that header is
   refused.
2. A user's token: the caller is that user.  ``X-MA-Forwarded-User`` is ignored, as is any other
   header naming a user: only a token says who calls.
3. Anything else: 401.

Tokens are 32 random bytes (URL-safe base64); the store keeps only their sha256, looked up by
its index (an attacker learns nothing from the timing of a lookup by hash), and the proxy
token is compared in constant time.  The service owner (the account that started it) is an
admin whose token is made anew at each start; other users get theirs from an admin, shown
once.  Removing a user (or giving it a new token) makes the old token fail on the next request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import dataclass

from ..errors import Conflict, Forbidden, InvalidSpec, Unauthorized
from ..models import FORWARDED_PREFIX, FORWARDED_USER_HEADER, USER_PATTERN, User, UserToken
from .store import Store

TOKEN_BYTES = 32
_USER_NAME = re.compile(USER_PATTERN)


def new_token() -> str:
    """A fresh random token (32 bytes, URL-safe)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str) -> str:
    """What the store keeps of a token: its sha256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Caller:
    """The user a request acts as."""

    name: str
    admin: bool = False


class Directory:
    """The service's users: authentication of requests and the admin's user management.

    Args:
        store: where users and token hashes live.
        owner: the service owner's name (an admin).
        owner_token: the owner's token for this run (its hash replaces the previous one).
        proxy_token: the token of the forwarding proxy for this run (kept in memory only).
    """

    def __init__(self, store: Store, owner: str, owner_token: str, proxy_token: str):
        self.store = store
        self.owner = owner
        self._proxy_hash = token_hash(proxy_token)
        # token hash -> caller: requests need no database read; every change of users goes
        # through this object, which clears it, so a revoked token fails at once.
        self._cache: dict[str, Caller] = {}
        self._forwarded_cache: dict[str, Caller] = {}  # forwarded name -> caller (no write per request)
        self._lock = threading.Lock()
        store.set_owner(owner, token_hash(owner_token))

    # ------------------------------------------------------------------ authentication

    def authenticate(self, authorization: str, forwarded: str | None) -> Caller:
        """The caller of a request with this ``Authorization`` header (rules 1 to 3).

        Raises:
            Unauthorized: no token, an unknown or revoked one, or the proxy token without a
                valid forwarded user name.
        """
        given = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        if not given:
            raise Unauthorized(
                "no token: send Authorization: Bearer <token> (the client reads it from "
                "$MA_JUPYTER_TOKEN, else from $MA_JUPYTER_HOME/service.json)"
            )
        digest = token_hash(given)
        if hmac.compare_digest(digest, self._proxy_hash):
            return self._forwarded(forwarded)
        with self._lock:
            caller = self._cache.get(digest)
        if caller is None:
            user = self.store.user_for_token(digest)
            if user is None:
                raise Unauthorized(
                    "this token is not (or no longer) valid: ask an admin for a new one "
                    "(`ma-jupyter users token NAME`), or unset MA_JUPYTER_TOKEN to act as the "
                    "service owner"
                )
            caller = Caller(user.name, user.admin)
            with self._lock:
                self._cache[digest] = caller
        return caller

    def _forwarded(self, name: str | None) -> Caller:
        if not name:
            raise Unauthorized(f"the proxy token acts only for a user named in {FORWARDED_USER_HEADER}")
        if not _USER_NAME.match(name):
            raise Unauthorized(
                f"{FORWARDED_USER_HEADER}: {name[:80]!r} is not a user name "
                "(letters, digits and _ . @ -, at most 64)"
            )
        with self._lock:
            caller = self._forwarded_cache.get(name)
        if caller is None:
            # rule 1: its own namespace, never an admin (admins are the service's own users)
            user = self.store.ensure_user(FORWARDED_PREFIX + name)
            caller = Caller(user.name, admin=False)
            with self._lock:
                self._forwarded_cache[name] = caller
        return caller

    # ------------------------------------------------------------------ administration

    def list(self, caller: Caller) -> list[User]:
        """Every user (admins only)."""
        self._admin(caller, "list users")
        return self.store.users()

    def add(self, caller: Caller, name: str, admin: bool) -> UserToken:
        """Create a user and its token, returned this once (admins only).

        Raises:
            Forbidden: the caller is no admin.
            Conflict: the user exists.
        """
        self._admin(caller, "add users")
        _check_name(name)
        token = new_token()
        user = self.store.add_user(name, admin, token_hash(token))
        return UserToken(**user.model_dump(), token=token)

    def new_token(self, caller: Caller, name: str) -> UserToken:
        """Give a user a new token (the old one stops working), returned this once (admins only).

        Raises:
            Forbidden: the caller is no admin.
            Conflict: ``name`` is the owner, whose token the service makes at each start, or a
                forwarded hub user, who acts only through the Jupyter server extension.
            NotFound: no such user.
        """
        self._admin(caller, "give users tokens")
        if name == self.owner:
            raise Conflict(
                f"{name} owns the service: its token is made at each start and written to "
                "$MA_JUPYTER_HOME/service.json; restart the service for a new one"
            )
        if name.startswith(FORWARDED_PREFIX):
            raise Conflict(
                f"{name} is a JupyterHub user forwarded by the Jupyter server extension and has no "
                "token; add a service user (`ma-jupyter users add NAME`) for a token"
            )
        token = new_token()
        user = self.store.set_token(name, token_hash(token))
        self._forget()
        return UserToken(**user.model_dump(), token=token)

    def remove(self, caller: Caller, name: str) -> None:
        """Remove a user: its token stops working now; its jobs stay (admins only).

        Raises:
            Forbidden: the caller is no admin.
            Conflict: ``name`` is the service owner.
            NotFound: no such user.
        """
        self._admin(caller, "remove users")
        if name == self.owner:
            raise Conflict(f"{name} owns the service and stays an admin; stop the service to end its access")
        self.store.remove_user(name)
        self._forget()

    def _forget(self) -> None:
        with self._lock:
            self._cache.clear()
            self._forwarded_cache.clear()

    @staticmethod
    def _admin(caller: Caller, what: str) -> None:
        if not caller.admin:
            raise Forbidden(f"only admins may {what}; {caller.name} is not an admin")


def _check_name(name: str) -> None:
    if not _USER_NAME.match(name or ""):
        raise InvalidSpec(
            f"{name[:80]!r} is not a user name: use letters, digits and _ . @ - (at most 64)", field="name"
        )
