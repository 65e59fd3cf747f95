"""Whether the packages a spec's memory tricks need are installed (`jobs.spec.tricks.registry.package_problems`).

Looked up in this interpreter, which is the training child's on a one-machine install; a remote worker
with other packages refuses the same way when its child starts (the library's ImportError).

    problems = missing_package_problems(spec, facts.device())
"""

from __future__ import annotations

import importlib.util

from jobs.devices.facts import Device
from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.tricks.registry import needed_modules, package_modules, package_problems


def installed_modules() -> frozenset[str]:
    """The trick packages' modules importable here (for the presets' device tricks)."""
    return frozenset(n for n in package_modules() if importlib.util.find_spec(n) is not None)


def missing_package_problems(spec: JobSpec, device: Device) -> list[Problem]:
    """One problem per trick whose package is not importable here."""
    missing = frozenset(req for module, req in needed_modules(spec).items() if importlib.util.find_spec(module) is None)
    return package_problems(spec, device, missing) if missing else []
