"""An in-process IPython shell with the extension loaded, and what one cell did (shared by the
magics' tests); the shell itself is the ``ma_shell`` fixture of tests/conftest.py."""

from __future__ import annotations

from IPython.utils.capture import capture_output

LINE_MAGICS = [
    "ma_jobs",
    "ma_logs",
    "ma_events",
    "ma_top",
    "ma_stop",
    "ma_delete",
    "ma_update",
    "ma_devenv",
    "ma_algorithms",
    "ma_clone",
    "ma_specs",
    "ma_cluster",
    "ma_tensorboard",
    "ma_shell",
    "ma_attach",
]


class Run:
    """What one cell did: its result, stdout, stderr and display outputs."""

    def __init__(self, shell, code: str):
        with capture_output() as cap:
            self.result = shell.run_cell(code)
        self.stdout = cap.stdout
        self.stderr = cap.stderr
        self.outputs = cap.outputs
        self.error = self.result.error_in_exec or self.result.error_before_exec

    def job_text(self) -> str:
        """The final text of the live job output (the last update of the display handle)."""
        texts = [o.data["text/plain"] for o in self.outputs if (o.metadata or {}).get("ma_jupyter")]
        assert texts, f"no job output; stdout={self.stdout!r} stderr={self.stderr!r}"
        return texts[-1]

    def job_metadata(self) -> dict:
        return [o.metadata for o in self.outputs if (o.metadata or {}).get("ma_jupyter")][-1]["ma_jupyter"]

    def text(self) -> str:
        return self.stdout + "".join(o.data.get("text/plain", "") for o in self.outputs)


def one_line_error(run: Run) -> str:
    """The single line a failing magic printed (UsageError on stderr, typed errors on stdout)."""
    shown = (run.stderr + run.stdout).strip()
    assert run.error is not None, "the cell should have failed"
    assert "Traceback" not in shown, shown
    assert len(shown.splitlines()) == 1, shown
    return shown
