"""The notebook's hints (frontends/notebook/hints.py): said when sure, silent otherwise."""

from __future__ import annotations

import pytest

from ma_jupyter.frontends.notebook.hints import kernel_variable_hint, shell_command_hint


@pytest.mark.parametrize(
    "body, command",
    [
        ("python train.py --lr 0.1", '--command "python train.py --lr 0.1"'),
        ("!python x.py", '--command "python x.py"'),
        ("torchrun --nproc_per_node 2 train.py\n", '--command "torchrun --nproc_per_node 2 train.py"'),
        ("LR=0.1 python3 train.py", '--env LR=0.1 --command "python3 train.py"'),
        ("import os\npython train.py\n", '--command "python train.py"'),  # the line it stopped at
        ("./run.sh --fast", '--command "./run.sh --fast"'),
    ],
)
def test_a_shell_command_body_gets_the_command_to_use(body, command):
    hint = shell_command_hint(body)
    assert hint is not None and f"`%ma_train {command}`" in hint
    assert "\n" not in hint


@pytest.mark.parametrize(
    "body",
    [
        "import os\nprint(os.getcwd())\n",  # Python
        "def broken(:\n    pass\n",  # not Python, but no command either: the job's own error says it
        'print "python 2"\n',
        "for x in range(3)\n    print(x)\n",
    ],
)
def test_python_or_an_unclear_body_gets_no_hint(body):
    assert shell_command_hint(body) is None


def test_a_name_error_hint_only_for_a_variable_the_kernel_has():
    log = "Traceback (most recent call last):\n  ...\nNameError: name 'lr' is not defined"
    hint = kernel_variable_hint(log, {"lr": 0.1})
    assert hint.startswith("hint: `lr` is a variable of this notebook's kernel")
    assert "--env LR={lr}" in hint and "os.environ['LR']" in hint
    assert kernel_variable_hint(log, {"other": 1}) is None
    assert kernel_variable_hint("NameError: name '_' is not defined", {"_": 1}) is None
    assert kernel_variable_hint("all went well", {"lr": 0.1}) is None
