"""The sandbox probes' rule for a probe that does not answer in time (nodehost/probes.py rule 3):
a loaded machine never makes the service isolate less; and a busy machine's mounts coming and
going never make a probe answer no."""

from __future__ import annotations

import shutil
import subprocess
import threading

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


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_the_probes_answer_yes_while_other_jobs_namespace_files_come_and_go(tmp_path):
    """Other attempts' network namespaces are bind mounts that exist only while each starts: a
    sandbox bound from ``/`` failed now and then when one went away during bubblewrap's start (5
    of 400 probes here), and a service then ran every later node without its sandbox.  The
    probes' sandboxes see only the system's folders."""
    from ma_jupyter.nodehost import bwrap, network

    if not network.namespaces_supported():
        pytest.skip("making network namespaces needs root")
    folder = tmp_path / "netns"
    folder.mkdir(mode=0o700)
    done = threading.Event()

    def churn() -> None:  # what a busy machine's attempts do to their namespace files
        k = 0
        while not done.is_set():
            path = folder / f"attempt-{k % 4}"
            network.make_namespace(path)
            network.remove_namespace(path)
            k += 1

    churning = threading.Thread(target=churn, daemon=True)
    churning.start()
    try:
        found = []
        for argv in [bwrap.namespaces_probe_argv(shutil.which("bwrap"))] * 300:
            done_probe = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            if done_probe.returncode != 0:
                found.append(done_probe.stderr.strip())
    finally:
        done.set()
        churning.join(30)
    assert found == [], found
    for argv in (bwrap.namespaces_probe_argv(), bwrap.user_namespace_probe_argv("bwrap")):
        assert ["--ro-bind", "/", "/"] not in [argv[i : i + 3] for i in range(len(argv))], argv
