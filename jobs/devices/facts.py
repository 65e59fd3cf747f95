"""The device runs train on, as plain values: what the capability checks take (`Device`) and what a
worker publishes to the store for everyone else to read (`DeviceFacts`).

Nothing here asks the machine: `jobs.devices.probe` detects the facts, `jobs.devices.target` reads
the ones workers published, and the worker measures the runtime baseline (`RuntimeBaseline`:
`runtime_bytes` and `trainer_bytes`, `jobs.worker.runtime`). All are plain data so the mapping and the checks stay
testable.

    facts = DeviceFacts.from_json(text)       # DeviceFacts(kind="cuda", name="NVIDIA H200", ...)
    facts.device()                            # Device(cuda=True, bf16=True, (9, 0), "NVIDIA H200")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class Device:
    """What the training device can do; a plain value so the mapping stays testable."""

    cuda: bool
    bf16: bool
    compute_capability: tuple[int, int] | None = None
    name: str = "cpu"


CPU = Device(cuda=False, bf16=False, compute_capability=None, name="cpu")


def trainer_bytes_of(value: Any) -> dict[str, int] | None:
    """`value` as a `trainer_bytes` map ({trainer: bytes >= 0}); None when it is not one."""
    if not isinstance(value, dict):
        return None
    if not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in value.items()
    ):
        return None
    return dict(value)


@dataclass(frozen=True)
class RuntimeBaseline:
    """What `python -m jobs.train.baseline` measures: the training child's RSS before it loads a model
    (`runtime_bytes`) and, per trainer, the RSS its own trl classes add on top (`trainer_bytes`, {"grpo": N}; a
    trainer whose classes the common figure already holds is not listed: it adds nothing)."""

    runtime_bytes: int
    trainer_bytes: dict[str, int] = field(default_factory=dict, hash=False)

    @classmethod
    def from_dict(cls, data: Any) -> RuntimeBaseline | None:
        """The baseline in `data` (the JSON the baseline prints, or a cache entry); None when it holds none.
        Missing `trainer_bytes` reads as none listed (a stand-in baseline that prints only its runtime)."""
        if not isinstance(data, dict):
            return None
        runtime, trainers = data.get("runtime_bytes"), trainer_bytes_of(data.get("trainer_bytes", {}))
        if not isinstance(runtime, int) or isinstance(runtime, bool) or runtime <= 0 or trainers is None:
            return None
        return cls(runtime, trainers)

    def to_dict(self) -> dict[str, Any]:
        return {"runtime_bytes": self.runtime_bytes, "trainer_bytes": dict(self.trainer_bytes)}


@dataclass(frozen=True)
class DeviceFacts:
    kind: str  # "cuda" | "cpu"
    name: str  # "NVIDIA H200" | "cpu"
    total_bytes: int  # GPU memory; host RAM on CPU
    compute_capability: str | None = None  # "9.0"
    bf16: bool = False
    fp16: bool = False
    driver: str | None = None
    host: str = ""
    index: int | None = None  # CUDA device index on its host
    # The training child's resident size before it loads a model (interpreter, libraries, thread
    # pools: `jobs.train.baseline`), measured once per host by the worker; 0 = unknown. On the CPU
    # the measured memory curve is the child's RSS, which includes it; on CUDA it is not part of it.
    runtime_bytes: int = 0
    # What each trainer's own trl classes add to it when imported ({"grpo": N}, measured with it; a trainer not
    # listed adds nothing). Facts published before it was measured have none. Not hashed: a dict.
    trainer_bytes: dict[str, int] = field(default_factory=dict, hash=False)

    @property
    def cuda(self) -> bool:
        return self.kind == "cuda"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceFacts:
        """Facts from plain data; keys a newer tunedeck added are ignored."""
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in known}
        if "trainer_bytes" in kept:  # anything but a {trainer: bytes} map counts as none measured
            kept["trainer_bytes"] = trainer_bytes_of(kept["trainer_bytes"]) or {}
        return cls(**kept)

    @classmethod
    def from_json(cls, text: str) -> DeviceFacts:
        return cls.from_dict(json.loads(text))

    def with_baseline(self, baseline: RuntimeBaseline | None) -> DeviceFacts:
        """These facts with the runtime baseline measured on their host (None: as they are)."""
        if baseline is None:
            return self
        return replace(self, runtime_bytes=baseline.runtime_bytes, trainer_bytes=dict(baseline.trainer_bytes))

    def device(self) -> Device:
        """The capability view of this device (what the mapping's checks take)."""
        cc = tuple(int(x) for x in self.compute_capability.split(".")) if self.compute_capability else None
        return Device(cuda=self.cuda, bf16=self.bf16, compute_capability=cc, name=self.name)  # type: ignore[arg-type]

    def summary(self) -> str:
        """'NVIDIA H200 (cuda:0 on gpu-box), 139.8 GiB, compute 9.0, bf16' or 'cpu on laptop, 31.2 GiB RAM, runtime 1.1 GiB'."""
        gib = self.total_bytes / 1024**3
        if not self.cuda:
            runtime = f", runtime {self.runtime_bytes / 1024**3:.1f} GiB" if self.runtime_bytes else ""
            return f"cpu on {self.host or 'this machine'}, {gib:.1f} GiB RAM{runtime}"
        where = f"cuda:{self.index if self.index is not None else 0}" + (f" on {self.host}" if self.host else "")
        extras = [f"compute {self.compute_capability}"] if self.compute_capability else []
        extras += ["bf16"] if self.bf16 else ["no bf16"]
        extras += [f"driver {self.driver}"] if self.driver else []
        return f"{self.name} ({where}), {gib:.1f} GiB, " + ", ".join(extras)
