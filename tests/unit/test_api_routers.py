"""The REST app's routers reach the service only through the bundle of services they are given
(``service/api/deps.py``): the supervisor's job actions, never its parts."""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "ma_jupyter" / "service" / "api"

#: the supervisor's public job actions a route may call
JOB_ACTIONS = {
    "submit",
    "update",
    "plan",
    "request_stop",
    "delete",
    "fail_job",
    "clear_cache",
    "queue_position",
    "estimated_start",
    "usage",
    "drain",
    "undrain",
    "prepared_data",
    "remove_prepared",
}


def _supervisor_uses(tree: ast.AST, skip: ast.AST | None = None) -> set[str]:
    """The names read from anything called ``supervisor`` (``x.supervisor.y``, ``supervisor.y``)."""
    skipped = set(map(id, ast.walk(skip))) if skip is not None else set()
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if (isinstance(base, ast.Name) and base.id == "supervisor") or (
            isinstance(base, ast.Attribute) and base.attr == "supervisor"
        ):
            found.add(node.attr)
    return found


def test_routes_call_only_the_supervisors_job_actions():
    used: dict[str, set[str]] = {}
    for path in sorted(API.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # the bundle is built from the supervisor's parts in one place: Services.of
        builder = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "of"), None)
        used[path.name] = _supervisor_uses(tree, skip=builder)
    assert used["jobs.py"] >= {"submit", "update", "queue_position"}  # the check sees them
    beyond = {name: sorted(uses - JOB_ACTIONS) for name, uses in used.items() if uses - JOB_ACTIONS}
    assert beyond == {}, f"routes reaching through the supervisor (use the Services bundle): {beyond}"


def test_the_bundle_is_built_from_the_supervisor_in_one_place():
    builders = []
    for path in sorted(API.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parts = _supervisor_uses(tree) - JOB_ACTIONS
        if parts:
            builders.append((path.name, sorted(parts)))
    assert builders == [("deps.py", ["backend", "health", "queue", "resources", "scheduler", "store"])]
