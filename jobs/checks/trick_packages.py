"""Whether the packages a spec's memory tricks need are installed (`jobs.spec.tricks.registry.package_problems`),
and vLLM's when the spec generates with it (`jobs.config.vllm.vllm_package_problems`).

Looked up in this interpreter, which is the training child's on a one-machine install; a remote worker
with other packages refuses the same way when its child starts (the library's ImportError).

    problems = missing_package_problems(spec, facts.device())
"""

from __future__ import annotations

import importlib.util

from jobs.config import vllm
from jobs.devices.facts import Device
from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.tricks.registry import needed_modules, package_modules, package_problems


def installed_modules() -> frozenset[str]:
    """The trick packages' modules importable here (for the presets' device tricks)."""
    return frozenset(n for n in package_modules() if importlib.util.find_spec(n) is not None)


def missing_package_problems(spec: JobSpec, device: Device) -> list[Problem]:
    """One problem per trick whose package is not importable here, and one for use_vllm without vllm."""
    missing = frozenset(req for module, req in needed_modules(spec).items() if importlib.util.find_spec(module) is None)
    found = package_problems(spec, device, missing) if missing else []
    if spec.use_vllm:  # found, not imported: importing vllm takes seconds and initialises CUDA
        found += vllm.vllm_package_problems(spec, device, importlib.util.find_spec(vllm.MODULE) is not None)
    return found
