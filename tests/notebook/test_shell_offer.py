"""``%ma_shell JOB`` puts into its output only a job id and a node name of the wire model's
shapes: JupyterLab's extension turns that output into a button, so a node name typed with a
control character is refused in the cell, not handed on (against a real service)."""

from __future__ import annotations

import sys

import pytest

from ma_jupyter.frontends.notebook import session
from ma_jupyter.frontends.notebook.magics import SHELL_MIME
from tests.magic_shell import Run, one_line_error

pytestmark = pytest.mark.timeout(300)


def test_ma_shell_offers_no_terminal_for_a_node_name_with_a_control_character(ma_shell):
    client = session.get_client()
    handle = client.submit(name="offer", command=f'{sys.executable} -c "print(1)"', grace_period=1)
    run = Run(ma_shell, f"%ma_shell {handle.id} --node 'worker-0\x15touch /tmp/pwned'")
    shown = one_line_error(run)
    assert "not a node name: 'worker-0\\x15touch /tmp/pwned'" in shown and "ROLE-INDEX" in shown
    assert "\x15" not in shown
    assert not [o for o in run.outputs if SHELL_MIME in o.data]
