"""Every node's ``sitecustomize``: the folder on the node's PYTHONPATH (``HELPERS_VIEW``) holds a
link named ``sitecustomize.py`` to this file, so Python's ``site`` runs it at each start of an
interpreter in the node (not under ``-S`` or ``-I``).

Rules, in order:

1. Where the platform names this node's JAX process (``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``),
   :func:`ma_jupyter.nodeside.jax_cluster.install` readies JAX's cluster detection; nothing of JAX
   is imported here.
2. The image's own ``sitecustomize`` (the first one on ``sys.path`` after this folder: Debian's
   Python has one), if any, then runs as if this one were not there, under the same name.

Both run only when the file is imported as ``sitecustomize`` (never when the package's own
modules are imported, by tests or tools). A failure of rule 1 is printed, never raised: a job's
Python must start whatever this file meets.
"""

import os
import sys


def _image_sitecustomize() -> None:
    """Rule 2, with the import system's own frozen modules (``importlib.util`` would cost each
    start its imports: contextlib, functools, collections)."""
    from _frozen_importlib import module_from_spec
    from _frozen_importlib_external import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))  # the link's folder: Python keeps the link's path
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _run() -> None:
    try:
        if "JAX_NUM_PROCESSES" in os.environ and "JAX_PROCESS_ID" in os.environ:
            from ma_jupyter.nodeside import jax_cluster

            jax_cluster.install()
    except Exception as exc:
        print(f"ma_jupyter: no JAX cluster detection in this process: {exc!r}", file=sys.stderr)
    _image_sitecustomize()


if __name__ == "sitecustomize":
    _run()
