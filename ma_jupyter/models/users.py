"""Users of the service: the name patterns (a service user, a forwarded hub user), a user as
the service answers it, the bodies that add one, and each user's notification settings."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .common import Strict, utcnow

#: A user name: letters, digits and ``_ . @ -`` (JupyterHub names may be e-mail addresses).
USER_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$"
#: The namespace of the hub users the Jupyter server extension forwards: ``hub:<name>``, which
#: no service user can be named (``:`` is not in :data:`USER_PATTERN`), see ``service/users.py``.
FORWARDED_PREFIX = "hub:"
#: A service user's name or a forwarded hub user's (``hub:<name>``).
ANY_USER_PATTERN = r"^(?:hub:)?[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$"


class User(Strict):
    """A user of the service (never with a token: only its hash is stored)."""

    name: str = Field(pattern=ANY_USER_PATTERN)
    admin: bool = False
    created_at: datetime = Field(default_factory=utcnow)


class NewUser(Strict):
    """``POST /users``: the user to add."""

    name: str = Field(max_length=64, description="Letters, digits and _ . @ -; at most 64.")
    admin: bool = False


class NotifySettings(Strict):
    """``GET|PUT /users/me/notify``: where the caller's own jobs' alerts and terminal states go,
    besides the administrator's ``[notify]`` hook."""

    webhook: str | None = Field(
        default=None,
        max_length=2048,
        description="http(s) URL that gets each event as a JSON POST; null: none.",
    )
    address: str | None = Field(
        default=None,
        max_length=320,
        # no control character, C1 (NEL) and Unicode line separators included: the admin's
        # command may write it into a mail header or a line-based protocol
        pattern=r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]+$",
        description="Where the administrator's [notify] command delivers your events (a mail "
        "address, a chat handle...): each event of your jobs carries it as 'address'; null: none. "
        "A PUT changes only the fields it names.",
    )


class UserToken(User):
    """A user with a token just made for it: the only time the token is shown."""

    token: str
