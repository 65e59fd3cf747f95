"""A job spec's YAML text as plain values for the one check (`jobs.checks.pipeline.check`), shared by the API's
endpoints and the MCP tools.
"""

from __future__ import annotations

from typing import Any

from jobs.spec.job import JobSpec


def spec_values(spec_yaml: str) -> Any:
    """The YAML text as plain values for the checks (which parse them, reporting every problem at once);
    SpecError when it is not YAML at all."""
    import yaml

    try:
        data = yaml.safe_load(spec_yaml or "")
    except yaml.YAMLError:
        JobSpec.from_yaml(spec_yaml)  # raises the spec's own SpecError naming the line
        raise
    return {} if data is None else data
