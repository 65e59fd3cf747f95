"""A tier whose engine is missing skips on a developer's machine and fails on CI.

    engine_missing("PostgreSQL server binaries not found: ...")   # skip here; under CI=true, fail
    import_or_missing("playwright.sync_api")                      # pytest.importorskip, the same way

A CI that lost Chromium, PostgreSQL, Slurm, docker-compose or Ray would otherwise pass with a tier
quietly skipped. `./dev.sh test` installs them all when run as root; CI sets CI=true (GitHub Actions,
GitLab and most others do).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, NoReturn

import pytest

FALSE = ("", "0", "false", "no", "off")


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in FALSE


def engine_missing(why: str, *, module_level: bool = False) -> NoReturn:
    """Skip (a developer's machine) or fail (CI) the test, fixture or module that needs the missing engine."""
    if on_ci():
        pytest.fail(f"{why}. CI=true: a missing engine fails its tier instead of skipping it", pytrace=False)
    pytest.skip(why, allow_module_level=module_level)


def import_or_missing(module: str, fix: str = "pip install -e '.[test]'") -> Any:
    """`pytest.importorskip` that fails under CI: the module, imported."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        engine_missing(f"{module} cannot be imported ({exc}): {fix}", module_level=True)
