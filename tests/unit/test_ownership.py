"""One owner per claim, as docs/architecture.md states it, checked over the package's source.

1. Bubblewrap's argv is built only in ``nodehost/bwrap.py`` (a string constant that is one of
   bubblewrap's own options appears nowhere else).
2. What a process is and does (``/proc/<pid>/stat``, ``statm``, ``status``, ``wchan``, ``comm``,
   ``cmdline``) is read only in ``nodehost/procfs.py``.
3. Every exception class is defined in ``errors.py``; ``nodeside/`` keeps its own, since it runs
   inside nodes as plain scripts that cannot import the package.
4. The backend contract is numbered once, in ``backends/base.py``; docs/architecture.md lists
   the same titles under the same numbers.

``KNOWN_STRAYS`` lists the breaches still to be folded into their owner, with why each is left:
each listed one must still be one and no other may exist, so the list only shrinks.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ma_jupyter"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

BWRAP_OWNER = "ma_jupyter/nodehost/bwrap.py"
PROC_OWNER = "ma_jupyter/nodehost/procfs.py"
ERRORS_OWNER = "ma_jupyter/errors.py"
#: runs inside a node as plain scripts (``python -I -S workdir.py``): it cannot import errors.py
OWN_ERRORS = ("ma_jupyter/nodeside/",)

BWRAP_OPTIONS = {
    "--ro-bind",
    "--ro-bind-try",
    "--bind",
    "--bind-try",
    "--dev-bind",
    "--dev-bind-try",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-user",
    "--unshare-all",
    "--die-with-parent",
    "--cap-drop",
    "--cap-add",
    "--tmpfs",
    "--remount-ro",
    "--new-session",
    "--as-pid-1",
    "--size",
}
PROCESS_FILES = ("stat", "statm", "status", "wchan", "comm", "cmdline")

#: (claim, module) breaches left, and why
KNOWN_STRAYS: dict[tuple[str, str], str] = {}
#: ``/proc/<pid>/stat`` is read by the foundation ``procstat.py`` (every layer may import it: the
#: client's check that its service is alive too), which ``procfs.py`` builds on
PROC_FOUNDATION = "ma_jupyter/procstat.py"


def _sources() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found[rel] = ast.parse(path.read_text(), rel)
    return found


SOURCES = _sources()


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (they may name options in prose)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def bwrap_builders() -> set[str]:
    found = set()
    for rel, tree in SOURCES.items():
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in docs and node.value in BWRAP_OPTIONS:
                found.add(rel)
    return found


def process_file_readers() -> set[str]:
    """Modules spelling ``f"/proc/{pid}/<file>"``."""
    found = set()
    wanted = re.compile(r"^/(" + "|".join(PROCESS_FILES) + r")\b")
    for rel, tree in SOURCES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            parts = node.values
            for i, part in enumerate(parts[:-2]):
                if (
                    isinstance(part, ast.Constant)
                    and str(part.value).endswith("/proc/")
                    and isinstance(parts[i + 1], ast.FormattedValue)
                    and isinstance(parts[i + 2], ast.Constant)
                    and wanted.match(str(parts[i + 2].value))
                ):
                    found.add(rel)
    return found


def exception_definers() -> dict[str, list[str]]:
    """Module -> the exception classes it defines (bases resolved by name: the builtins' and
    errors.py's exceptions, and classes already found)."""
    exceptions = {name for name in dir(builtins) if isinstance(getattr(builtins, name), type)}
    exceptions = {n for n in exceptions if issubclass(getattr(builtins, n), BaseException)}
    exceptions |= {"Exception", "BaseException"}
    found: dict[str, list[str]] = {}
    changed = True
    while changed:  # a class may derive from one defined later or in another module
        changed = False
        for rel, tree in SOURCES.items():
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or node.name in found.get(rel, []):
                    continue
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                if bases & exceptions:
                    exceptions.add(node.name)
                    found.setdefault(rel, []).append(node.name)
                    changed = True
    return found


def _strays(claim: str, modules: set[str], owner: str) -> set[tuple[str, str]]:
    return {(claim, rel) for rel in modules if rel != owner}


def _known(claim: str) -> set[tuple[str, str]]:
    return {key for key in KNOWN_STRAYS if key[0] == claim}


def test_only_bwrap_py_builds_bubblewrap_argv():
    builders = bwrap_builders()
    assert BWRAP_OWNER in builders  # the check sees the owner itself
    assert _strays("bwrap", builders, BWRAP_OWNER) == _known("bwrap")
    assert "the only builder of bubblewrap argv (`bwrap.py`)" in ARCHITECTURE.read_text()


def test_only_procfs_py_reads_what_a_process_is_and_does():
    readers = process_file_readers()
    assert PROC_OWNER in readers
    assert _strays("proc", readers - {PROC_FOUNDATION}, PROC_OWNER) == _known("proc")
    assert "(`procfs.py`" in ARCHITECTURE.read_text()


def test_every_exception_class_is_defined_in_errors_py():
    definers = exception_definers()
    assert "NodeGone" in definers[ERRORS_OWNER] and "MaJupyterError" in definers[ERRORS_OWNER]
    strays = {
        f"{rel}: {', '.join(names)}"
        for rel, names in definers.items()
        if rel != ERRORS_OWNER and not rel.startswith(OWN_ERRORS) and ("errors", rel) not in KNOWN_STRAYS
    }
    assert not strays, "define these in ma_jupyter/errors.py (re-export them where they were):\n" + "\n".join(
        sorted(strays)
    )


def test_the_backend_contract_is_numbered_once_and_the_docs_list_its_titles():
    from ma_jupyter.backends.base import Backend

    code = re.findall(r"^    (\d+)\. \*\*(.+?)\*\*", Backend.__doc__ or "", re.M)
    assert [int(n) for n, _ in code] == list(range(1, len(code) + 1)) and len(code) >= 27
    section = ARCHITECTURE.read_text().split("## The backend contract", 1)[1]
    docs = re.findall(r"^\| (\d+) \| (.+?) \| .* \|$", section, re.M)
    assert [(n, t.replace("`", "")) for n, t in docs] == [
        (n, t.replace("``", "").rstrip(".")) for n, t in code
    ]
    # no numbered rule list of its own in the page: a line "N. **Title**" in that section
    assert not re.search(r"^\d+\. \*\*", section.split("## ", 1)[0], re.M)
