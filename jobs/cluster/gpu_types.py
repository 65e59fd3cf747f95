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
verdict). A run without a saved prediction, or predicted above every type (queued with
`ignore_memory_prediction`), asks for the largest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobs.devices.facts import DeviceFacts
from jobs.errors import Problem, ProblemError
from jobs.memory.planner import MARGIN
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


def pick(types: list[GpuType], predicted: int | None) -> Pick | None:
    """The type a run predicted to peak at `predicted` bytes asks for (None: no type, any GPU)."""
    if not types:
        return None
    largest = types[-1]
    if largest.total_bytes is None:
        return Pick(largest, None)
    if not predicted:
        return Pick(largest, "no memory prediction was saved with the run: the largest type")
    for i, gpu in enumerate(types):  # smallest first: every type before `gpu` was too small
        if predicted <= MARGIN * (gpu.total_bytes or 0):
            smaller = ", ".join(str(t) for t in types[:i])
            left = f"; {smaller} {'leaves' if i == 1 else 'leave'} too little" if i else ""
            return Pick(gpu, f"predicted {human_bytes(predicted)}{left}")
    return Pick(largest, f"predicted {human_bytes(predicted)}, more than every type holds: the largest")


def facts_of(types: list[GpuType], host: str = "") -> DeviceFacts | None:
    """The device the dispatcher publishes: its largest sized type (None without sizes: nothing is known)."""
    if not types or types[-1].total_bytes is None:
        return None
    gpu = types[-1]
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
