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

#: what a command line of ours never needs to start (the notebook side, Jupyter, the service)
HEAVY = (
    "IPython",
    "ipywidgets",
    "ipykernel",
    "jupyter_core",
    "jupyter_client",
    "jupyter_server",
    "fastapi",
    "starlette",
    "uvicorn",
    "ray",
    "ma_jupyter.service",
    "ma_jupyter.backends",
    "ma_jupyter.nodehost",
    "ma_jupyter.frontends.notebook",
    "ma_jupyter.client.kernelspec",
    # the client's HTTP is the standard library's (client/transport.py)
    "requests",
    "urllib3",
    "http.client",  # with ssl and the email package: the transport reads HTTP itself
    "ssl",
    "email",
    # a plain client reads answers without the pydantic models (client/plain.py)
    "pydantic",
    "pydantic_core",
    "ma_jupyter.models",
    # standard-library modules only some commands need, imported where they are used: starting
    # a service or probing accelerators (subprocess), digesting a tree (hashlib)
    "subprocess",
    "hashlib",
    # the service's configuration (its dataclasses import inspect, ast, dis...) and the card
    # probes: a client finds its service through ma_jupyter.statehome
    "ma_jupyter.config",
    "ma_jupyter.accelerators",
    "dataclasses",
    "inspect",
    # argparse sizes its help with shutil (and its bz2, lzma) at each option added: the CLI's
    # formatter finds the width itself (options.HelpFormatter)
    "shutil",
    # the job folder's layout and the untrusted-file reader: only a local log read needs them
    "ma_jupyter.untrusted",
    "ma_jupyter.jobdir",
)


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
    loaded = [m for m in found["modules"] if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    assert loaded == [], loaded
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
