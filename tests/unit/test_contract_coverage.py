"""Every rule of the backend contract (``Backend``'s docstring in ``backends/base.py``) is checked
on both backends by the contract suite ``tests/backends/``, or listed in :data:`TESTED_ELSEWHERE`
with where it is tested and why not there.

A test of the suite cites the rules it checks in its name (``test_rules_3_4_..._what``,
``test_rule_8_what``).  The list only shrinks: a listed rule that the suite cites is an error,
so a rule moved into the suite leaves the list in the same change.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1] / "backends"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

#: rules not checked by tests/backends, each with where it is tested and why not in the suite
TESTED_ELSEWHERE = {
    10: "threads: concurrent calls for different jobs are what the service's load and race tests "
    "do (service/test_load.py, service/test_supervisor_races.py); a contract test of it would be "
    "a timing test",
    13: "caches: a job must fill a cache first (a pip or model download inside the node); "
    "service/test_workdir_cache.py and ray/test_ray_jobs.py (caches on the Ray nodes) through a service",
    19: "debug terminal: the local backend's node with the shell agent (service/test_debug_terminal.py); "
    "the Ray backend keeps the default (409), nothing to run",
    20: "outputs reader: the job's TensorBoard, confined (service/test_tensorboard_confined.py, "
    "ray/test_ray_jobs.py's TensorBoard test) through a service, which decides what runs",
    21: "datasets: the copy as the job's account, with a hostile dataset (service/test_prepared_data.py); "
    "both backends use the same node machinery on the service's machine",
    23: "notices: only a lost Ray node's next agent sends one (ray/test_ray_lost_host.py); two hosts "
    "and a killed raylet, not a contract test's budget",
    24: "kernel route: a dev environment's kernel through a client (service/test_devenv_kernel.py, "
    "ray/test_ray_devenv.py)",
    28: "network check: a probe must be made to fail twice in a row to see its fault (a drop rule "
    "in a node's namespace): service/test_node_inspection.py (local), ray/test_ray_node_checks.py "
    "(an nftables rule dropping a Ray host's overlay frames)",
    30: "outputs carried to a resumed attempt's machines: only a Ray node that does not share the "
    "service's folder has anything to carry, so a second attempt on another Ray node "
    "(ray/test_ray_jobs.py's DDP test restarts after a checkpoint), the copy's rules against a "
    "real agent object (unit/test_ray_outputs_seed.py) and the launch through data preparation "
    "off the lock (service/test_supervisor_policies.py); the local backend keeps the default",
}


def contract_rules() -> dict[int, str]:
    from ma_jupyter.backends.base import Backend

    return {
        int(n): title for n, title in re.findall(r"^    (\d+)\. \*\*(.+?)\*\*", Backend.__doc__ or "", re.M)
    }


def cited_rules() -> dict[int, list[str]]:
    """Rule -> the suite's tests whose name cites it."""
    cited: dict[int, list[str]] = {}
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            for numbers in re.findall(r"rules?((?:_\d+)+)", node.name):
                for number in numbers.strip("_").split("_"):
                    cited.setdefault(int(number), []).append(f"{path.name}::{node.name}")
    return cited


def test_every_contract_rule_is_checked_by_the_suite_or_listed_with_where_it_is_tested():
    rules = contract_rules()
    assert len(rules) >= 29, rules
    cited = cited_rules()
    assert set(cited) <= set(rules), (
        f"the suite cites rules the contract lacks: {sorted(set(cited) - set(rules))}"
    )
    missing = {n: rules[n] for n in rules if n not in cited and n not in TESTED_ELSEWHERE}
    assert not missing, f"contract rules neither tested in tests/backends/ nor listed here: {missing}"
    both = sorted(set(cited) & set(TESTED_ELSEWHERE))
    assert not both, f"rules the suite now checks: remove them from TESTED_ELSEWHERE: {both}"
    assert set(TESTED_ELSEWHERE) <= set(rules)
    # docs/architecture.md names the same rules
    said = re.search(r"the rules it\s+does not check \(([\d, ]+)\)", ARCHITECTURE.read_text())
    assert said is not None and [int(n) for n in said.group(1).split(",")] == sorted(TESTED_ELSEWHERE)


def test_the_suites_tests_run_on_every_backend():
    """Each test of the suite takes the ``backend`` fixture (so it runs on the local and the Ray
    backend) and cites at least one rule."""
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                assert "backend" in [a.arg for a in node.args.args], f"{path.name}::{node.name}"
                assert re.search(r"rules?_\d", node.name), f"{path.name}::{node.name} cites no rule"


def test_the_suites_ray_tests_share_the_ray_tests_worker():
    """``tests/conftest.py``'s xdist scheduler puts every Ray test in one worker (one inner run,
    one Ray cluster): those of ``tests/ray/`` and the suite's on the Ray backend, not its local ones."""
    from tests.fixtures.ray_netns import is_ray_test

    assert is_ray_test("tests/ray/test_ray_jobs.py::test_a_job")
    assert is_ray_test("tests/backends/test_contract.py::test_rule_8_stop[ray]")
    assert is_ray_test("tests/backends/test_contract.py::test_rule_8_stop[ray-2]")
    assert not is_ray_test("tests/backends/test_contract.py::test_rule_8_stop[local]")
    assert not is_ray_test("tests/backends/test_contract.py::test_rule_29_by_the_ray_backend[local]")
    assert not is_ray_test("tests/service/test_queue.py::test_x[ray]")
