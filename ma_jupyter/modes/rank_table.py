"""The public name of :mod:`ma_jupyter.nodeside.rank_table`.

User boot files do ``from ma_jupyter.modes import rank_table`` and shell scripts run
``python -m ma_jupyter.modes.rank_table``: both keep working.
"""

import sys

from ..nodeside import rank_table as _rank_table

if __name__ == "__main__":
    sys.exit(_rank_table.main())
else:
    sys.modules[__name__] = _rank_table
