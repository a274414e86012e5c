"""``./dev`` without a known command prints its usage: the comment block under the shebang."""

import subprocess
from pathlib import Path

DEV = Path(__file__).resolve().parents[2] / "dev"


def test_dev_without_a_command_prints_its_usage_and_no_code():
    out = subprocess.run([str(DEV)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "./dev lab" in out.stdout and "./dev setup" in out.stdout
    assert "set -euo pipefail" not in out.stdout
    assert not any(line.startswith("#") for line in out.stdout.splitlines())
