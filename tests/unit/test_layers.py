"""The package's layers (docs: issue #7): which module may import which, and no import cycle.

The import graph is read from the source (AST); ``from . import x`` counts as importing the
submodule ``x``.

1. The layers: module-level and function-level imports count, imports under
   ``if TYPE_CHECKING:`` do not (they load nothing at run time).
2. No cycle: every import counts, module-level, function-level and type-only alike.  An import
   inside a function still makes one room depend on the other (it only hides the circle until
   the function runs), and a type-only import means neither can be read without the other.
   A deliberate lazy load (the magics loading the client on first use) forms no cycle, so it
   needs no exemption.
3. ``KNOWN_VIOLATIONS`` lists the edges still to be removed, layer breaches and edges that close a
   cycle alike: each listed edge must still be one, and no unlisted one may exist, so the list
   only ever shrinks and is exact.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ma_jupyter"
ROOT = "ma_jupyter"

# Module (or package) prefix -> layer; the longest prefix wins.
LAYER_OF = {
    "ma_jupyter.errors": "errors",
    "ma_jupyter.workspace_paths": "workspace_paths",
    "ma_jupyter.procstat": "procstat",
    "ma_jupyter.foldersize": "foldersize",
    "ma_jupyter.algorithm_content": "algorithm_content",
    "ma_jupyter.jobdir": "jobdir",
    "ma_jupyter.untrusted": "untrusted",
    "ma_jupyter.kernel_access": "kernel_access",
    "ma_jupyter.commands": "commands",
    "ma_jupyter.nodeside": "nodeside",
    "ma_jupyter.models": "models",
    "ma_jupyter.wire": "wire",
    "ma_jupyter.config": "config",
    "ma_jupyter.cluster_schema": "cluster_schema",
    "ma_jupyter.statehome": "statehome",
    "ma_jupyter.accelerators": "accelerators",
    "ma_jupyter.tsgen": "tsgen",
    "ma_jupyter.spectext": "spectext",
    "ma_jupyter.objectstore": "objectstore",
    "ma_jupyter.endpoint_guard": "endpoint_guard",
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
    "foldersize": {"errors"},
    # the names inside a rank folder are spelled by the splitter that writes them (it starts
    # each rank before importing anything it can do without, jobdir included)
    "jobdir": {"errors", "nodeside"},
    "untrusted": {"errors", "jobdir"},
    # a dev environment's kernel folder used as untrusted, and the relay's wire: for the kernel
    # bridge (client) and the relay on a Ray node (backends.ray) alike
    "kernel_access": {"jobdir"},
    "commands": {"errors", "jobdir"},
    # runs inside a job's node, under the job's interpreter: nothing of the package beyond itself
    "nodeside": {"nodeside"},
    # the wire's plain parts (names, enumerations): the standard library only, so that a command
    # line reads the service's answers without pydantic; models/ re-exports them
    "wire": set(),
    # the wire model's package: its modules import one another (common, spec, jobs...)
    "models": {"models", "wire", "commands", "errors"},
    # this machine's cards: detection and device nodes, nothing of the package
    "accelerators": set(),
    # the state folder and the files a client finds its service by: the standard library only
    "statehome": set(),
    # cluster_schema: imported on the first read of a cluster.toml only (pydantic)
    "config": {"statehome", "wire", "models", "errors", "jobdir", "accelerators", "cluster_schema"},
    # the schema of cluster.toml: its [[spec]] and [[node]] are the wire model's
    "cluster_schema": {"models", "errors"},
    # what of an algorithm folder is shipped, and its digest: the folder walk and the home
    "algorithm_content": {"foldersize", "config", "statehome", "errors"},
    # the text formats of tasks, images and mounts: pure string rules, for every front end
    "spectext": set(),
    # object storage transfers (its client library imported on first use): for the service
    "objectstore": {"errors", "foldersize", "untrusted"},
    # the TypeScript types, and the text formats the create form mirrors
    "tsgen": {"models", "spectext"},
    "workspace": {"models", "errors"},
    "modes": {"modes", "models", "commands", "errors", "nodeside"},
    # the Kubernetes export plans a job with the modes, as a backend would, and runs nothing
    "export": {"export", "modes", "workspace", "models", "commands", "jobdir", "errors"},
    "backends.base": {"accelerators", "modes", "models", "config", "jobdir", "errors"},
    # the machinery that hosts one node on one machine (view, sandbox, runner, agents), run by
    # both backends; below the backend contract (it imports nothing of it, not even for type
    # hints: see test_the_node_machinery_knows_nothing_of_the_backend_contract); what of it runs
    # inside a node is checked apart (rsh_agent below)
    "nodehost": {
        "nodehost",
        "foldersize",
        "accelerators",
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
    # the local backend itself: a thin backend over the node machinery's NodeHost and port
    # pool (nodehost) on this machine
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
    # the Ray backend runs the node machinery (a NodeHost per Ray node, never the local
    # backend) on each Ray node, and downloads a job's object storage there where the machines
    # share no disk (objectstore)
    "backends.ray": {
        "backends.ray",
        "objectstore",
        "workspace",
        "kernel_access",
        "foldersize",
        "accelerators",
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
        "algorithm_content",
        "objectstore",
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
    "client": {
        "client",
        "models",
        "wire",
        "config",
        "statehome",
        "jobdir",
        "untrusted",
        "kernel_access",
        "errors",
        "foldersize",
        "algorithm_content",
    },
    "frontends": {"frontends", "client", "models", "wire", "config", "statehome", "spectext", "errors"},
}

# The foundation modules: they import nothing of the package, and every layer may import them
# (the ``/workspace`` paths other rooms spell: ``workspace_paths``; the one reader of
# ``/proc/<pid>/stat``: ``procstat``; the check of an object storage endpoint's address at each
# connection: ``endpoint_guard``).
FOUNDATION = {"workspace_paths", "procstat", "endpoint_guard"}
for _allowed in ALLOWED.values():
    _allowed |= FOUNDATION
ALLOWED.update({layer: set() for layer in FOUNDATION})
ALLOWED["endpoint_guard"] = {"errors"}  # its refusal is one of errors.py's types, as every error is

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


TOP, FUNCTION, TYPING = "module level", "in a function", "type hints only"


def _imports(module: str, path: Path) -> list[tuple[str, str]]:
    """(imported module, where) for every import of the package in `path`: where is TOP,
    FUNCTION (inside a function, at any depth) or TYPING (under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if _is_package(module) else module.rpartition(".")[0]
    found: list[tuple[str, str]] = []

    def record(node: ast.Import | ast.ImportFrom, where: str) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name, where) for a in node.names if a.name.split(".")[0] == ROOT)
            return
        if node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.split(".")[0] != ROOT:
            return
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            found.append((sub if sub in MODULES else target, where))

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for inner in child.body:
                    visit_node(inner, TYPING)
                for inner in child.orelse:
                    visit_node(inner, where)
            else:
                visit_node(child, where)

    def visit_node(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            record(node, where)
        elif where == TOP and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            where = FUNCTION
        visit(node, where)

    visit(tree, TOP)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def layer_of(module: str) -> str:
    best = max((p for p in LAYER_OF if module == p or module.startswith(p + ".")), key=len)
    return LAYER_OF[best]


def _layer_violations(graph: dict[str, list[tuple[str, str]]]) -> set[tuple[str, str]]:
    """Rule 1: the edges that break the layer table or FORBIDDEN (type-only imports aside)."""
    bad = set()
    for module, imports in graph.items():
        layer = layer_of(module)
        for target, where in imports:
            if target == module or target == ROOT or where == TYPING:
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


def _edges(graph: dict[str, list[tuple[str, str]]]) -> dict[str, set[str]]:
    """Rule 2: module -> the package's modules it imports, however (a package importing its own
    submodules aside)."""
    return {
        module: {
            t
            for t, _where in imports
            if t != module and t in graph and t != ROOT and not t.startswith(module + ".")
        }
        for module, imports in graph.items()
    }


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected component of more than one module, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
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

    for module in sorted(edges):
        if module not in index:
            connect(module)
    return cycles


def _cycle_edges(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The edges that lie on a cycle (both ends in one strongly connected component)."""
    found = set()
    for component in _cycles(edges):
        members = set(component)
        found |= {(v, w) for v in component for w in edges[v] if w in members}
    return found


def _without(edges: dict[str, set[str]], known: set[tuple[str, str]]) -> dict[str, set[str]]:
    return {module: targets - {t for m, t in known if m == module} for module, targets in edges.items()}


def _violations(
    graph: dict[str, list[tuple[str, str]]] = GRAPH, known: set[tuple[str, str]] = KNOWN_VIOLATIONS
) -> set[tuple[str, str]]:
    """Every edge rule 3 counts: layer breaches; each edge of a cycle left once the ``known``
    edges are out; and each ``known`` edge that still closes a cycle (listing one edge of a
    circle is enough to name it)."""
    edges = _edges(graph)
    return _layer_violations(graph) | _cycle_edges(_without(edges, known)) | (known & _cycle_edges(edges))


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
    bad = _layer_violations(GRAPH)
    assert bad <= KNOWN_VIOLATIONS, sorted(bad - KNOWN_VIOLATIONS)


def test_known_violations_are_exactly_the_violations():
    """Rule 3: a removed violation must leave KNOWN_VIOLATIONS too (so the list only shrinks),
    and a new one is never waved through by it."""
    found = _violations()
    gone = KNOWN_VIOLATIONS - found
    assert not gone, f"no longer violations, delete them from KNOWN_VIOLATIONS: {sorted(gone)}"
    unlisted = found - KNOWN_VIOLATIONS
    assert not unlisted, f"violations not in KNOWN_VIOLATIONS: {sorted(unlisted)}"


def test_no_import_cycle():
    """Rule 2: no cycle among all imports once the known violations' edges are left out."""
    cycles = _cycles(_without(_edges(GRAPH), KNOWN_VIOLATIONS))
    assert not cycles, cycles


def test_the_node_machinery_knows_nothing_of_the_backend_contract():
    """The node machinery is below the backend contract it serves: no import of it there at all,
    type-only ones included (the layer table alone lets those through)."""
    up = sorted(
        (module, target)
        for module, imports in GRAPH.items()
        if layer_of(module) == "nodehost"
        for target, _where in imports
        if layer_of(target) in {"backends.base", "backends.local", "backends.ray"}
    )
    assert not up, up


def _planted(module: str, target: str, where: str) -> dict[str, list[tuple[str, str]]]:
    graph = {m: list(imports) for m, imports in GRAPH.items()}
    graph[module].append((target, where))
    return graph


def test_the_checks_see_a_planted_function_level_cycle():
    """The checks can fail: an import inside a function that closes a circle is one."""
    edge = ("ma_jupyter.errors", "ma_jupyter.models.spec")  # models.spec -> commands -> errors
    graph = _planted(*edge, FUNCTION)
    assert edge in _violations(graph)  # a layer breach (errors imports nothing) and a cycle
    assert edge in _cycle_edges(_edges(graph))
    assert ["ma_jupyter.commands", "ma_jupyter.errors", "ma_jupyter.models.spec"] in _cycles(_edges(graph))


def test_the_checks_see_a_type_only_cycle_but_no_type_only_layer_breach():
    edge = ("ma_jupyter.errors", "ma_jupyter.models.spec")
    graph = _planted(*edge, TYPING)
    assert edge not in _layer_violations(graph)
    assert edge in _cycle_edges(_edges(graph))


def test_the_checks_see_a_planted_layer_breach():
    edge = ("ma_jupyter.accelerators", "ma_jupyter.errors")  # a room that imports nothing, no circle
    graph = _planted(*edge, TOP)
    assert _violations(graph) - _violations() == {edge}
