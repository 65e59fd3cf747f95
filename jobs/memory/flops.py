"""Training FLOPs per token, GPU peak throughput, and from them achieved TFLOP/s and MFU.

The one FLOPs model of tunedeck (the training callback's live TFLOP/s and MFU use it; a speed
predictor should too). Per trained token, for a model of N parameters of which T train:

- forward: 2 N (one multiply and one add per parameter);
- backward: 2 N to carry the gradient back through every layer (frozen ones too: the adapters
  and virtual tokens sit inside or before them) + 2 T for the weight gradients of what trains;
- so 4 N + 2 T per token: 6 N for full fine-tuning (T = N, the usual "6 x params x tokens"),
  close to 4 N for LoRA-like methods (T << N);
- gradient checkpointing runs the forward once more in the backward pass: + 2 N (for full
  fine-tuning 8 N, i.e. +1/3).

Approximations, said once: attention's own score/softmax FLOPs (which grow with sequence length)
are left out, as are the embedding lookups (every parameter is counted as a matmul weight, a
small overcount for untied input embeddings); tokens are the non-pad tokens trl counts, so
padding the device also computes goes unseen. Good to ~10-20% for short and medium sequences.

Achieved TFLOP/s counts the work the device did, recompute included. MFU (model FLOPs
utilisation) is the useful work only, 4 N + 2 T per token without recompute, over the device's
dense peak for the run's precision (PaLM's definition), so a trick that recomputes shows as a
lower MFU rather than as free speed.

    rate = FlopsRate.for_run(resolved_config)       # from jobs.config.mapping.resolved_config + param counts
    rate.tflops(tokens_per_second), rate.mfu(tokens_per_second)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.spec.tricks import checkpointing

# Dense (no 2:4 sparsity) peak tensor throughput in TFLOP/s for bf16 / fp16 with fp32
# accumulation, and plain fp32 (no TF32: PyTorch leaves TF32 matmuls off by default), as
# printed on NVIDIA's product datasheets; the datasheets' headline figures for Hopper, Ada and
# Ampere data-centre cards assume sparsity and are halved here. GeForce cards: the fp32-accumulate
# tensor rate (what PyTorch uses), half their fp16-accumulate figure. The A10G has no public
# datasheet; it is the A10's GA102 configuration, so the A10's figures stand in for it. Matched
# in order against the device name, so more specific names come first. None: not supported.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float | None]], ...] = (
    ("H200 NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    ("RTX 4090", {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6}),
    ("RTX 3090 Ti", {"bf16": 80.0, "fp16": 80.0, "fp32": 40.0}),
    ("RTX 3090", {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6}),
    ("A10G", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("T4", {"bf16": None, "fp16": 65.0, "fp32": 8.1}),
    ("V100-PCIE", {"bf16": None, "fp16": 112.0, "fp32": 14.0}),
    ("V100", {"bf16": None, "fp16": 125.0, "fp32": 15.7}),
)


def train_flops_per_token(total_params: int, trainable_params: int, *, recompute: bool = False) -> float:
    """FLOPs the device does per trained token: 4 N + 2 T, + 2 N with gradient checkpointing."""
    n, t = float(total_params), float(min(trainable_params, total_params))
    return 4 * n + 2 * t + (2 * n if recompute else 0.0)


def peak_tflops(device_name: str, precision: str) -> tuple[float, str] | None:
    """(dense peak TFLOP/s, the table row it came from) for a device name and 'bf16'|'fp16'|'fp32'; None when unknown."""
    for key, peaks in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            value = peaks.get(precision)
            return (value, key) if value else None
    return None


@dataclass(frozen=True)
class FlopsRate:
    """Per-token FLOPs of one run and its device's peak: turns tokens/s into TFLOP/s and MFU."""

    hardware_per_token: float  # what the device computes, recompute included
    model_per_token: float  # the useful work (no recompute): MFU's numerator
    peak_flops: float | None  # FLOP/s, None when the device is not in the table
    peak_label: str = ""  # "H200 bf16 989 TFLOP/s"

    @classmethod
    def for_run(cls, resolved: dict[str, Any]) -> FlopsRate | None:
        """From a run's resolved config (`jobs.config.mapping.resolved_config` plus trainable/total_params)."""
        total, trainable = resolved.get("total_params"), resolved.get("trainable_params")
        if not total or trainable is None:
            return None
        recompute = checkpointing.recomputes_in(resolved.get("trainer_config", {}))
        device = resolved.get("device") or {}
        precision = resolved.get("precision", "fp32")
        peak = peak_tflops(str(device.get("name", "")), precision) if device.get("cuda") else None
        return cls(
            train_flops_per_token(total, trainable, recompute=recompute),
            train_flops_per_token(total, trainable),
            peak[0] * 1e12 if peak else None,
            f"{peak[1]} {precision} {peak[0]:g} TFLOP/s" if peak else "",
        )

    def tflops(self, tokens_per_second: float) -> float:
        return tokens_per_second * self.hardware_per_token / 1e12

    def mfu(self, tokens_per_second: float) -> float | None:
        """Model FLOPs utilisation, a fraction of the peak (None when the peak is unknown)."""
        return tokens_per_second * self.model_per_token / self.peak_flops if self.peak_flops else None
