"""How any Python process reaches the job service: :class:`Client` and :class:`JobHandle`."""

from ..wire import API_PREFIX, FORWARDED_USER_HEADER
from .http import Client, JobHandle
from .logs import LogLines

__all__ = ["API_PREFIX", "FORWARDED_USER_HEADER", "Client", "JobHandle", "LogLines"]
