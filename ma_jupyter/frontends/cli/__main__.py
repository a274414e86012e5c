"""``python -m ma_jupyter.frontends.cli``: the ``ma-jupyter`` command."""

import sys

from . import main

sys.exit(main())
