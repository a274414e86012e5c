"""The not-distributed rules on TensorFlow's logs (service/distributed_check.py, rule 2)."""

from __future__ import annotations

from ma_jupyter.service.distributed_check import HEAD_BYTES, tensorflow_alone

# what tensorflow-cpu 2.21 prints when imported, and when a strategy starts a task's server
ONEDNN = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    b"I0000 00:00:1795768065.973880       2 port.cc:153] oneDNN custom operations are on.\n"
)
IMPORTED = ONEDNN + (
    b"I0000 00:00:1795768066.064938       2 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
)
SERVER = (
    b"I0000 00:00:1795768070.123456       2 grpc_server_lib.cc:470] "
    b"Started server with target: grpc://worker-0:23456\n"
)
ALONE = IMPORTED + b"trained alone\n"


def test_tensorflow_that_logged_but_started_no_server_on_any_node_ran_alone():
    assert tensorflow_alone([ALONE, ALONE]) is True
    assert tensorflow_alone([ALONE, b"nothing from tensorflow\n"]) is True


def test_one_server_line_anywhere_means_distributed():
    assert tensorflow_alone([ALONE, ALONE + SERVER]) is False
    assert tensorflow_alone([IMPORTED + SERVER, IMPORTED + SERVER]) is False


def test_unsure_cases_say_nothing():
    quiet = b"trained alone\n"  # TF_CPP_MIN_LOG_LEVEL hid both kinds of line
    assert tensorflow_alone([quiet, quiet]) is False
    # oneDNN's line comes at every level (TF_CPP_MIN_LOG_LEVEL=1 hides the server's line only)
    assert tensorflow_alone([ONEDNN + quiet, ONEDNN + quiet]) is False
    assert tensorflow_alone([ALONE]) is False  # one node
    assert tensorflow_alone([ALONE, None]) is False  # a log that could not be read
    assert tensorflow_alone([ALONE, ALONE + b"x" * HEAD_BYTES]) is False  # read only in part
    # a job's own line that only looks like TensorFlow's (not at a line start) proves nothing
    assert tensorflow_alone([b"say I0000 00:00:1.2 2 cpu_feature_guard.cc:227] x\n", b""]) is False
