"""``ma-jupyter`` stays cheap to start: importing the CLI loads neither the notebook, Jupyter,
the service nor its web stack, nor ``requests`` or ``http.client`` (the client's transport
speaks HTTP on a socket), nor pydantic: a plain client's answers are read as views of their
JSON (``client/plain.py``), and the models are imported only where a command needs them
(each model's validator is then built when first used: ``defer_build``).
bench/cli_speed.py measures the time of whole calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CLI_HEAVY_MODULES as HEAVY
from tests.helpers import imported_heavy

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter: this test process has long imported everything.
PROBE = """
import json, sys
import ma_jupyter.frontends.cli as cli
from ma_jupyter.client import Client
from ma_jupyter.frontends import render

cli.build_cli()
# what `ma-jupyter get` does with the service's answer (the job's JSON on stdin)
job = Client(plain=True)._answer("Job", json.loads(sys.stdin.read()))
text = render.format_job(job)
modules = sorted(sys.modules)
from ma_jupyter import models
from pydantic import BaseModel

built = sorted(
    name for name, value in vars(models).items()
    if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
    and value.__module__ == models.__name__ and value.__pydantic_complete__
)
print(json.dumps({"modules": modules, "built": built, "text": text}))
"""


def test_the_cli_imports_no_heavy_module_it_does_not_need():
    from ma_jupyter.models import Job

    job = Job.model_validate({"id": "j-1", "spec": {"name": "j", "command": "python train.py"}})
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        input=job.model_dump_json(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported_heavy(found["modules"]) == []
    assert found["built"] == [], f"models built at import: {found['built']}"
    assert "name:      j" in found["text"]


def test_a_call_builds_only_its_own_sub_command_and_every_help_reads_the_same(capsys):
    """``parse_command_line`` builds the options of the sub-command the line names only; what
    any line prints (help, errors) and parses to is what the whole parser gives."""
    import argparse

    from ma_jupyter.errors import InvalidSpec, OptionsExit
    from ma_jupyter.frontends import cli

    def commands_of(parser: argparse.ArgumentParser) -> dict:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return sub.choices

    names = list(commands_of(cli.build_cli()))
    assert len(names) > 20
    built = commands_of(cli.build_cli("logs"))
    assert list(built) == names
    assert [n for n, p in built.items() if isinstance(p, argparse.ArgumentParser)] == ["logs"]
    assert cli.build_cli("logs").format_help() == cli.build_cli().format_help()

    def outcome(parser: argparse.ArgumentParser, argv: list[str]) -> tuple:
        try:
            result = repr(sorted(vars(parser.parse_args(argv)).items()))
        except (InvalidSpec, OptionsExit) as exc:
            result = f"{type(exc).__name__}: {exc}"
        return result, capsys.readouterr()

    lines = [[name, "--help"] for name in names] + [[name] for name in names]
    lines += [["submit", "--spec", "cpu.small", "--wait"], ["users", "add", "-h"], ["jobs", "--bogus"]]
    for argv in lines:
        assert outcome(cli.build_cli(argv[0]), argv) == outcome(cli.build_cli(), argv), argv


# What a command's call imports before it talks to the service: the package, its parser with
# the command's options, and the module of the command's group (``cli.COMMANDS``).
COMMAND_PROBE = """
import importlib, json, sys
from ma_jupyter.frontends import cli

args = cli.parse_command_line(sys.argv[1:])
importlib.import_module(f"ma_jupyter.frontends.cli.{cli.COMMANDS[args.cmd]}")
print(json.dumps(sorted(sys.modules)))
"""

#: the command groups of ``ma_jupyter.frontends.cli``, each imported only by its own commands
GROUPS = ("account", "cluster", "devtools", "jobs", "logs", "service", "submit")

#: what none of the quick commands (bench/cli_speed.py's) loads besides ``HEAVY``: the log
#: follower's queue, a service's stop (signal), the debug terminal, a folder's copy and digest
NOT_FOR_QUICK_COMMANDS = (
    "queue",
    "signal",
    "ma_jupyter.client.shell",
    "ma_jupyter.client.snapshot",
    "ma_jupyter.algorithm_content",
    "ma_jupyter.foldersize",
)


@pytest.mark.parametrize(
    "argv, group",
    [
        (["jobs"], "jobs"),
        (["get", "j-1"], "jobs"),
        (["logs", "j-1"], "logs"),
        (["submit", "--name", "x", "--", "python", "-c", "pass"], "submit"),
    ],
)
def test_a_quick_command_imports_its_own_group_only(argv, group):
    """``jobs``, ``get``, ``logs`` and ``submit`` load the module of their own group of commands
    and none of the others', nor what only other commands need (tests/service/test_cli.py runs
    them against a service and checks what the whole call loaded)."""
    done = subprocess.run(
        [sys.executable, "-c", COMMAND_PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    others = [f"ma_jupyter.frontends.cli.{g}" for g in GROUPS if g != group]
    assert f"ma_jupyter.frontends.cli.{group}" in modules
    assert imported_heavy(modules, HEAVY + NOT_FOR_QUICK_COMMANDS + tuple(others)) == []
