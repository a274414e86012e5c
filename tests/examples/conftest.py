"""Fixtures of the example notebooks' tests (defined in ``tests/fixtures/``)."""

from tests.fixtures.notebooks import ma_papermill  # noqa: F401 (a fixture of this folder)
