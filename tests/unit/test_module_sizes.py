"""Every room one concern: no module of the package over ``MAX_LINES`` lines without the reason
it is one room written at its top (its docstring's ``Why one module`` paragraph)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ma_jupyter"
MAX_LINES = 600
REASON = "Why one module"


def test_every_module_over_the_limit_says_why_it_is_one_room():
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if REASON not in doc:
            unexplained.append(f"{name} ({text.count(chr(10))} lines)")
    assert unexplained == [], (
        f"modules over {MAX_LINES} lines without a '{REASON}' paragraph in their docstring: split them "
        f"by concern, or say why each is one room: {unexplained}"
    )
