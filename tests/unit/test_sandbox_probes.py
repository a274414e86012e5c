"""The sandbox probes' rule for a probe that does not answer in time (nodehost/probes.py rule 3):
a loaded machine never makes the service isolate less."""

from __future__ import annotations

import subprocess

import pytest

from ma_jupyter.nodehost import probes


@pytest.fixture
def fresh_answers(monkeypatch):
    monkeypatch.setattr(probes, "_BWRAP_OK", None)
    monkeypatch.setattr(probes, "_USERNS_OK", None)
    monkeypatch.setattr(probes.os, "geteuid", lambda: 0)
    monkeypatch.setattr(probes.shutil, "which", lambda *a, **k: "/usr/bin/bwrap")


def _answers(monkeypatch, outcomes: list):
    """subprocess.run answering each call with the next of ``outcomes`` (an exit code, or an
    exception raised)."""
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return subprocess.CompletedProcess(argv, outcome, b"", b"")

    monkeypatch.setattr(probes.subprocess, "run", run)
    return calls


@pytest.mark.parametrize("probe", [probes.bwrap_works, probes.user_namespace_works])
def test_a_probe_that_times_out_keeps_the_isolation_and_asks_again(fresh_answers, monkeypatch, probe):
    calls = _answers(monkeypatch, [subprocess.TimeoutExpired("bwrap", 20), 1, 0])
    assert probe() is True  # busy: the sandbox stays
    assert probe() is False  # asked again: this machine's real answer, now kept
    assert probe() is False
    assert len(calls) == 2


@pytest.mark.parametrize("probe", [probes.bwrap_works, probes.user_namespace_works])
def test_a_probe_that_cannot_run_says_no(fresh_answers, monkeypatch, probe):
    _answers(monkeypatch, [OSError("no such file")])
    assert probe() is False
