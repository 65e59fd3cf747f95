"""The one typed job spec that crosses every boundary: CLI, UI, database, worker.

A `JobSpec` is parsed once at the edge (YAML, JSON, form values) and then passed around
as-is. Its fields are declared, section by section, in `jobs.spec.sections`, each with its help
text, form group and bounds next to it; `jobs.spec.parse` reads raw values into them and
`jobs.spec.rules` checks the combinations. This module holds the class that joins them:
building, serialising, replacing and validating a spec.

    spec = JobSpec.from_yaml(Path("examples/smollm2-tag-format.yaml").read_text())
    problems = spec.problems()      # [] when the spec is valid on its own
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

import yaml

from jobs.errors import Problem, ProblemError
from jobs.spec import rules
from jobs.spec.field import plain
from jobs.spec.parse import parse_values
from jobs.spec.sections import SpecFields


class SpecError(ProblemError):
    """Raised with every problem of a spec at once."""

    subject = "in the job spec"


@dataclass(frozen=True)
class JobSpec(SpecFields):
    """A fine-tuning job: model, data, method, memory tricks and hyper-parameters."""

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """Build a spec from plain data; raises SpecError listing every problem."""
        if not isinstance(data, dict):
            raise SpecError(
                [
                    Problem(
                        "spec",
                        f"expected a mapping of field names to values, got {type(data).__name__}",
                        "write the spec as `field: value` lines (see examples/)",
                    )
                ]
            )
        values, problems = parse_values(cls, data)
        # `values` holds only known fields, each already of its type, so the spec builds even when
        # other keys failed (those keep their defaults): its range and combination problems are
        # reported too, except for a field already reported for its value.
        spec = cls(**values)
        reported = {p.field for p in problems}
        problems.extend(p for p in spec.problems() if p.field not in reported)
        if problems:
            raise SpecError(problems)
        return spec

    @classmethod
    def from_yaml(cls, text: str) -> JobSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(
                [Problem("spec", f"not valid YAML ({exc})", "fix the YAML syntax at the line shown")]
            ) from exc
        return cls.from_dict(data if data is not None else {})

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError([Problem("spec", f"not valid JSON ({exc})", "fix the JSON syntax")]) from exc
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, **changes: Any) -> JobSpec:
        return JobSpec.from_dict({**self.to_dict(), **{k: plain(v) for k, v in changes.items()}})

    # ------------------------------------------------------------------ derived
    @property
    def display_name(self) -> str:
        return self.run_name or f"{self.model.rstrip('/').split('/')[-1]}-{self.method.value}-{self.trainer.value}"

    # ------------------------------------------------------------------ checks
    def problems(self) -> list[Problem]:
        """Everything wrong with this spec on its own (no file system, no device); see jobs.spec.rules."""
        return rules.problems(self)

    def validate(self) -> JobSpec:
        problems = self.problems()
        if problems:
            raise SpecError(problems)
        return self
