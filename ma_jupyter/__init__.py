"""ma_jupyter: submit notebook training code as task-style training jobs.

``%load_ext ma_jupyter`` (or ``import ma_jupyter`` inside IPython) registers the magics;
:class:`Client` reaches the job service (starting it on first use).
"""

from __future__ import annotations

__version__ = "0.1.0"
