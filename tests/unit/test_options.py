"""The shared job-options parser: every option reaches its JobSpec field, bad values raise InvalidSpec."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from ma_jupyter.client.spec import absolute_paths
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.frontends import options
from ma_jupyter.models import parse_spec


def spec_of(line: str, command="python train.py", **kwargs):
    parser = options.build_parser()
    return options.spec_from_args(options.parse_args(parser, line), command=command, **kwargs)


def test_every_option_reaches_its_field(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    line = (
        "--name exp.1 --mode tensorflow --spec cpu.small --spec cpu.medium,gpu.emu-2 --nodes 2 --ps 2 --chief "
        "--priority urgent --access none --convention modelarts --duration 1h30m --resume 2 --grace 45s "
        "--elastic-min-nodes 1 --allow-scale-up --perf-threshold 1.5 --perf-policy reschedule "
        f"--code-dir {tmp_path}/algo --code-writable --dataset favorite/mnist@v2={tmp_path}/d:rw "
        f"--dataset plain={tmp_path}/p --annotation boxes={tmp_path}/a --model pretrained/bert={tmp_path}/m "
        f"--volume cache={tmp_path}/c --output {tmp_path}/out --workdir /workspace/outputs --env LR=0.1 "
        f"--env 'MSG=a b=c' --image {venv} --driver-version 535.0 --pool default "
        "--on-start 'echo hi' --on-stop 'echo bye' --debug-terminal --hang-policy stop"
    )
    spec = spec_of(line, command=["python", "train.py", "--epochs", "3"])
    assert spec == {
        "name": "exp.1",
        "mode": "tensorflow",
        "specs": ["cpu.small", "cpu.medium", "gpu.emu-2"],
        "nodes": 2,
        "ps": 2,
        "chief": True,
        "priority": "urgent",
        "access": "none",
        "convention": "modelarts",
        "duration": 5400.0,
        "grace_period": 45.0,
        "checkpoint_resume": {
            "max_resumes": 2,
            "grace_period": 45.0,
            "elastic_min_nodes": 1,
            "allow_scale_up": True,
            "perf_threshold": 1.5,
            "perf_policy": "reschedule",
        },
        "algorithm": f"{tmp_path}/algo",
        "algorithm_read_only": False,
        "datasets": [
            {
                "name": "mnist",
                "path": f"{tmp_path}/d",
                "read_only": False,
                "source": "favorite",
                "version": "v2",
            },
            {"name": "plain", "path": f"{tmp_path}/p", "read_only": True},
        ],
        "annotations": [{"name": "boxes", "path": f"{tmp_path}/a"}],
        "models": [{"name": "bert", "path": f"{tmp_path}/m", "source": "pretrained"}],
        "volumes": [{"name": "cache", "path": f"{tmp_path}/c"}],
        "outputs": f"{tmp_path}/out",
        "workdir": "/workspace/outputs",
        "env": {"LR": "0.1", "MSG": "a b=c"},
        "image": {"venv": str(venv)},
        "driver_version": "535.0",
        "pool": "default",
        "lifecycle": {"on_start": "echo hi", "on_stop": "echo bye"},
        "debug_terminal": True,
        "hang_policy": "stop",
        "command": "python train.py --epochs 3",
    }
    # the result is a valid JobSpec as it stands
    assert parse_spec(spec).checkpoint_resume.max_resumes == 2


def test_options_not_given_are_left_out_and_the_name_comes_from_the_command():
    assert spec_of("", command="python /workspace/algorithm/my_train.py --lr 1") == {
        "command": "python /workspace/algorithm/my_train.py --lr 1",
        "name": "my_train",
    }
    assert spec_of("", command=["bash", "-c", "echo hi && echo there"])["name"] == "bash"
    # an argv of one element holding a whole command line is the command text itself
    assert spec_of("", command=["python train.py --lr 1"])["command"] == "python train.py --lr 1"
    assert spec_of("", command=["--", "python", "a b.py"])["command"] == "python 'a b.py'"


def test_relative_host_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = spec_of("--dataset d=data --output ./out --code-dir ../algo --volume v=~/vol --model m=w:ro")
    assert spec["datasets"][0]["path"] == str(tmp_path / "data")
    assert spec["outputs"] == str(tmp_path / "out")
    assert spec["algorithm"] == str(tmp_path.parent / "algo")
    assert spec["volumes"][0]["path"] == os.path.expanduser("~/vol")
    assert spec["models"][0]["path"] == str(tmp_path / "w")
    other = tmp_path / "elsewhere"
    assert spec_of("--output out", cwd=other)["outputs"] == str(other / "out")


def test_image_kinds(tmp_path):
    assert spec_of(f"--image {sys.executable}")["image"] == {"python": sys.executable}
    assert spec_of("--image conda:torch")["image"] == {"conda_env": "torch"}
    with pytest.raises(InvalidSpec, match="interpreter"):
        spec_of(f"--image {tmp_path}/nope")
    with pytest.raises(InvalidSpec, match="without bin/python"):
        spec_of(f"--image {tmp_path}")
    with pytest.raises(InvalidSpec, match="env name"):
        spec_of("--image conda:")
    # a bare name is a registered image, unless it is a file or folder of the current folder
    assert spec_of("--image cuda-py", cwd=tmp_path)["image"] == {"name": "cuda-py"}
    (tmp_path / "py").symlink_to(sys.executable)
    assert spec_of("--image py", cwd=tmp_path)["image"] == {"python": str(tmp_path / "py")}


def test_batch_tasks(tmp_path):
    spec = spec_of(f"--task {tmp_path}/a::'python a.py' --task '::python b.py --x 1'", command=None)
    assert spec["type"] == "batch"
    assert spec["tasks"] == [
        {"command": "python a.py", "algorithm": f"{tmp_path}/a"},
        {"command": "python b.py --x 1"},
    ]
    assert "command" not in spec and spec["name"] == "a"
    with pytest.raises(InvalidSpec, match="ALGO_DIR::COMMAND"):
        spec_of("--task python-a.py", command=None)
    with pytest.raises(InvalidSpec, match="batch job takes its commands from tasks"):
        spec_of("--task '::python a.py'", command="python x.py")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("--nodes 0", "--nodes: must be 1 or more"),
        ("--nodes two", "expected a whole number"),
        ("--mode nope", "invalid choice: 'nope'"),
        ("--priority high", "invalid choice"),
        ("--bogus", "unrecognized arguments: --bogus"),
        ("--dataset mnist", r"expected \[SOURCE/\]NAME\[@VERSION\]=PATH\[:rw\]"),
        ("--dataset other/mnist=/d", "choose one of private, favorite"),
        ("--model m=/w:rw", "always read-only"),
        ("--volume a@1=/v", "expected NAME=PATH"),
        ("--env NOVALUE", "expected KEY=VALUE"),
        ("--env 1X=2", "env.1X"),
        ("--secret-env KEY", "--secret-env 'KEY=...': expected KEY=VALUE"),
        ("--duration soon", "is not a duration"),
        ("--grace -3", "--grace: '-3' is not a duration"),
        ("--grace 0", "--grace: a duration must be positive"),
        ("--perf-threshold 2", "need --resume"),
        ("--restart 2 --resume 2", "exclude each other"),
        ("--nodes 2", "single mode runs on one node"),
        ("--ps 1", "tensorflow mode only"),
        ("--node-name node-0 --pool default", "node_name cannot be combined"),
        ("--name 'bad name'", "name"),
        ("--spec ,", "needs a spec name"),
        ("--dataset a=/x --dataset a=/y", "mounted twice"),
    ],
)
def test_bad_values_raise_invalid_spec_saying_what_is_expected(line, expected):
    with pytest.raises(InvalidSpec, match=expected):
        spec_of(line)


def test_bad_command_and_missing_command_are_invalid_spec():
    with pytest.raises(InvalidSpec, match="bash -c"):
        spec_of("", command="KEY=VALUE python train.py")
    with pytest.raises(InvalidSpec, match="command is required"):
        spec_of("", command=None)
    with pytest.raises(InvalidSpec, match="quotes"):
        options.parse_args(options.build_parser(), "--name 'unbalanced")


def test_help_and_errors_never_exit_the_interpreter(capsys):
    parser = options.build_parser("%%ma_train")
    with pytest.raises(options.OptionsExit) as info:
        parser.parse_args(["--help"])
    assert info.value.status == 0
    assert "--dataset" in capsys.readouterr().out
    with pytest.raises(InvalidSpec, match=r"%%ma_train --help"):
        parser.parse_args(["--nodes"])


def test_front_ends_can_extend_the_parser():
    parser = options.build_parser("%%ma_train")
    parser.add_argument("--out")
    parser.add_argument("--no-follow", action="store_true")
    parser.add_argument("--command")
    args = options.parse_args(parser, "--out job --no-follow --command 'python x.py' --spec cpu.medium")
    assert args.out == "job" and args.no_follow
    assert options.spec_from_args(args) == {"command": "python x.py", "specs": ["cpu.medium"], "name": "x"}
    # or add the job options to a parser of their own
    own = argparse.ArgumentParser(prog="mine", add_help=False)
    own.add_argument("--extra")
    assert options.build_parser(parser=own) is own
    assert (
        options.spec_from_args(own.parse_args(["--extra", "1", "--nodes", "1"]), command="python y.py")[
            "nodes"
        ]
        == 1
    )


def test_options_lay_over_a_base_job():
    base = {
        "name": "orig",
        "creator": "alice",
        "command": "python a.py",
        "env": {"A": "1", "B": "2"},
        "datasets": [{"name": "d", "path": "/d1"}, {"name": "e", "path": "/e"}],
        "specs": ["cpu.small"],
    }
    spec = spec_of("--env B=3 --dataset d=/d2 --spec cpu.medium", command=None, base=base)
    assert spec == {
        "name": "orig",
        "command": "python a.py",
        "env": {"A": "1", "B": "3"},
        "datasets": [{"name": "d", "path": "/d2", "read_only": True}, {"name": "e", "path": "/e"}],
        "specs": ["cpu.medium"],
    }
    assert base["env"] == {"A": "1", "B": "2"}  # the base is not modified
    assert spec_of("--name copy", base=parse_spec(base))["name"] == "copy"


def test_control_options_are_not_job_fields():
    parser = options.build_parser()
    args = options.parse_args(parser, "--dry-run --wait --json")
    assert args.dry_run and args.wait and args.json
    assert options.spec_from_args(args, command="python x.py") == {"command": "python x.py", "name": "x"}


def test_absolute_paths_for_api_callers(tmp_path):
    spec = {
        "name": "x",
        "algorithm": "src",
        "outputs": "/abs/out",
        "datasets": [{"name": "d", "path": "data"}],
        "models": [{"name": "m", "path": "~/models/m"}],
        "volumes": [{"name": "v", "path": "../vol"}],
        "tasks": [{"algorithm": "a", "command": "python a.py"}, {"command": "python b.py"}],
        "image": {"python": "python3"},
    }
    out = absolute_paths(spec, cwd=tmp_path)
    assert out["algorithm"] == str(tmp_path / "src") and out["outputs"] == "/abs/out"
    assert out["datasets"][0]["path"] == str(tmp_path / "data")
    assert out["models"][0]["path"] == os.path.expanduser("~/models/m")
    assert out["volumes"][0]["path"] == str(tmp_path.parent / "vol")
    assert out["tasks"] == [
        {"algorithm": str(tmp_path / "a"), "command": "python a.py"},
        {"command": "python b.py"},
    ]
    assert out["image"] == {"python": "python3"}  # a bare name is looked up on PATH
    assert absolute_paths({"image": {"venv": "env", "python": None}}, cwd=tmp_path)["image"]["venv"] == str(
        tmp_path / "env"
    )
    assert spec["datasets"][0]["path"] == "data"  # the input is not modified


@pytest.mark.parametrize(("grace", "seconds"), [("1", 1.0), ("1s", 1.0), ("2m", 120.0), ("1m30s", 90.0)])
def test_grace_takes_the_forms_duration_takes(grace, seconds):
    args = options.build_parser("t").parse_args(["--grace", grace])
    assert options.spec_from_args(args, command="python t.py")["grace_period"] == seconds


def test_secret_env_and_the_secret_prefix_become_secret_env():
    spec = parse_spec(spec_of("--env A=1 --env B=secret:two --secret-env TOKEN=t0ken"))
    assert spec.env == {"A": "1"}
    assert spec.secret_env == {"B": "two", "TOKEN": "t0ken"}
    assert spec.masked().secret_env == {"B": "***", "TOKEN": "***"}
    with pytest.raises(InvalidSpec, match="also in env"):
        parse_spec(spec_of("--env A=1 --secret-env A=2"))
