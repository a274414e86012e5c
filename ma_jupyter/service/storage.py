"""Object storage as a job's datasets, models and outputs, the service's side of it (the
transfers themselves are ``ma_jupyter/objectstore.py``'s).

Rules:

1. At the submit, every ``s3://`` or ``obs://`` path of the spec is checked with the user's own
   credentials (``JobSpec.storage_credentials``), each within
   :data:`~ma_jupyter.objectstore.CHECK_TIMEOUT`: a dataset's or model's prefix must exist and be
   readable, an outputs prefix's bucket listable; a refusal names the field, the bucket and why.
2. The credentials live in the job's secrets row (``Store.storage_secrets``); only data
   preparation's downloads and the outputs' uploads read them, and the job's own environment
   gets them only with ``storage_env``.
3. The endpoint: the user's ``AWS_ENDPOINT_URL``, else for ``obs://`` the cluster's
   ``[storage] obs_endpoint`` (``config.load_storage``).
"""

from __future__ import annotations

from .. import config, objectstore
from ..errors import InvalidSpec
from ..models import JobSpec, is_object_uri


def endpoint(uri: objectstore.ObjectURI, credentials: dict[str, str]) -> str | None:
    """Rule 3."""
    return objectstore.endpoint_of(uri, credentials, config.load_storage().obs_endpoint)


def check_paths(spec: JobSpec) -> None:
    """Rule 1 (``spec`` with its credentials' values).

    Raises:
        InvalidSpec: a path is not a valid URI, or its prefix is missing or unreadable.
    """
    credentials = dict(spec.storage_credentials)
    for field, mount in spec.object_sources():
        what = f"{field} {mount.name}"
        uri = objectstore.ObjectURI.parse(mount.path, what)
        try:
            objectstore.check_readable(uri, credentials, endpoint(uri, credentials), what)
        except InvalidSpec as exc:
            raise InvalidSpec(str(exc), field=field) from None
    if is_object_uri(spec.outputs):
        uri = objectstore.ObjectURI.parse(spec.outputs or "", "outputs")
        try:  # an empty prefix is fine for outputs: only the bucket must answer
            objectstore.listing(
                uri, credentials, endpoint(uri, credentials), limit=1, timeout=objectstore.CHECK_TIMEOUT
            )
        except objectstore.StorageError as exc:
            if "more than" not in str(exc):
                raise InvalidSpec(f"outputs: {exc}", field="outputs") from None
