"""The suite's xdist scheduler (tests/scheduling.py): its units, its order and its cost table."""

from __future__ import annotations

import json
import re
from pathlib import Path

from scheduling import (
    DEFAULT_SECONDS,
    SHARED,
    SHARED_FILES,
    SHARED_FIXTURES,
    TABLE,
    file_seconds_from_junit,
    scope_of,
    shuffled,
    unit_seconds,
)

ROOT = Path(__file__).resolve().parent.parent


def test_the_files_that_read_a_shared_fixture_are_the_shared_unit() -> None:
    readers: set[str] = set()
    for fixture in SHARED_FIXTURES:
        found = {
            f"tests/{p.name}"
            for p in (ROOT / "tests").glob("test_*.py")
            if re.search(rf"def \w+\([^)]*\b{fixture}\b", p.read_text())  # a test or fixture asks for it
        }
        assert found, f"no test file reads {fixture}: drop it from SHARED_FIXTURES"
        readers |= found
    assert readers == set(SHARED_FILES), (
        f"files reading {SHARED_FIXTURES}: {sorted(readers)}; SHARED_FILES lists {sorted(SHARED_FILES)}"
    )


def test_a_test_is_scheduled_with_its_file_or_its_group() -> None:
    assert scope_of("tests/test_store.py::test_x[sqlite]") == "tests/test_store.py"
    assert scope_of("tests/test_store.py::TestRuns::test_y") == "tests/test_store.py"
    assert scope_of("tests/test_gguf_export.py::test_q8") == SHARED
    assert scope_of("tests/test_chat.py::test_a") == SHARED


def test_a_group_costs_its_files_summed_and_an_unknown_file_the_default() -> None:
    table = {"tests/test_smollm2.py": 100.0, "tests/test_chat_browser.py": 50.0, "tests/test_a.py": 7.0}
    seconds = unit_seconds([SHARED, "tests/test_a.py", "tests/test_new.py"], table)
    assert seconds["tests/test_a.py"] == 7.0
    assert seconds["tests/test_new.py"] == DEFAULT_SECONDS
    assert seconds[SHARED] == 150.0 + (len(SHARED_FILES) - 2) * DEFAULT_SECONDS  # the others are not in this table


def test_the_table_is_made_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "j.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="t1" time="1.5"/>'
        '<testcase classname="tests.test_a" name="t2" time="2.0"/>'
        '<testcase classname="tests.test_b.TestX" name="t3" time="4.25"/>'
        "</testsuite></testsuites>"
    )
    assert file_seconds_from_junit(report) == {"tests/test_a.py": 3.5, "tests/test_b.py": 4.2}


def test_the_committed_table_names_only_files_that_exist() -> None:
    table = json.loads(TABLE.read_text())
    missing = [f for f in table if not (ROOT / f).is_file()]
    assert not missing, (
        f"tests/file_seconds.json names files that are gone: {missing}; refresh it (tests/scheduling.py)"
    )
    assert all(isinstance(v, (int, float)) and v >= 0 for v in table.values())


def test_a_shuffled_run_keeps_its_seeds_order() -> None:
    class Options:
        def __init__(self, **given: object) -> None:
            self.given = given

        def getoption(self, name: str, default: object = None) -> object:
            return self.given.get(name, default)

    assert not shuffled(Options(random_order_bucket="default:module", random_order_seed="default:123"))
    assert not shuffled(Options())
    assert shuffled(Options(random_order_bucket="module", random_order_seed="default:123"))
    assert shuffled(Options(random_order_seed="42"))
    assert shuffled(Options(random_order_enabled=True))
