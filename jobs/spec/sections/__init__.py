"""The job spec's fields, one frozen dataclass per section, and `SpecFields`: all of them, in order.

The YAML/JSON stays flat: each section only groups the declarations, and `SpecFields` (which
`jobs.spec.job.JobSpec` extends with parsing and checks) has every field under its own name. Its
field order is the order of the form and the README table.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.sections.memory import MemoryFields
from jobs.spec.sections.method import MethodFields, QuantFields
from jobs.spec.sections.model_data import ModelDataFields
from jobs.spec.sections.run import RunFields
from jobs.spec.sections.trainers import TrainerFields
from jobs.spec.sections.training import TrainingFields


# A dataclass collects its bases' fields from the last base to the first, so the sections are
# listed here last to first: the fields run model/data, method, trainer options, 4-bit base,
# memory, training, run.
@dataclass(frozen=True)
class SpecFields(RunFields, TrainingFields, MemoryFields, QuantFields, TrainerFields, MethodFields, ModelDataFields):
    """Every field of a job spec, section after section."""
