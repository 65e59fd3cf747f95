"""The GPU types a cluster offers, and the one each run asks for: the smallest whose memory holds its
predicted peak.

    types = parse_gpu_types("t4=16GiB@7.5,a100=80GiB")  # [GpuType("t4", 16 GiB, "7.5"), GpuType("a100", 80 GiB)]
    pick(types, 21 * 2**30)     # Pick(GpuType("a100", ...), "predicted 21.0 GiB; t4 (16.0 GiB) leaves too little")
    facts_of(types)             # DeviceFacts of the largest: what the dispatcher publishes for the checks

`tunedeck worker --executor slurm|ray --gpu-type` takes either one type without a size (every run asks
for it, as `--gres=gpu:a100:1`) or sized types, `NAME=SIZE[@COMPUTE]` (compute capability, default 8.0:
bf16). With sizes, the dispatcher publishes the largest type as its device, so `tunedeck submit`, `plan`
and the form predict and check against a GPU of the cluster rather than the dashboard's own machine, and
each run is submitted for the smallest type that keeps the planner's margin free (`MARGIN`, as its fit
verdict). A prediction saved on a CPU (submitted before the dispatcher published its GPU) is made
again for each type's GPU (`predicted_on`). A run with no figure at all, or predicted above every type
(queued with `ignore_memory_prediction`), asks for the largest.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from jobs.devices.facts import DeviceFacts
from jobs.errors import Problem, ProblemError
from jobs.memory.planner import MARGIN
from jobs.spec.job import JobSpec
from jobs.units import human_bytes, parse_bytes

FLAG = "--gpu-type"
_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
_COMPUTE = re.compile(r"^[0-9]+\.[0-9]+$")
DEFAULT_COMPUTE = "8.0"  # Ampere: bf16


class GpuTypeError(ProblemError):
    subject = "in --gpu-type"


@dataclass(frozen=True)
class GpuType:
    name: str  # the engine's name for it: a Slurm gres type, a Ray accelerator_type
    total_bytes: int | None = None  # None: one type asked for by name only
    compute_capability: str = DEFAULT_COMPUTE

    def __str__(self) -> str:
        return self.name if self.total_bytes is None else f"{self.name} ({human_bytes(self.total_bytes)})"


@dataclass(frozen=True)
class Pick:
    gpu: GpuType
    why: str | None  # how the prediction chose it (None: the only type there is)


def _one(item: str) -> tuple[str, GpuType | None, list[Problem]]:
    """(its name, the type or None, its problems)."""
    head, _, compute = item.partition("@")
    name, sized, size_text = head.partition("=")
    name, size_text, compute = name.strip(), size_text.strip(), compute.strip()
    found = []
    if not _NAME.match(name):
        found.append(Problem(FLAG, f"{name!r} is not a GPU type name", "letters, digits and _.:- only, e.g. a100"))
    size = parse_bytes(size_text) if sized else None
    if sized and size is None:
        found.append(Problem(FLAG, f"{item!r}: {size_text!r} is not a memory size", "write NAME=SIZE, e.g. a100=80GiB"))
    if compute and not _COMPUTE.match(compute):
        found.append(Problem(FLAG, f"{item!r}: {compute!r} is not a compute capability", "write e.g. t4=16GiB@7.5"))
    if compute and not sized:
        found.append(Problem(FLAG, f"{item!r} has a compute capability but no size", "write NAME=SIZE@COMPUTE"))
    return name, (GpuType(name, size, compute or DEFAULT_COMPUTE) if not found else None), found


def parse_gpu_types(text: str | None) -> list[GpuType]:
    """`--gpu-type`'s value -> the types, smallest first; GpuTypeError with every problem at once."""
    items = [i for i in (text or "").split(",") if i.strip()]
    types, found, names = [], [], []
    for item in items:
        name, gpu, problems = _one(item)
        names.append(name)
        found += problems
        if gpu is not None:
            types.append(gpu)
    if len(set(names)) < len(names):
        found.append(Problem(FLAG, f"a type is named twice in {text!r}", "name each GPU type once"))
    unsized = [t.name for t in types if t.total_bytes is None]
    if unsized and len(items) > 1:
        found.append(
            Problem(
                FLAG,
                f"{', '.join(unsized)} has no memory size, so runs cannot be sent to the type that fits them",
                "give every type its size (t4=16GiB,a100=80GiB), or name a single type",
            )
        )
    if found:
        raise GpuTypeError(found)
    return sorted(types, key=lambda t: t.total_bytes or 0)


def pick(types: list[GpuType], predicted: int | None, on: Callable[[GpuType], int | None] | None = None) -> Pick | None:
    """The type a run predicted to peak at `predicted` bytes asks for (None: no type, any GPU).

    `on(type)`: the run's peak predicted again for that type's GPU (a prediction saved on the CPU counts the
    CPU's fp32 and resident memory, more than a GPU needs); where it gives None, `predicted` stands."""
    if not types:
        return None
    largest = types[-1]
    if largest.total_bytes is None:
        return Pick(largest, None)
    need = {gpu.name: (on(gpu) if on is not None else None) or predicted for gpu in types}
    if not any(need.values()):
        return Pick(largest, "no memory prediction was saved with the run: the largest type")
    for i, gpu in enumerate(types):  # smallest first: every type before `gpu` was too small
        bytes_ = need[gpu.name]
        if bytes_ and bytes_ <= MARGIN * (gpu.total_bytes or 0):
            smaller = ", ".join(str(t) for t in types[:i])
            left = f"; {smaller} {'leaves' if i == 1 else 'leave'} too little" if i else ""
            return Pick(gpu, f"predicted {human_bytes(bytes_)}{_where(gpu, bytes_, predicted)}{left}")
    top = need[largest.name] or 0
    where = _where(largest, top, predicted)
    return Pick(largest, f"predicted {human_bytes(top)}{where}, more than every type holds: the largest")


def _where(gpu: GpuType, need: int, saved: int | None) -> str:
    """Which GPU the figure is for, when it is not the saved one."""
    if need == saved:
        return ""
    return f" on {gpu.name}" + (f" (saved at submit: {human_bytes(saved)})" if saved else "")


def predicted_on(spec: JobSpec) -> Callable[[GpuType], int | None]:
    """The spec's peak predicted for each type's GPU: its data's lengths when they were measured at submit
    (cached), else the max_length bound. None for every type when the model's config is not on this host."""
    from jobs.checks.memory import model_arch, predict_memory
    from jobs.data.tokens.measurement import cached_lengths
    from jobs.models.tokenizer import tokenizer_folder

    arch = model_arch(spec.model)
    if arch[0] is None:
        return lambda gpu: None
    lengths = cached_lengths(spec, tokenizer_folder(spec.model))

    def on(gpu: GpuType) -> int | None:
        if gpu.total_bytes is None:
            return None
        prediction = predict_memory(spec, gpu_facts(gpu), arch, lengths).prediction
        return prediction.total_bytes if prediction is not None else None

    return on


def facts_of(types: list[GpuType], host: str = "") -> DeviceFacts | None:
    """The device the dispatcher publishes: its largest sized type (None without sizes: nothing is known)."""
    if not types or types[-1].total_bytes is None:
        return None
    return gpu_facts(types[-1], host)


def gpu_facts(gpu: GpuType, host: str = "") -> DeviceFacts:
    """A sized type as a device the predictor and the checks understand."""
    major = int(gpu.compute_capability.split(".")[0])
    return DeviceFacts(
        kind="cuda",
        name=f"{gpu.name} (cluster GPU type)",
        total_bytes=int(gpu.total_bytes or 0),
        compute_capability=gpu.compute_capability,
        bf16=major >= 8,
        fp16=True,
        host=host,
    )
