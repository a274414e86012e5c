"""The package's layers (docs: issue #7): which module may import which, and no import cycle.

The import graph is read from the source (AST): module-level and function-level imports count,
imports under ``if TYPE_CHECKING:`` do not; ``from . import x`` counts as importing the submodule
``x``. ``KNOWN_VIOLATIONS`` lists the edges still to be removed: it only ever shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ma_jupyter"
ROOT = "ma_jupyter"

# Module (or package) prefix -> layer; the longest prefix wins.
LAYER_OF = {
    "ma_jupyter.errors": "errors",
    "ma_jupyter.foldersize": "foldersize",
    "ma_jupyter.jobdir": "jobdir",
    "ma_jupyter.untrusted": "untrusted",
    "ma_jupyter.commands": "commands",
    "ma_jupyter.nodeside": "nodeside",
    "ma_jupyter.models": "models",
    "ma_jupyter.config": "config",
    "ma_jupyter.accelerators": "accelerators",
    "ma_jupyter.tsgen": "tsgen",
    "ma_jupyter.workspace": "workspace",
    "ma_jupyter.modes": "modes",
    "ma_jupyter.export": "export",
    "ma_jupyter.backends": "backends.base",
    "ma_jupyter.backends.base": "backends.base",
    "ma_jupyter.backends.local": "backends.local",
    "ma_jupyter.nodehost": "nodehost",
    "ma_jupyter.backends.ray": "backends.ray",
    "ma_jupyter.service": "service",
    "ma_jupyter.service.__main__": "root",
    "ma_jupyter.client": "client",
    "ma_jupyter.frontends": "frontends",
    "ma_jupyter": "root",
}

ALLOWED = {
    "errors": set(),
    # the one folder-size walk: the standard library only, for every layer that measures a folder
    "foldersize": set(),
    # the names inside a rank folder are spelled by the splitter that writes them (it starts
    # each rank before importing anything it can do without, jobdir included)
    "jobdir": {"errors", "nodeside"},
    "untrusted": {"errors", "jobdir"},
    "commands": {"errors", "jobdir"},
    # runs inside a job's node, under the job's interpreter: nothing of the package beyond itself
    "nodeside": {"nodeside"},
    "models": {"commands", "errors"},
    # this machine's cards: detection and device nodes, nothing of the package
    "accelerators": set(),
    "config": {"models", "errors", "jobdir", "accelerators"},
    "tsgen": {"models"},
    "workspace": {"models", "errors"},
    "modes": {"modes", "models", "commands", "errors", "nodeside"},
    # the Kubernetes export plans a job with the modes, as a backend would, and runs nothing
    "export": {"export", "modes", "workspace", "models", "commands", "jobdir", "errors"},
    "backends.base": {"accelerators", "modes", "models", "config", "jobdir", "errors"},
    # the machinery that hosts one node on one machine (view, sandbox, runner, agents), run by
    # both backends; what of it runs inside a node is checked apart (rsh_agent below)
    "nodehost": {
        "nodehost",
        "foldersize",
        "accelerators",
        "backends.base",
        "modes",
        "workspace",
        "models",
        "config",
        "jobdir",
        "untrusted",
        "commands",
        "errors",
        "nodeside",
    },
    # the local backend itself: it runs the node machinery (nodehost) on this machine
    "backends.local": {
        "backends.local",
        "nodehost",
        "accelerators",
        "backends.base",
        "modes",
        "models",
        "config",
        "jobdir",
        "untrusted",
        "errors",
    },
    # the Ray backend runs the node machinery (and the local backend) on each Ray node
    "backends.ray": {
        "backends.ray",
        "foldersize",
        "accelerators",
        "backends.local",
        "nodehost",
        "backends.base",
        "modes",
        "models",
        "config",
        "jobdir",
        "untrusted",
        "commands",
        "errors",
        "nodeside",
    },
    # no "untrusted": the service reads what a job wrote only through its backend
    "service": {
        "service",
        "foldersize",
        "accelerators",
        "backends.base",
        "export",
        "modes",
        "models",
        "config",
        "jobdir",
        "commands",
        "errors",
    },
    "client": {"client", "models", "config", "jobdir", "untrusted", "errors"},
    "frontends": {"frontends", "client", "models", "config", "errors"},
}

# Edges that break a rule beyond the layer table: notebook widgets reach the shared client
# through the notebook session, not through the magics.
FORBIDDEN = [
    ("ma_jupyter.frontends.notebook.widgets", "ma_jupyter.frontends.notebook.magics"),
]

# (importer, imported) edges still to be removed. Each step of the layout deletes its entries.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "labextension" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES.get(module, Path()).name == "__init__.py"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every import of the package in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if _is_package(module) else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit(other, top)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names if a.name.split(".")[0] == ROOT)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] != ROOT:
                    continue
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.append((sub if sub in MODULES else target, top))
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, inner)

    visit(tree, True)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def layer_of(module: str) -> str:
    best = max((p for p in LAYER_OF if module == p or module.startswith(p + ".")), key=len)
    return LAYER_OF[best]


def _violations() -> set[tuple[str, str]]:
    bad = set()
    for module, imports in GRAPH.items():
        layer = layer_of(module)
        for target, _ in imports:
            if target == module or target == ROOT:
                continue
            if layer != "root" and layer_of(target) not in ALLOWED[layer]:
                bad.add((module, target))
            for importer, imported in FORBIDDEN:
                if (module == importer or module.startswith(importer + ".")) and (
                    target == imported or target.startswith(imported + ".")
                ):
                    bad.add((module, target))
        # Code that runs inside a node: `python -m <module>` imports its parent packages too.
        if layer == "nodeside" or module == "ma_jupyter.nodehost.rsh_agent":
            parts = module.split(".")
            for n in range(2, len(parts)):
                parent = ".".join(parts[:n])
                if layer_of(parent) not in {"nodeside", "backends.base", "nodehost"}:
                    bad.add((module, parent))
    return bad


def test_every_module_has_a_layer():
    for module in MODULES:
        assert layer_of(module) in ALLOWED or layer_of(module) == "root", module


def test_every_imported_module_exists():
    """A relative import left one level off by a move fails only when its function runs."""
    missing = sorted(
        (module, target)
        for module, imports in GRAPH.items()
        for target, _ in imports
        if target not in MODULES and target != ROOT
    )
    assert not missing, missing


def test_imports_follow_the_layers():
    bad = _violations()
    assert bad <= KNOWN_VIOLATIONS, sorted(bad - KNOWN_VIOLATIONS)


def test_known_violations_are_still_there():
    """A removed violation must leave KNOWN_VIOLATIONS too, so the list only shrinks."""
    gone = KNOWN_VIOLATIONS - _violations()
    assert not gone, sorted(gone)


def test_no_import_cycle():
    """No cycle among module-level imports (a package importing its own submodules is fine)."""
    edges = {
        module: {
            t
            for t, top in imports
            if top and t != module and t in MODULES and t != ROOT and not t.startswith(module + ".")
        }
        for module, imports in GRAPH.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in edges:
        if module not in index:
            connect(module)
    assert not cycles, cycles
