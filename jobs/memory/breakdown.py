"""What a memory prediction is: its parts, its verdict on a device, the figure at each phase, in words.

`jobs.memory.predict.predict` makes a `Prediction`; the checks, the form's panel, `tunedeck plan`,
the run page and Compare read it (stored with a run as `prediction.json`, `Prediction.to_dict`).

    p.total_bytes, p.verdict, p.parts_dict(), p.phases
    explain(p)                      # "Fits: 3.1 GiB of cpu (23.4 GiB), 13%. The largest part is ..."
    prediction_error_text(stored, measured_peak, "rss")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from jobs.data.tokens.lengths import LengthStats, TokenBatch
from jobs.devices.facts import DeviceFacts, RuntimeBaseline
from jobs.spec.enums import Trainer
from jobs.spec.trainer_records import record_for
from jobs.units import human_bytes

PART_NAMES = ("weights", "adapter", "gradients", "optimizer", "activations", "logits", "overhead", "runtime")
# A generating trainer's (grpo) two more, before "overhead": its generation or scoring phase's own bytes when the
# peak is there, and a reward model's weights (jobs.memory.rollout).
GENERATION_PARTS = ("generation", "reward_model")
VLLM_PART = "vllm"  # grpo with use_vllm, after those two: vLLM's reserved share of the GPU (jobs.memory.rollout)
PHASES = ("load", "forward", "backward", "optimizer")  # the named points the training child measures
TIGHT_ABOVE = 0.90  # share of the device's memory above which the verdict is "tight"
GIB = 1024**3
# CUDA context + cuBLAS/cuDNN workspaces, outside torch's allocator (NVML sees them, torch does not).
# Per device name; to be measured with `bench/memory_truth.py --device cuda` (NVML used minus
# max reserved) and replaced by measured figures as they come in. docs/memory.md "Overhead".
CUDA_CONTEXT_BYTES: dict[str, int] = {
    "default": 600 * 1024**2,
    "H100": 600 * 1024**2,
    "H200": 600 * 1024**2,
    "A100": 550 * 1024**2,
    "V100": 1343 * 1024**2,  # HF docs' bert-large table, older CUDA
}
# torch's caching allocator rounds blocks and keeps freed ones: reserved runs a few % above allocated.
ALLOCATOR_SLACK = 0.05


class Verdict(str, Enum):
    FITS = "fits"
    TIGHT = "tight"
    WILL_NOT_FIT = "will not fit"


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    formula: str


@dataclass(frozen=True)
class Prediction:
    """A predicted peak: parts that add up to it, the phase it happens in, the device it is for."""

    parts: tuple[Part, ...]
    phase: str  # "backward" (activations alive), "optimizer step" (all gradients alive), grpo: "generation", "scoring"
    device: DeviceFacts
    trainable_params: int
    total_params: int
    precision: str
    notes: tuple[str, ...] = field(default=())
    batch: TokenBatch | None = None  # the micro-batch the activations were sized for
    phases: dict[str, int] = field(default_factory=dict)  # predicted bytes at each of PHASES
    lengths: LengthStats | None = None  # the data's lengths, when the prediction used them
    worst_case_bytes: int | None = None  # the same job with every row max_length long
    active_params: int | None = None  # mixture of experts: parameters one token passes through; None if dense
    not_modelled: tuple[str, ...] = ()  # the model's layer kinds no formula describes (their activations uncounted)
    host_bytes: int = 0  # moved off the device into the host's RAM (activation offloading), not in the total

    @property
    def from_data(self) -> bool:
        """Whether the figure is the data's own (measured lengths), not the max_length bound."""
        return self.lengths is not None

    @property
    def total_bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def part(self, name: str) -> int:
        return next(p.bytes for p in self.parts if p.name == name)

    def parts_dict(self) -> dict[str, int]:
        return {p.name: p.bytes for p in self.parts}

    @property
    def share(self) -> float:
        """Predicted peak over the device's memory."""
        return self.total_bytes / self.device.total_bytes if self.device.total_bytes else float("inf")

    @property
    def verdict(self) -> Verdict:
        if self.share > 1.0:
            return Verdict.WILL_NOT_FIT
        return Verdict.TIGHT if self.share > TIGHT_ABOVE else Verdict.FITS

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`tunedeck plan --json`, stored with the run)."""
        return {
            "total_bytes": self.total_bytes,
            "data_bytes": self.total_bytes if self.from_data else None,
            "worst_case_bytes": self.worst_case_bytes if self.worst_case_bytes is not None else self.total_bytes,
            "lengths": self.lengths.to_dict() if self.lengths is not None else None,
            "batch": asdict(self.batch) if self.batch is not None else None,
            "phases": dict(self.phases),
            "parts": self.parts_dict(),
            "verdict": self.verdict.value,
            "phase": self.phase,
            "device": self.device.to_dict(),
            "trainable_params": self.trainable_params,
            "total_params": self.total_params,
            "active_params": self.active_params,
            "not_modelled": list(self.not_modelled),
            "precision": self.precision,
            "formulas": {p.name: p.formula for p in self.parts},
            "notes": list(self.notes),
            "cuda_context_bytes": context_bytes(self.device),
            "host_bytes": self.host_bytes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prediction:
        """The prediction `to_dict` wrote (also one saved by an older tunedeck: missing fields take defaults)."""
        formulas = data.get("formulas") or {}
        parts = tuple(
            Part(name, int(value), formulas.get(name, "")) for name, value in (data.get("parts") or {}).items()
        )
        device = DeviceFacts.from_dict(data.get("device") or {})
        lengths = data.get("lengths")
        return cls(
            parts,
            str(data.get("phase", "")),
            device,
            int(data.get("trainable_params") or 0),
            int(data.get("total_params") or 0),
            str(data.get("precision", "")),
            tuple(data.get("notes") or ()),
            batch=TokenBatch(**data["batch"]) if data.get("batch") else None,
            phases={k: int(v) for k, v in (data.get("phases") or {}).items()},
            lengths=LengthStats(**lengths) if lengths else None,
            worst_case_bytes=data.get("worst_case_bytes"),
            active_params=data.get("active_params"),
            not_modelled=tuple(data.get("not_modelled") or ()),
        )

    def with_runtime(self, baseline: RuntimeBaseline, trainer: Trainer, who: str) -> Prediction:
        """This prediction with its runtime part set to `baseline`'s runtime plus what `trainer`'s own trl classes
        add (measured by `who`, after the prediction was made): the total, the worst case and every phase grow by
        the difference."""
        own = baseline.trainer_bytes.get(trainer.value, 0)
        runtime = baseline.runtime_bytes + own
        extra = runtime - self.part("runtime") if any(p.name == "runtime" for p in self.parts) else runtime
        formula = f"the training process before the model, measured by {who}" + trainer_import_text(
            record_for(trainer).trainer_class, own
        )
        part = Part("runtime", runtime, formula)
        parts = tuple(part if p.name == "runtime" else p for p in self.parts)
        if all(p.name != "runtime" for p in parts):
            parts += (part,)
        return replace(
            self,
            parts=parts,
            device=self.device.with_baseline(baseline),
            phases={name: value + extra for name, value in self.phases.items()},
            worst_case_bytes=self.worst_case_bytes + extra if self.worst_case_bytes is not None else None,
            notes=(*self.notes, f"runtime part added when {who} claimed the run (no worker had measured it at submit)"),
        )


def runtime_part(device: DeviceFacts, trainer: Trainer, cuda: bool) -> tuple[float, str]:
    """The runtime part at submit (docs/memory.md "Overhead"): the worker's measured baseline and what `trainer`'s own
    trl classes add (GRPO's; 0 for the common set's), both measured with the baseline."""
    if cuda:
        return 0.0, "host memory, not in torch's reserved figure (on CUDA)"
    runtime = device.runtime_bytes
    if not runtime:
        return 0.0, "not measured yet (no worker has published its runtime baseline): tensors only"
    own = device.trainer_bytes.get(trainer.value, 0)
    return float(runtime + own), (
        f"the training process before the model: Python, torch, transformers, trl ({human_bytes(runtime)}, "
        "measured by the worker)" + trainer_import_text(record_for(trainer).trainer_class, own)
    )


def trainer_import_text(trainer_class: str, added: int) -> str:
    """The runtime formula's words for what a trainer's own trl classes add ('' when nothing)."""
    return f" + trl's {trainer_class} {human_bytes(added)} (imported by this trainer only)" if added else ""


def context_bytes(device: DeviceFacts) -> int:
    """The CUDA context of this kind of GPU (0 on the CPU)."""
    if device.kind != "cuda":
        return 0
    for key, value in CUDA_CONTEXT_BYTES.items():
        if key != "default" and key.lower() in device.name.lower():
            return value
    return CUDA_CONTEXT_BYTES["default"]


def overhead_at(subtotal: float, device: DeviceFacts) -> float:
    """The CUDA context plus allocator slack over `subtotal` tensor bytes (0 on the CPU)."""
    return context_bytes(device) + ALLOCATOR_SLACK * subtotal if device.kind == "cuda" else 0.0


PLAIN_NAMES = {
    "weights": "the model's weights",
    "adapter": "the adapter weights",
    "gradients": "the gradients",
    "optimizer": "the optimizer state",
    "activations": "the activations kept for the backward pass",
    "logits": "the output layer's scoring of the vocabulary",
    "generation": "sampling completions (the KV cache) or scoring them",
    "reward_model": "the reward model's weights",
    "vllm": "vLLM's reserved share of the GPU",
    "overhead": "the CUDA context and allocator",
    "runtime": "the Python runtime and libraries",
}
CPU_OVERHEAD = "the freed memory glibc's allocator keeps"  # a CPU run's overhead part: no CUDA context there


def explain(prediction: Prediction) -> str:
    """The verdict and its reason in plain words."""
    total, cap = prediction.total_bytes, prediction.device.total_bytes
    biggest = max(prediction.parts, key=lambda p: p.bytes)
    share = f"{100 * biggest.bytes / total:.0f}%" if total else "0%"
    where = (
        prediction.device.name if "GiB" in prediction.device.name else f"{prediction.device.name} ({human_bytes(cap)})"
    )
    head = {
        Verdict.FITS: f"Fits: {human_bytes(total)} of {where}, {100 * prediction.share:.0f}%.",
        Verdict.TIGHT: f"Tight: {human_bytes(total)} of {where}, {100 * prediction.share:.0f}% "
        f"(above {TIGHT_ABOVE:.0%}: fragmentation or a longer row may tip it over).",
        Verdict.WILL_NOT_FIT: f"Will not fit: {human_bytes(total)} needed, {100 * prediction.share:.0f}% of {where}.",
    }[prediction.verdict]
    plain = (
        CPU_OVERHEAD if biggest.name == "overhead" and prediction.device.kind != "cuda" else PLAIN_NAMES[biggest.name]
    )
    return f"{head} The largest part is {plain} ({share}); the peak is in the {prediction.phase}."


def prediction_error_text(
    predicted: dict[str, Any] | None, measured: int | None, source: str | None, steps: int | None = None
) -> str:
    """'predicted 1.2 GiB vs measured 1.1 GiB (torch): +9%' for a run, '' without a saved prediction.

    On CUDA the measured peak is torch's max reserved (the prediction's CUDA context is left out);
    on the CPU it is the process's peak RSS, which also holds the Python runtime and libraries.
    `steps`: the optimizer steps the run finished; with none (it failed or stopped before its first), the
    peak it measured is no step's, so no error is given."""
    if not predicted:
        return ""
    total = int(predicted.get("total_bytes", 0))
    text = f"predicted {human_bytes(total)}"
    if steps == 0 and measured:
        return f"{text}; no optimizer step has run, so nothing comparable was measured"
    if not measured:
        return text
    comparable = total - (int(predicted.get("cuda_context_bytes", 0)) if source == "torch" else 0)
    return f"{text} vs measured {human_bytes(measured)} ({source}): {100 * (comparable - measured) / measured:+.0f}%"
