"""The Ray backend: every job node on a node of an existing Ray cluster (see :mod:`.backend`).

Ray is an optional extra (``pip install ma_jupyter[ray]``): this package imports without it, and
:class:`RayBackend` says what to install when it is missing.
"""

from .backend import RAY_MISSING, RayBackend, require_ray

__all__ = ["RAY_MISSING", "RayBackend", "require_ray"]
