"""Shared test code lives in ``tests/helpers.py``, ``tests/fixtures/`` and ``tests/fakes/``
(tests/README.md, *Where shared code lives*): no test file imports from a test module
(``test_*.py``) or a ``conftest.py``, and a folder's own helper module (``modes/placements.py``,
``ray/two_hosts.py``, ``browser/lab.py``) is imported by that folder only."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SHARED = {"helpers", "fixtures", "fakes"}


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted module) of each ``from ... import`` and ``import`` of ``tests.``."""
    package = ["tests", *path.relative_to(TESTS).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name) for name in names if name.startswith("tests.")]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("tests.")]
    return found


def test_no_test_file_imports_a_test_module_a_conftest_or_another_folders_helper():
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        folder = path.relative_to(TESTS).parts[0]
        for line, module in _imported(path):
            parts = module.split(".")
            if len(parts) < 3 or parts[1] in SHARED:
                continue
            target = TESTS.joinpath(*parts[1:3])
            if not target.with_suffix(".py").exists():
                continue  # a name imported from a package, judged by its module's entry
            if parts[2] == "conftest" or parts[2].startswith("test_") or parts[1] != folder:
                entry = f"{path.relative_to(TESTS)}:{line}: tests.{parts[1]}.{parts[2]}"
                if entry not in wrong:
                    wrong.append(entry)
    assert not wrong, "move what is shared into tests/fixtures/:\n" + "\n".join(wrong)
