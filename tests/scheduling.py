"""How `./dev.sh test` shares the suite between its xdist workers: by file, costliest first.

xdist's `--dist loadfile` hands each worker whole test files, so a module fixture (a server, a trained run) is built
once. This scheduler refines it in two ways:

- The files that read an expensive *session* fixture (`SHARED_FIXTURES`) are one unit (`SHARED_FILES`), so each is
  built by one worker only: the SmolLM2 run (about four minutes of training and scoring) would otherwise be trained
  by both.
- Units go out costliest first (`tests/file_seconds.json`, seconds per file measured on a full two-worker run), the
  longest-processing-time-first rule: the long units overlap at the start and the cheap files fill the end, so both
  workers finish close together. A file missing from the table counts as `DEFAULT_SECONDS`. A run shuffled by
  pytest-random-order (`./dev.sh test --loaded`) keeps its seed's order instead.

The table only orders work; a stale one costs minutes, never a result. Refresh it after a full run with
`--junitxml=J.xml`: `.venv/bin/python tests/scheduling.py J.xml`.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol

import pytest
from xdist.scheduler import LoadFileScheduling

TABLE = Path(__file__).with_name("file_seconds.json")
DEFAULT_SECONDS = 5.0

# The session fixtures costly enough to build once per run, not once per worker (conftest): the SmolLM2 run (about
# four minutes of training and scoring) and the tag-format runs (half a minute). The files that read them, one unit.
SHARED_FIXTURES = ("smollm2_run", "tag_home", "tag_store")
SHARED = "session runs"
SHARED_FILES = (
    "tests/test_smollm2.py",
    "tests/test_chat_browser.py",
    "tests/test_gguf_export.py",
    "tests/test_chat_service.py",
    "tests/test_mcp.py",
    "tests/test_preferences.py",
    "tests/test_split_browser.py",
    "tests/test_benchmarks.py",
    "tests/test_chat.py",
    "tests/test_export.py",
    "tests/test_judge.py",
    "tests/test_openai_api.py",
)


def scope_of(nodeid: str) -> str:
    """The unit a test is scheduled with: its file, or `SHARED` for the files that read the shared fixtures."""
    path = nodeid.split("::", 1)[0]
    return SHARED if path in SHARED_FILES else path


def unit_seconds(scopes: list[str], table: dict[str, float]) -> dict[str, float]:
    """Each unit's expected seconds: its files' measured seconds summed."""
    seconds: dict[str, float] = {}
    for scope in scopes:
        files = SHARED_FILES if scope == SHARED else (scope,)
        seconds[scope] = sum(table.get(f, DEFAULT_SECONDS) for f in files)
    return seconds


def load_table(path: Path = TABLE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


class Options(Protocol):
    def getoption(self, name: str, default: Any = ...) -> Any: ...


def shuffled(config: Options) -> bool:
    """Whether pytest-random-order shuffles this run (`./dev.sh test --loaded`): its seed's module order is kept."""
    if config.getoption("random_order_enabled", False):
        return True
    return any(
        not str(config.getoption(name, "default:")).startswith("default:")
        for name in ("random_order_bucket", "random_order_seed")
    )


class CostliestFirst(LoadFileScheduling):
    """`loadfile` with the `SHARED_FILES` as one unit, handed out costliest first (in a shuffled run, in the shuffled
    order)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._ordered = shuffled(config)

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the first assignment: the collection is in, the queue is whole
            seconds = unit_seconds(list(self.workqueue), load_table())
            for scope in sorted(self.workqueue, key=lambda s: seconds[s]):
                self.workqueue.move_to_end(scope, last=False)
            self._ordered = True
        super()._assign_work_unit(node)


def file_seconds_from_junit(report: Path) -> dict[str, float]:
    """Seconds per test file from a JUnit XML report (`pytest --junitxml`)."""
    import xml.etree.ElementTree as ET

    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is "tests.test_x" or "tests.test_x.TestClass"
        depth = next((i for i, part in enumerate(module) if part.startswith("test_")), len(module) - 1)
        seconds["/".join(module[: depth + 1]) + ".py"] += float(case.get("time", "0"))
    return {f: round(s, 1) for f, s in sorted(seconds.items())}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/scheduling.py REPORT.xml  (a --junitxml report of a full run)")
    TABLE.write_text(json.dumps(file_seconds_from_junit(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {TABLE}")
