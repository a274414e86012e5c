"""The suite's own schedule (``tests/fixtures/durations.py``, used by ``tests/conftest.py``'s
xdist scheduler): scopes, the Ray groups and the longest-first order, from the checked-in table."""

from __future__ import annotations

import json

import pytest

from tests.fixtures import durations
from tests.fixtures.durations import PER_TEST, TABLE, Plan, load_table, merge, ray_group_count, scope_of


@pytest.fixture(autouse=True)
def two_ray_groups_at_most(monkeypatch):
    """The default (``MA_TEST_RAY_GROUPS`` unset), whatever the environment of this run says."""
    monkeypatch.setattr(durations, "MAX_RAY_GROUPS", 2)


RAY_IDS = [
    "tests/ray/test_a.py::test_1",
    "tests/ray/test_a.py::test_2",
    "tests/ray/test_b.py::test_1",
    "tests/ray/test_c.py::test_1",
    "tests/backends/test_contract.py::test_rule_1[ray]",
    "tests/backends/test_contract.py::test_rule_2[ray-2]",
]
LOCAL_IDS = [
    "tests/backends/test_contract.py::test_rule_1[local]",
    "tests/service/test_x.py::test_1",
    "tests/service/test_x.py::Cls::test_2",
    "tests/unit/test_y.py::test_1",
]


def test_a_scope_is_a_module_and_the_contract_suites_ray_tests_are_a_scope_of_their_own():
    assert scope_of("tests/service/test_x.py::Cls::test_2") == "tests/service/test_x.py"
    assert scope_of("tests/ray/test_a.py::test_1") == "tests/ray/test_a.py"
    assert (
        scope_of("tests/backends/test_contract.py::test_rule_2[ray-2]")
        == "tests/backends/test_contract.py[ray]"
    )
    assert (
        scope_of("tests/backends/test_contract.py::test_rule_1[local]") == "tests/backends/test_contract.py"
    )


def test_the_ray_tests_split_by_whole_modules_into_two_groups_of_about_equal_time():
    table = {
        "tests/ray/test_a.py": 300.0,
        "tests/ray/test_b.py": 200.0,
        "tests/ray/test_c.py": 90.0,
        "tests/backends/test_contract.py[ray]": 100.0,
    }
    plan = Plan(RAY_IDS + LOCAL_IDS, table, ray_group_count(2))
    # longest first to the least loaded group: a=300 | b=200, contract=100 (300), then c to a
    assert plan.group_of == {
        "tests/ray/test_a.py": 0,
        "tests/ray/test_b.py": 1,
        "tests/backends/test_contract.py[ray]": 1,
        "tests/ray/test_c.py": 0,
    }
    scopes = {plan.scheduler_scope(n) for n in RAY_IDS}
    assert scopes == {"tests/ray#0", "tests/ray#1"}
    assert plan.scheduler_scope("tests/ray/test_a.py::test_2") == "tests/ray#0"
    assert plan.scheduler_scope("tests/backends/test_contract.py::test_rule_2[ray-2]") == "tests/ray#1"
    assert plan.scope_seconds("tests/ray#0") == 390.0 and plan.scope_seconds("tests/ray#1") == 300.0
    # a module's tests never leave their module's scope; the local contract tests stay apart
    assert plan.scheduler_scope("tests/service/test_x.py::Cls::test_2") == "tests/service/test_x.py"
    assert (
        plan.scheduler_scope("tests/backends/test_contract.py::test_rule_1[local]")
        == "tests/backends/test_contract.py"
    )


def test_without_xdist_every_ray_test_is_in_one_group_and_never_more_than_two():
    plan = Plan(RAY_IDS, {}, ray_group_count(0))
    assert set(plan.group_of.values()) == {0}
    assert ray_group_count(1) == 1 and ray_group_count(2) == 2 and ray_group_count(8) == 2


def test_a_scope_missing_from_the_table_is_estimated_by_its_number_of_tests():
    plan = Plan(LOCAL_IDS, {"tests/unit/test_y.py": 42.0}, 2)
    assert plan.scope_seconds("tests/unit/test_y.py") == 42.0
    assert plan.scope_seconds("tests/service/test_x.py") == 2 * PER_TEST


def test_merging_a_run_updates_what_it_measured_and_drops_modules_that_are_gone():
    table = {"tests/unit/test_suite_schedule.py": 1.0, "tests/unit/test_gone_long_ago.py": 9.0}
    measured = {"tests/backends/test_contract.py[ray]": 77.0, "tests/unit/test_suite_schedule.py": 2.0}
    assert merge(table, measured) == {
        "tests/backends/test_contract.py[ray]": 77.0,
        "tests/unit/test_suite_schedule.py": 2.0,
    }


def test_the_checked_in_table_names_only_modules_that_exist():
    table = load_table()
    assert table, f"{TABLE} is missing or empty: ./dev durations makes it"
    assert json.loads(TABLE.read_text()) == merge(table, {}), "stale entries: run ./dev durations"
