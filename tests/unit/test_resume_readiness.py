"""The checkpoint-resume readiness check (modes/resume_readiness.py): sure or silent."""

from __future__ import annotations

import pytest

from ma_jupyter.models import CheckpointResume, FaultRestart, JobSpec
from ma_jupyter.modes import resume_readiness

#: trains and saves at the end only: no handler, no load
PLAIN = "import torch\nmodel = torch.nn.Linear(2, 1)\ntorch.save(model.state_dict(), 'model.pt')\n"
HANDLER = "import signal\nsignal.signal(signal.SIGTERM, lambda *_: save())\n"
LOADS = "import os, torch\nif os.environ.get('MA_RESUME') == '1':\n    model = torch.load('ckpt.pt')\n"


def _spec(command: str = "python train.py", *, resumes: int = 3, **extra) -> JobSpec:
    return JobSpec(
        name="j",
        command=command,
        algorithm="/host/algo",
        checkpoint_resume=CheckpointResume(max_resumes=resumes, grace_period=20),
        **extra,
    )


def test_code_that_neither_saves_on_sigterm_nor_resumes_is_warned_about():
    spec = _spec()
    assert resume_readiness.readiness(spec, {"train.py": PLAIN}) == (False, False)
    text = resume_readiness.warning(spec, {"train.py": PLAIN})
    assert text.startswith("warning: this job asks for 3 resumes but its code neither handles SIGTERM")
    assert "nor reads MA_RESUME" in text and "signal.signal(signal.SIGTERM" in text
    one = resume_readiness.warning(_spec(resumes=1), {"train.py": PLAIN})
    assert "asks for 1 resume but" in one


def test_what_the_code_lacks_is_named():
    no_handler = resume_readiness.warning(_spec(), {"train.py": PLAIN + LOADS})
    assert "does not handle SIGTERM" in no_handler and "20 s grace period" in no_handler
    no_load = resume_readiness.warning(_spec(), {"train.py": PLAIN + HANDLER})
    assert "neither reads MA_RESUME nor loads a checkpoint" in no_load


@pytest.mark.parametrize(
    "code",
    [
        HANDLER + LOADS,
        # by number, and a helper module of the algorithm doing the loading
        "import signal\nsignal.signal(15, handler)\nimport helper\n",
        "from signal import SIGTERM, signal\nsignal(SIGTERM, h)\nimport tensorflow as tf\n"
        "tf.keras.callbacks.BackupAndRestore('b')\n",
    ],
)
def test_ready_code_gets_no_warning(code):
    sources = {"train.py": code, "helper.py": "import os\nattempt = os.environ['MA_ATTEMPT']\n"}
    assert resume_readiness.readiness(_spec(), sources) == (True, True)
    assert resume_readiness.warning(_spec(), sources) is None


@pytest.mark.parametrize(
    ("command", "sources"),
    [
        ("bash -c 'python train.py'", {"train.py": PLAIN}),  # a shell: not judged
        ("torchrun train.py", {"train.py": PLAIN}),  # a launcher
        ("python other.py", {"train.py": PLAIN}),  # not one of the algorithm's files
        ("python train.py", None),  # the algorithm could not be read
        ("python train.py", {"train.py": "import lightning\n" + PLAIN}),  # may handle it itself
        ("python train.py", {"train.py": "import subprocess\n" + PLAIN}),  # starts other programs
        ("python train.py", {"train.py": "def broken(:\n"}),  # does not parse
    ],
)
def test_unsure_cases_say_nothing(command, sources):
    assert resume_readiness.warning(_spec(command), sources) is None


def test_only_checkpoint_resume_jobs_with_a_command_are_judged():
    plain = {"train.py": PLAIN}
    assert resume_readiness.warning(JobSpec(name="j", command="python train.py"), plain) is None
    restart = JobSpec(name="j", command="python train.py", fault_restart=FaultRestart())
    assert resume_readiness.warning(restart, plain) is None
    # python -c code without an algorithm folder is judged on its own text
    inline = JobSpec(name="j", command="python -c 'print(1)'", checkpoint_resume=CheckpointResume())
    assert "neither handles SIGTERM" in resume_readiness.warning(inline, None)
