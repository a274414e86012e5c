"""The paths of a node's ``/workspace`` that other rooms spell: the one place they are written.

A foundation module: it imports nothing, so every layer may import it (``tests/unit/test_layers.py``):
the wire model, the modes, the backend contract, the front ends and the node machinery name
these paths through here.  What each folder of a spec becomes, and the rules of the layout,
stay with :mod:`ma_jupyter.workspace`.
"""

#: the root of the layout every node of a job sees
VIEW_ROOT = "/workspace"
#: the algorithm folder (a node's working copy of it, its default working directory)
ALGORITHM_VIEW = f"{VIEW_ROOT}/algorithm"
#: the job's outputs folder (writable; where a process of ``Backend.start_outputs_reader``
#: finds it too)
OUTPUTS_VIEW = f"{VIEW_ROOT}/outputs"


def script_command(name: str) -> str:
    """The command a notebook cell's job runs unless told otherwise: its body saved as
    ``<name>.py`` in the algorithm folder, run with ``python`` (the magics, the create form and
    the notebook export agree through this)."""
    return f"python {ALGORITHM_VIEW}/{name}.py"
