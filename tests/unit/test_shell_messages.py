"""Terminal messages of any shape, at the two ends that parse them without a node: the
service's reading of a client's message and the client's reading of the service's."""

from __future__ import annotations

import json

import pytest

from ma_jupyter.backends.base import SHELL_DATA, SHELL_RESIZE
from ma_jupyter.client import shell as client_shell
from ma_jupyter.errors import BackendUnavailable, InvalidSpec
from ma_jupyter.service import shell as service_shell

NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('["set_size", 1e400, 5]', "two whole numbers from 0 to 1000"),
        ('["set_size", 24, 80, 1]', "two whole numbers"),
        ('["set_size", false, 80]', "two whole numbers"),
        ('["set_size", 1001, 80]', "two whole numbers"),
        (NESTED, "nested too deep"),
        ('["stdin", {"a": 1}]', "stdin takes one string"),
        ('{"stdin": "ls"}', "is a JSON list"),
        ("[]", "is a JSON list"),
        ("[1]", "is a JSON list"),
        ("Infinity", "is a JSON list"),
        ("\xff\xfe", "not JSON"),
        ('["rm", "-rf"]', "unknown terminal message 'rm'"),
        (json.dumps(["stdin", "x" * (1 << 20)]), "over the 1048576"),
    ],
)
def test_the_service_refuses_a_client_message_saying_why(text, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("[", r"\[")):
        service_shell.parse_message(text)


def test_the_service_takes_the_two_messages_it_knows():
    assert service_shell.parse_message('["stdin", "ls\\n"]') == (SHELL_DATA, b"ls\n")
    assert service_shell.parse_message(b'["set_size", 0, 1000]') == (
        SHELL_RESIZE,
        b'{"rows": 0, "cols": 1000}',
    )


@pytest.mark.parametrize(
    "text",
    [
        NESTED,
        "not json",
        '["stdout", 5]',
        '["exit", "0"]',
        '["exit", 1e400]',
        '["error", []]',
        "[1, 2]",
        '{"a": 1}',
    ],
)
def test_the_client_ends_on_a_service_message_it_cannot_read_with_a_clear_error(text):
    with pytest.raises(BackendUnavailable, match="cannot read"):
        client_shell._parse(text)


def test_the_client_reads_what_the_service_sends():
    assert client_shell._parse('["stdout", "hi"]') == ("stdout", "hi")
    assert client_shell._parse('["exit", 3]') == ("exit", 3)
    assert client_shell._parse('["refused", "why"]') == ("refused", "why")
    assert client_shell._parse('["error", {"status": 1e400}]') == ("error", {"status": 500})
    assert client_shell._parse('["news", 1]') == ("", None)  # a kind of a later service: ignored


def test_the_client_checks_sizes_and_text_before_sending():
    session = client_shell.ShellSession.__new__(client_shell.ShellSession)
    for rows, cols in ((1e400, 5), (True, 80), (-1, 80), (24, 1001), ("24", 80)):
        with pytest.raises(InvalidSpec, match="whole numbers from 0 to 1000"):
            session.resize(rows, cols)
    with pytest.raises(InvalidSpec, match="takes text"):
        session.send(b"bytes")
