"""The memory step of the checks: the predicted peak of a spec on the device it will meet.

The model's architecture is read once (`jobs.memory.model_config.arch_with_source`: its config,
never its weights) and the prediction made once (`jobs.memory.predict.predict`); the pipeline keeps
both for the later steps (the method checks read the layer shapes, submit saves the prediction) and
the form's panel and `tunedeck plan` show the same object. No error is swallowed here: a predictor
bug fails the check instead of becoming "no prediction".

    memory = predict_memory(spec, facts)     # Memory(prediction or None, arch or None, source)

The verdict as a problem, and the cheapest change that fits, are the pipeline's
(`jobs.checks.pipeline.memory_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobs.devices.facts import DeviceFacts
from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.memory.parts import Arch
    from jobs.memory.predict import Prediction


@dataclass(frozen=True)
class Memory:
    """The memory facts of one spec on one device."""

    prediction: Prediction | None  # None: no readable config.json for the model here
    arch: Arch | None
    source: str  # where the architecture came from ("" when unknown)

    @property
    def shape(self) -> Any:
        """The model's layer shapes (`jobs.memory.shape.ModelShape`), or None."""
        return self.arch.shape if self.arch is not None else None


NO_MEMORY = Memory(None, None, "")


def model_arch(model: str) -> tuple[Any, str]:
    """(the model's Arch, where its config came from), or (None, "")."""
    from jobs.memory.model_config import arch_with_source

    return arch_with_source(model)


def predict_memory(spec: JobSpec, facts: DeviceFacts, arch: tuple[Any, str] | None = None) -> Memory:
    """The spec's predicted peak on `facts`; `arch`: the model's (Arch, source) when already read."""
    from jobs.memory.predict import predict

    found, source = arch if arch is not None else model_arch(spec.model)
    if found is None:
        return NO_MEMORY
    return Memory(predict(spec, found, facts), found, source)
