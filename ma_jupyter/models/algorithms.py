"""A user's algorithm folders: the ones their jobs used, with the contents (versions) those
jobs ran, and their favourites."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .common import Digest, Path_, Strict


class AlgorithmVersion(Strict):
    """One content an algorithm folder's jobs ran (a version of the folder)."""

    digest: Digest | None = Field(description="sha256 over its files; None: jobs whose content is not known.")
    jobs: int = Field(description="How many of the caller's jobs ran it.")
    last_used: datetime = Field(description="When the newest of them was submitted.")


class Algorithm(Strict):
    """An algorithm folder of the caller's: one their jobs used (the seed's "my algorithm
    volumes") or one they marked a favourite (its "favourite algorithms")."""

    path: str = Field(description="The folder, an absolute normalised path.")
    favourite: bool = False
    jobs: int = Field(default=0, description="How many of the caller's jobs use it.")
    versions: list[AlgorithmVersion] = Field(
        default=[],
        description="The contents those jobs ran, one per version, the most recently used first.",
    )


class FavouriteAlgorithm(Strict):
    """``POST /algorithms/favourites``: the folder to mark."""

    path: Path_ = Field(description="An absolute folder path.")
