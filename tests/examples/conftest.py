"""Fixtures of the example notebooks' tests (defined in ``tests/fixtures/``)."""

from tests.fixtures.notebooks import (  # noqa: F401 (fixtures of this folder)
    ma_module_papermill,
    ma_papermill,
)
