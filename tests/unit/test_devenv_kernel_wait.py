"""A dev environment nobody opens ends instead of holding its node (nodeside/devenv_kernel.py rule 2)."""

from __future__ import annotations

from ma_jupyter.nodeside import devenv_kernel


def test_a_dev_environment_nobody_attaches_to_ends_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MA_DEVENV_KERNEL_DIR", str(tmp_path))
    monkeypatch.setattr(devenv_kernel, "ATTACH_TIMEOUT", 0.3)
    assert devenv_kernel.main() == 0
    out = capsys.readouterr().out
    assert "waiting for a notebook to attach" in out and "no notebook attached" in out
    assert "opening a notebook with its kernel starts a new one" in out
