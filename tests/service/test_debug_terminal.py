"""The debug terminal of a running node: a shell inside the node's own sandbox, driven through a
real PTY (the agent's attach client on a pexpect terminal)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pexpect
import pytest

from ma_jupyter.backends.local import LocalBackend
from tests.helpers import wait_for
from tests.service.test_local_backend import log_of, make_attempt, marked, start

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")


def _secret(attempt, node: str = "worker-0") -> str:
    spec = json.loads(attempt.jobdir.node(node).runner_spec.read_text())
    return (spec.get("job_env") or spec["env"])["MA_JOB_SECRET"]


def _agents(job_id: str) -> list:
    """The live shell agents (and the bwrap wrapping them) of one job."""
    return [p for p in marked(job_id) if "ma_jupyter.backends.local.shell_agent" in p.cmdline()]


def _attach(job_id: str, secret: str, node: str = "worker-0") -> pexpect.spawn:
    return pexpect.spawn(
        sys.executable,
        ["-m", "ma_jupyter.backends.local.shell_agent", "--attach", "--job", job_id, "--node", node],
        env={**os.environ, "PYTHONPATH": str(ROOT), "MA_JOB_SECRET": secret},
        timeout=120,
        dimensions=(30, 100),
    )


def test_shell_inside_a_running_node(ma_home, ma_root_jobs, tmp_path):
    host_only = tmp_path / f"host-only-{time.time_ns()}"
    host_only.write_text("the host's own file")
    script = """
        import os, time
        open('left-by-job.txt', 'w').write('x')
        print('job running', flush=True)
        time.sleep(600)
    """
    job_id = f"dbg-{os.getpid()}-{time.time_ns() % 100000}"
    attempt = make_attempt(ma_home, job_id, script, debug_terminal=True)
    backend = LocalBackend(sandbox="bubblewrap")
    runs = start(backend, attempt)
    try:
        wait_for(
            lambda: "job running" in log_of(attempt) and "debug terminal ready" in log_of(attempt),
            timeout=120,
        )
        child = _attach(job_id, _secret(attempt))
        child.expect(r"[#$] ")  # the shell's prompt: it reads the terminal now
        child.sendline(
            f"pwd; id -u; ls /workspace; ls; echo JOB-$MA_JOB_ID; "
            f"ls {host_only} 2>/dev/null || echo HOST-FILE-$((1+1))-ABSENT; echo END-$((2+3))"
        )
        child.expect("END-5")  # typed as END-$((2+3)): never matches the echoed command line
        answers = child.before.decode(errors="replace")
        child.sendline("exit 3")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 3  # the shell's exit status is the client's
        assert f"JOB-{job_id}" in answers  # the node's environment
        assert "HOST-FILE-2-ABSENT" in answers  # the sandbox's filesystem, not the host's
        assert "left-by-job.txt" in answers  # the files the job wrote, in its working directory
        assert "\n/workspace/" in answers.replace("\r", "")  # pwd: inside the node's view
        refused = _attach(job_id, "wrong")
        refused.expect("refused")
        refused.expect(pexpect.EOF)
        refused.close()
        assert refused.exitstatus == 255
        assert _agents(job_id)  # the agent runs while the node does
    finally:
        backend.stop(attempt, runs, 2.0)
    # the node's end ends its debug terminal: no agent, no shell left
    wait_for(lambda: not _agents(job_id) and not marked(job_id), timeout=60)


def test_no_debug_terminal_without_a_sandbox(ma_home, ma_root_jobs):
    job_id = f"dbg-sym-{os.getpid()}-{time.time_ns() % 100000}"
    attempt = make_attempt(ma_home, job_id, "print('done', flush=True)", debug_terminal=True)
    backend = LocalBackend(sandbox="symlink")
    runs = start(backend, attempt)
    wait_for(lambda: all(backend.poll(attempt, r).state != "running" for r in runs), timeout=120)
    spec = json.loads(attempt.jobdir.node("worker-0").runner_spec.read_text())
    assert spec["shell_agent"] is None
    assert "debug terminal ready" not in log_of(attempt)
