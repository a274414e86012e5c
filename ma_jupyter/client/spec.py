"""A job spec at the edge: host paths made absolute against the caller's folder, then validated
by the wire model before it leaves this process."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import InvalidSpec
from ..wire import is_object_uri

#: ``models.SECRET_MASK`` (not imported: pydantic is loaded only where a spec is validated)
_MASK = "***"

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # pydantic is imported where a spec is validated, not with the client
    from typing import Any

    from ..models import JobSpec


def host_path(text: str, root: Path) -> str:
    """A host path as an absolute, normalised path (relative ones start at ``root``); an object
    storage URI (``s3://``, ``obs://``) as it is."""
    if not text:
        raise InvalidSpec("a host path is empty: give a folder, e.g. ./data")
    if is_object_uri(text):
        return text
    path = Path(os.path.expanduser(text))
    return os.path.normpath(path if path.is_absolute() else root / path)


def absolute_paths(spec: dict[str, Any], cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A copy of a JobSpec dict whose relative host paths are made absolute against ``cwd``.

    Host paths are the algorithm and outputs folders, every mount's path, batch tasks'
    algorithm folders and the image's interpreter or virtualenv (an interpreter given as a bare
    name such as ``python3`` is left for the ``PATH`` lookup).  The service resolves paths in its
    own working directory, so a caller's relative path must not reach it as such.
    """
    root = Path(cwd) if cwd is not None else Path.cwd()

    def fix(value: Any) -> Any:
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            return host_path(value, root)
        if isinstance(value, str) and value.startswith("~"):
            return os.path.expanduser(value)
        return value

    out = dict(spec)
    for key in ("algorithm", "outputs"):
        if out.get(key):
            out[key] = fix(out[key])
    for key in ("datasets", "annotations", "models", "volumes"):
        if isinstance(out.get(key), list):
            out[key] = [
                {**m, "path": fix(m["path"])} if isinstance(m, dict) and m.get("path") else m
                for m in out[key]
            ]
    if isinstance(out.get("tasks"), list):
        out["tasks"] = [
            {**t, "algorithm": fix(t["algorithm"])} if isinstance(t, dict) and t.get("algorithm") else t
            for t in out["tasks"]
        ]
    image = out.get("image")
    if isinstance(image, dict):
        image = dict(image)
        if image.get("venv"):
            image["venv"] = fix(image["venv"])
        if image.get("python") and "/" in image["python"]:
            image["python"] = fix(image["python"])
        out["image"] = image
    return out


def check(data: JobSpec | dict[str, Any], *, cwd: str | os.PathLike[str] | None = None) -> JobSpec:
    """The validated spec: host paths made absolute against ``cwd`` (default: the current
    folder), then parsed by the wire model. The client-side check every front end uses.

    Raises:
        InvalidSpec: the spec breaks a rule of the wire model (the message names the field).
    """
    from ..models import JobSpec, parse_spec

    if isinstance(data, JobSpec):
        data = data.model_dump(mode="json", exclude_unset=True)
    return parse_spec(absolute_paths(data, cwd))


def spec_body(
    spec: JobSpec | dict[str, Any] | None, fields: dict[str, Any], *, validate: bool = True
) -> dict[str, Any]:
    """The JSON body of a spec (``fields`` override its keys): host paths absolute, validated
    (without ``validate``, a plain client's, only the host paths: the service validates it
    and refuses it with the same message).

    Raises:
        InvalidSpec: the spec breaks a rule of the wire model (the message names the field).
    """
    if hasattr(spec, "model_dump"):  # a JobSpec
        data = {**spec.model_dump(mode="json", exclude_unset=True), **fields}
    else:
        data = {**(spec or {}), **fields}
    # relative host paths mean the caller's directory, not the service's
    if not validate:
        return with_submitter_credentials(absolute_paths(data))
    spec = check(data)
    if uses_object_storage(spec) and not given_credentials(spec.storage_credentials):
        credentials = storage_credentials()
        if credentials or spec.storage_credentials:  # the submitter's own, the ecosystem's way
            # (none: a public bucket; a clone's masked ones are dropped, never sent as "***")
            spec = spec.model_copy(update={"storage_credentials": credentials})
            spec.model_fields_set.add("storage_credentials")
    return spec.model_dump(mode="json", exclude_unset=True)


def with_storage_credentials(body: bytes) -> bytes:
    """A submit's or plan's JSON body relayed for a browser (the Jupyter server extension): a
    spec naming object storage without credentials gets this process's (the Jupyter server's,
    the user's own: :func:`storage_credentials`); any other body is returned as it is."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    given = with_submitter_credentials(data)
    return body if given is data else json.dumps(given).encode()


def with_submitter_credentials(data: dict[str, Any]) -> dict[str, Any]:
    """A spec dict naming object storage without credentials, with the submitter's own
    (:func:`storage_credentials`) added; any other dict (or one with none to add) as it is."""
    if given_credentials(data.get("storage_credentials")):
        return data
    paths = [data.get("outputs")] + [
        m.get("path") for key in ("datasets", "models") for m in data.get(key) or [] if isinstance(m, dict)
    ]
    if not any(isinstance(p, str) and is_object_uri(p) for p in paths):
        return data
    credentials = storage_credentials()
    if not credentials:  # a clone's masked ones are dropped: a public bucket, or the service says
        return {k: v for k, v in data.items() if k != "storage_credentials"}
    return {**data, "storage_credentials": credentials}


def given_credentials(credentials: Any) -> bool:
    """Whether a spec's ``storage_credentials`` were given: a dict whose values are all
    :data:`~ma_jupyter.models.SECRET_MASK` (a job's spec as the service shows it, cloned) counts
    as absent, so the submitter's own are taken instead."""
    return bool(credentials) and not (
        isinstance(credentials, dict) and all(v == _MASK for v in credentials.values())
    )


def uses_object_storage(spec: JobSpec) -> bool:
    """Whether a spec names object storage (a dataset, a model or its outputs)."""
    return bool(spec.object_sources()) or is_object_uri(spec.outputs)


#: the variables of the submitting process taken as its object storage credentials
CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


def storage_credentials(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The submitter's object storage credentials, the way the AWS tools find them:

    1. the ``AWS_*`` variables of this process (:data:`CREDENTIAL_VARIABLES`), when
       ``AWS_ACCESS_KEY_ID`` is set;
    2. else the profile ``AWS_PROFILE`` (default ``default``) of ``~/.aws/credentials``
       (``AWS_SHARED_CREDENTIALS_FILE``) and ``~/.aws/config`` (``AWS_CONFIG_FILE``: region,
       ``endpoint_url``), read here, on the client's machine; the process's ``AWS_ENDPOINT_URL``
       and ``AWS_REGION`` still win;
    3. else none ({}: a public bucket).
    """
    import configparser

    env = os.environ if environ is None else environ
    if env.get("AWS_ACCESS_KEY_ID"):
        return {k: env[k] for k in CREDENTIAL_VARIABLES if env.get(k)}
    profile = env.get("AWS_PROFILE") or "default"
    home = Path(os.path.expanduser("~"))
    creds_file = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config_file = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    out: dict[str, str] = {}
    for path, section in (
        (creds_file, profile),
        (config_file, profile if profile == "default" else f"profile {profile}"),
    ):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (OSError, configparser.Error) as exc:
            raise InvalidSpec(f"{path}: cannot read AWS profile {profile!r}: {exc}") from None
        if parser.has_section(section):
            for key, name in (
                ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
                ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                ("aws_session_token", "AWS_SESSION_TOKEN"),
                ("region", "AWS_REGION"),
                ("endpoint_url", "AWS_ENDPOINT_URL"),
            ):
                if parser.get(section, key, fallback=None):
                    out[name] = parser.get(section, key)
    if env.get("AWS_PROFILE") and "AWS_ACCESS_KEY_ID" not in out:
        raise InvalidSpec(f"AWS_PROFILE={profile}: no such profile with aws_access_key_id in {creds_file}")
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION"):
        if env.get(name):
            out[name] = env[name]
    return out if "AWS_ACCESS_KEY_ID" in out else {k: v for k, v in out.items() if k == "AWS_ENDPOINT_URL"}
