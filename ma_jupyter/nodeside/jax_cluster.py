"""JAX's cluster detection for the platform's nodes: ``jax.distributed.initialize()`` with no
argument finds the process count and id of a job's node.

JAX (0.4 to 0.10 at least) reads only ``JAX_COORDINATOR_ADDRESS`` from the environment; the
process count and id come from its cluster environments (``jax._src.clusters``: Slurm, Open MPI,
Kubernetes, ...), each a subclass of ``ClusterEnv`` that registers itself when it is defined.
Faking another cluster's variables (``SLURM_*``, ``OMPI_*``) would mislead Lightning and MPI
programs, so the node gets a cluster environment of its own, :class:`MaJupyterCluster`'s
definition, made once ``jax._src.clusters`` is imported.

Rules:

1. :func:`install` (the node's ``sitecustomize``, :mod:`.node_sitecustomize`, calls it where the
   platform set ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``) puts a finder first on
   ``sys.meta_path`` and imports nothing of JAX: a program that never imports JAX pays one
   string comparison per module it imports.
2. When ``jax._src.clusters`` is imported, the finder steps aside (it acts once), lets the other
   finders find the module, and after the module ran defines the cluster environment named
   ``ma_jupyter`` in it (``cluster_detection_method="ma_jupyter"`` picks it by name).
3. JAX's own environments come first (they were defined before): a program under ``mpirun``
   or Slurm keeps their per-rank answers.
4. The environment is present only where the node's model holds, one JAX process per node: the
   variables are whole numbers, the id is below the count, and no launcher started several ranks
   on this node (:data:`LOCAL_SIZES`: torchrun's, Open MPI's (5 sets no variable JAX's own
   Open MPI environment knows) or MPICH's count of this node's ranks above 1). Elsewhere JAX
   finds nothing of ours and asks for the arguments, as without the platform.
5. The coordinator is ``JAX_COORDINATOR_ADDRESS`` (JAX reads it itself first), its port replaced by
   ``JAX_COORDINATOR_PORT`` where that is set, as JAX does for its own environments.

Standard library only: it runs in the job's interpreter.
"""

from __future__ import annotations

import os
import sys

#: the module whose import defines the environment
CLUSTERS_MODULE = "jax._src.clusters"

#: the name JAX's ``cluster_detection_method`` knows it by
CLUSTER_NAME = "ma_jupyter"

#: the launchers' counts of the ranks they started on this node (torchrun, Open MPI, MPICH)
LOCAL_SIZES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def process_count_and_id(environ=os.environ) -> tuple[int, int] | None:
    """This node's JAX process count and id, or None where rule 4 says the node's model does not
    hold (or the platform set no such variables)."""
    try:
        count = int(environ["JAX_NUM_PROCESSES"])
        index = int(environ["JAX_PROCESS_ID"])
    except (KeyError, ValueError):
        return None
    if not 0 <= index < count:
        return None
    if any(environ.get(name, "1") != "1" for name in LOCAL_SIZES):  # several ranks on this node
        return None
    return count, index


def coordinator_address(override_port: str | None, environ=os.environ) -> str | None:
    """Rule 5: worker-0's coordinator address, with ``override_port`` if given."""
    address = environ.get("JAX_COORDINATOR_ADDRESS")
    if address and override_port:
        return f"{address.rsplit(':', 1)[0]}:{override_port}"
    return address


def define_cluster(clusters) -> type | None:
    """Rule 2: define (and so register) the platform's environment in JAX's ``clusters`` module;
    None where that module has no ``ClusterEnv`` (a JAX this was not made for)."""
    base = getattr(clusters, "ClusterEnv", None)
    if base is None:
        return None

    class MaJupyterCluster(base):  # type: ignore[valid-type,misc]  # JAX's class, found at run time
        """A node of an ma_jupyter job: one JAX process per node (rule 4)."""

        name = CLUSTER_NAME
        opt_in_only_method = False

        @classmethod
        def is_env_present(cls) -> bool:
            return process_count_and_id() is not None and bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))

        @classmethod
        def get_coordinator_address(cls, timeout_secs=None, override_coordinator_port=None) -> str:
            return coordinator_address(override_coordinator_port)

        @classmethod
        def get_process_count(cls) -> int:
            return process_count_and_id()[0]

        @classmethod
        def get_process_id(cls) -> int:
            return process_count_and_id()[1]

        @classmethod
        def get_local_process_id(cls) -> int | None:
            return None  # every device of the node is the process's (one process per node)

    return MaJupyterCluster


class _Loader:
    """The module's own loader, which defines the environment once the module ran (rule 2)."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        try:
            define_cluster(module)
        except Exception as exc:  # a JAX this was not made for: JAX works on without ours
            print(f"ma_jupyter: no JAX cluster detection for this node: {exc!r}", file=sys.stderr)

    def __getattr__(self, name):  # get_code, get_source, is_package, ... for tools that ask
        return getattr(self._inner, name)


class _Finder:
    """First on ``sys.meta_path``: finds nothing itself, only wraps the loader of
    :data:`CLUSTERS_MODULE` (rule 2)."""

    def find_spec(self, name, path=None, target=None):
        if name != CLUSTERS_MODULE:
            return None
        remove()  # once: a reload or a second interpreter state finds JAX's module as it is
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Rule 1: the finder, first on ``sys.meta_path`` (once; nothing where JAX's module is
    already imported)."""
    if CLUSTERS_MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


def remove() -> None:
    """Take the finder off ``sys.meta_path``."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
