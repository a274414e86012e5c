"""Loading the extension, every magic's help, and bad arguments: one line each, never a
traceback. None of these cells reaches the job service."""

from __future__ import annotations

import importlib

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import ma_jupyter
from tests.magic_shell import LINE_MAGICS, Run, one_line_error


def test_load_ext_and_import_register_every_magic(ma_home):
    shell = InteractiveShell.instance()
    manager = shell.magics_manager
    for name in LINE_MAGICS:
        manager.magics["line"].pop(name, None)
    manager.magics["cell"].pop("ma_train", None)
    importlib.reload(ma_jupyter)  # `import ma_jupyter` inside a running IPython registers too
    assert set(LINE_MAGICS) <= set(manager.magics["line"])
    assert "ma_train" in manager.magics["cell"]
    shell.run_line_magic("load_ext", "ma_jupyter")
    assert "ma_train" in manager.magics["cell"]


@pytest.mark.parametrize("name", ["ma_train", *LINE_MAGICS])
def test_every_magic_has_help(ma_shell, name):
    prefix = "%%" if name == "ma_train" else "%"
    run = Run(ma_shell, f"{prefix}{name} --help" + ("\npass" if name == "ma_train" else ""))
    assert run.error is None, run.stderr
    assert "usage:" in run.stdout and name in run.stdout


@pytest.mark.parametrize(
    "code, expected",
    [
        ("%%ma_train --nodes zero\nprint(1)", "--nodes"),
        ("%%ma_train --no-such-option\nprint(1)", "unrecognized arguments"),
        ("%%ma_train --name 'bad name'\nprint(1)", "--name"),
        ("%ma_train --name x", "cell body"),
        ("%ma_train --name x --code-dir /nonexistent --command 'python x.py'", "not a folder"),
        ("%%ma_train --mode single --nodes 2\nprint(1)", "single mode"),
        ("%%ma_train --dataset nonsense\nprint(1)", "--dataset"),
        ("%%ma_train --out 1x\nprint(1)", "not a Python variable name"),
        ("%ma_jobs --status sleeping", "--status"),
        ("%ma_logs", "required: job"),
        ("%ma_logs abc --rank 1", "--rank needs --node"),
        ("%ma_events", "required: job"),
        ("%ma_stop", "required: job"),
        ("%ma_delete", "required: job"),
        ("%ma_clone", "required: job"),
        ("%ma_specs extra", "unrecognized arguments"),
        ("%ma_cluster extra", "unrecognized arguments"),
        ("%ma_tensorboard", "required: job"),
        ("%ma_attach a b", "unrecognized arguments"),
        ("%ma_logs 'unbalanced", "quotes"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(ma_shell, code, expected):
    run = Run(ma_shell, code)
    assert isinstance(run.error, UsageError), run.error
    line = one_line_error(run)
    assert line.startswith("UsageError:") and expected in line


def test_unknown_job_is_one_line_typed_error(ma_shell):
    # every magic that names a job, in one test: they share the one service the first autostarts
    for magic in ["ma_logs", "ma_events", "ma_stop", "ma_delete", "ma_clone", "ma_tensorboard"]:
        run = Run(ma_shell, f"%{magic} no-such-job")
        line = one_line_error(run)
        assert line.startswith("NotFound:") and "no-such-job" in line, (magic, line)
