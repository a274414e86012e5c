"""Which of a job's files its command runs: the shared reading of ``python ...`` commands for the
advice judged on a job's code text (:mod:`.single_copy`, :mod:`.resume_readiness`).

Nothing here runs or imports the code: the command is split like a shell would (``shlex``) and
matched against the algorithm folder's files as the backend read them
(:meth:`~ma_jupyter.backends.base.Backend.code_sources`: path below the folder → text).
"""

from __future__ import annotations

import ast
import posixpath
import re
import shlex
import sys
from collections.abc import Iterable, Mapping

from ..models import JobSpec
from ..nodeside.argv import is_python
from ..workspace_paths import ALGORITHM_VIEW as ALGORITHM

_PYTHON_OPTIONS_WITH_VALUE = {"-W", "-X"}
#: what makes the code's behaviour depend on more than its text
DYNAMIC = re.compile(
    r"subprocess|os\.system|os\.exec|os\.spawn|popen|Popen|\bexec\(|\beval\(|importlib|__import__|runpy"
)


#: the common numeric and training libraries: none of them starts a distributed run or installs
#: a SIGTERM handler by itself (their distributed and checkpoint parts are reached through names
#: the judges look for in the job's own code: torch.distributed, tf.distribute, torch.load...)
PLAIN_LIBRARIES = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchtext",
        "numpy",
        "pandas",
        "scipy",
        "sklearn",
        "tensorflow",
        "keras",
        "tf_keras",
        "PIL",
        "matplotlib",
        "seaborn",
        "tqdm",
        "yaml",
        "h5py",
        "cv2",
        "tensorboard",
        "tensorboardX",
        "requests",
    }
)


def command_texts(spec: JobSpec, sources: Mapping[str, str] | None) -> list[str] | None:
    """The code texts a job's ``python`` command runs: the ``-c`` code and every Python file of the
    algorithm folder (the script may import the others); None when the command is not ``python
    SCRIPT``, ``-m MODULE`` or ``-c CODE`` with the script or module among the algorithm's files,
    or when the algorithm's files could not be read (``sources`` None).

    Raises:
        ValueError: the command does not split like a shell's words.
    """
    argv = shlex.split(spec.command or "")
    if not is_python(argv):
        return None
    target = python_target(argv[1:])
    if target is None:
        return None
    kind, value = target
    if spec.algorithm and sources is None:
        return None  # the algorithm's code could not be read
    sources = sources or {}
    if kind != "code" and in_algorithm(kind, value, spec.workdir or ALGORITHM, sources) is None:
        return None
    return ([value] if kind == "code" else []) + list(sources.values())


def python_target(args: list[str]) -> tuple[str, str] | None:
    """What ``python ARGS`` runs: ("script", path), ("module", name) or ("code", text)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-m", "-c"):
            return ("module" if arg == "-m" else "code", args[i + 1]) if i + 1 < len(args) else None
        if arg in _PYTHON_OPTIONS_WITH_VALUE:
            i += 2
        elif arg.startswith("-"):
            if arg[1:2] in ("m", "c") and len(arg) > 2:
                return ("module" if arg[1] == "m" else "code", arg[2:])
            i += 1
        else:
            return "script", arg
    return None


def in_algorithm(kind: str, value: str, workdir: str, sources: Mapping[str, str]) -> str | None:
    """The path below the algorithm folder of the script or module run, if it is one of its files."""
    if "$" in value:
        return None
    if kind == "module":
        base = posixpath.join(workdir, *value.split("."))
        candidates = [base + ".py", posixpath.join(base, "__main__.py")]
    else:
        candidates = [posixpath.join(workdir, value)]
    for path in candidates:
        path = posixpath.normpath(path)
        if path.startswith(ALGORITHM + "/") and path[len(ALGORITHM) + 1 :] in sources:
            return path[len(ALGORITHM) + 1 :]
    return None


def beyond_text(texts: Iterable[str], sources: Mapping[str, str], known: frozenset[str]) -> bool:
    """Whether the code's behaviour depends on more than ``texts``: it starts other programs,
    imports code dynamically (:data:`DYNAMIC`), or imports a package that is neither the
    standard library, one of the algorithm's own modules (``sources``) nor one of ``known``.

    Raises:
        SyntaxError: a text does not parse.
    """
    local = {path.split("/")[0].removesuffix(".py") for path in sources}
    for text in texts:
        if DYNAMIC.search(text):
            return True
        for module in imports(text):
            if module not in sys.stdlib_module_names and module not in local and module not in known:
                return True
    return False


def imports(text: str) -> set[str]:
    """Top-level modules the code imports (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found
