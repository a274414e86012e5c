"""What every wire model shares: the base :class:`Strict` (unknown fields refused), the one
clock :func:`utcnow`, the name pattern of jobs and mounts, and the size bounds of a spec's free
fields with the annotated string types that carry them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ..wire import NAME_PATTERN as NAME_PATTERN  # the one definition, pydantic-free

#: Size bounds of the spec's free fields (rule: every string and list a request carries is
#: bounded, so a hostile body is a 400 naming the field, never a 500 or a huge row):
#: a path is at most PATH_MAX; a command at most Linux's single-argument limit
#: (MAX_ARG_STRLEN, 128 KiB), since a node receives it as one argument.
MAX_PATH = 4096
MAX_COMMAND = 128 << 10
MAX_SHORT = 128
MAX_MOUNTS = 64
MAX_SPECS = 16
MAX_TASKS = 256
MAX_ENV = 1024
#: no NUL byte: no path, argument or name the kernel takes can carry one
NO_NUL = r"^[^\x00]*$"
Path_ = Annotated[str, Field(max_length=MAX_PATH, pattern=NO_NUL)]
Short = Annotated[str, Field(max_length=MAX_SHORT, pattern=NO_NUL)]
Command = Annotated[str, Field(max_length=MAX_COMMAND, pattern=NO_NUL)]
#: an algorithm folder's content identity (:mod:`ma_jupyter.algorithm_content`)
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
Digest = Annotated[str, Field(pattern=DIGEST_PATTERN)]


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the models use."""
    return datetime.now(UTC)


class Strict(BaseModel):
    """Base of every wire model: unknown fields are an error, enums travel as their values."""

    # defer_build: a model's validator is built when first used, not at import (building all
    # of them took most of a CLI call's time, and a call uses a few)
    model_config = ConfigDict(
        extra="forbid", use_enum_values=False, populate_by_name=True, allow_inf_nan=False, defer_build=True
    )
