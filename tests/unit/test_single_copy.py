"""The single-copy warning's heuristic (modes/single_copy.py): sure or silent."""

from __future__ import annotations

import pytest

from ma_jupyter.models import JobSpec, Mode
from ma_jupyter.modes import single_copy

PLAIN = "import torch\nmodel = torch.nn.Linear(2, 1)\ntorch.save(model.state_dict(), 'model.pt')\n"


def _spec(command: str, *, nodes: int = 2, mode: Mode = Mode.pytorch, **extra) -> JobSpec:
    return JobSpec(name="j", command=command, mode=mode, nodes=nodes, algorithm="/host/algo", **extra)


def test_a_single_process_script_on_two_nodes_is_warned_about():
    spec = _spec("python /workspace/algorithm/train.py --lr 0.1")
    assert single_copy.is_distributed(spec, {"train.py": PLAIN}) is False
    text = single_copy.warning(spec, {"train.py": PLAIN})
    assert text.startswith("warning: ") and "each of the 2 nodes will run its own copy" in text
    assert "--nodes 1" in text
    # relative to the working directory, python options, -m with a local package
    assert single_copy.is_distributed(_spec("python -u train.py"), {"train.py": PLAIN}) is False
    sources = {
        "pkg/__init__.py": "",
        "pkg/train.py": "from pkg import helpers\n" + PLAIN,
        "pkg/helpers.py": "",
    }
    assert single_copy.is_distributed(_spec("python -m pkg.train"), sources) is False
    for mode in (Mode.horovod, Mode.tensorflow, Mode.distributed):
        assert single_copy.warning(_spec("python train.py", mode=mode), {"train.py": PLAIN})


@pytest.mark.parametrize(
    "code",
    [
        "import os\nrank = int(os.environ['RANK'])\n",
        "import json, os\ncfg = json.loads(os.environ['TF_CONFIG'])\n",
        "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
        "import horovod.torch as hvd\nhvd.init()\n",
        "import tensorflow as tf\nstrategy = tf.distribute.MultiWorkerMirroredStrategy()\n",
        "import lightning as L\ntrainer = L.Trainer()\n",
        "from accelerate import Accelerator\n",
        "import os\nprint(os.environ.get('OMPI_COMM_WORLD_RANK'))\n",
        "import jax\njax.distributed.initialize()\n",
        "import os\nport = int(os.environ['MA_PORTS'].split(',')[1])\n",
        "from xgboost import collective\nfrom xgboost.tracker import RabitTracker\n",
    ],
)
def test_code_that_reads_the_distributed_variables_or_a_framework_is_distributed(code):
    spec = _spec("python train.py")
    assert single_copy.is_distributed(spec, {"train.py": code}) is True
    assert single_copy.warning(spec, {"train.py": code}) is None


def test_a_helper_module_of_the_algorithm_counts_too():
    sources = {
        "train.py": "import trainer\ntrainer.main()\n",
        "trainer.py": "import os\nos.environ['LOCAL_RANK']\n",
    }
    assert single_copy.is_distributed(_spec("python train.py"), sources) is True


@pytest.mark.parametrize(
    "command, sources",
    [
        ("bash run.sh", {"train.py": PLAIN}),  # a shell: not sure what it runs
        ("python /workspace/dataset/train.py", {"train.py": PLAIN}),  # not the algorithm's file
        ("python missing.py", {"train.py": PLAIN}),
        ("python -m installed_pkg.train", {"train.py": PLAIN}),
        ("python train.py", None),  # the backend could not read the folder
        ("python train.py", {"train.py": "import mylib\nmylib.fit()\n"}),  # an unknown package
        ("python train.py", {"train.py": "import subprocess\nsubprocess.run(['python', 'x.py'])\n"}),
        ("python train.py", {"train.py": "def broken(:\n"}),  # does not parse
    ],
)
def test_when_unsure_nothing_is_said(command, sources):
    assert single_copy.warning(_spec(command), sources) is None


def test_launchers_one_node_and_other_modes_are_not_judged():
    assert single_copy.is_distributed(_spec("torchrun --nproc_per_node 2 train.py"), {"train.py": PLAIN})
    assert single_copy.is_distributed(_spec("python train.py --rank $RANK"), {"train.py": PLAIN})
    assert single_copy.warning(_spec("python train.py", nodes=1), {"train.py": PLAIN}) is None
    assert (
        single_copy.warning(_spec("python train.py", mode=Mode.single, nodes=1), {"train.py": PLAIN}) is None
    )
    # python -c without an algorithm: the whole code is in the command
    spec = JobSpec(name="j", command="python -c \"print('hi')\"", mode=Mode.tensorflow, nodes=2)
    assert single_copy.warning(spec, None)
