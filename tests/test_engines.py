"""A missing engine skips its tier on a developer's machine and fails it under CI=true (tests/engines.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from engines import engine_missing, import_or_missing, on_ci

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("1", True), ("", False), ("false", False), ("0", False)])
def test_ci_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, ci: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert on_ci() is ci


def test_a_missing_engine_skips_here_and_fails_on_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="initdb not found"):
        engine_missing("initdb not found")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="initdb not found. CI=true: a missing engine fails its tier"):
        engine_missing("initdb not found")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_here cannot be imported"):
        import_or_missing("no_such_module_here")


ENGINES = re.compile(r"chromium|playwright|postgres|initdb|slurm|munge|docker-compose|\bray\b", re.I)


def test_every_engine_skip_goes_through_the_helper() -> None:
    """A new test module cannot skip quietly on CI for want of an engine: it must call tests/engines.py."""
    quiet = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("engines.py", "test_engines.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            skips = "pytest.skip(" in line or "importorskip(" in line or "skipif(" in line
            if skips and ENGINES.search(line):
                quiet.append(f"{path.name}:{number}: {line.strip()}")
    assert not quiet, "skip through engines.engine_missing/import_or_missing instead:\n" + "\n".join(quiet)
