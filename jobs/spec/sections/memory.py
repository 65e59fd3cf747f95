"""The spec's memory tricks: batch shape, checkpointing, precision, optimizer, sequence length, OOM handling.

Each trick's memory/speed trade-off is told in its help text (and, at more length, next to its
mapping in `jobs.config`); `jobs.memory` predicts the peak they lead to.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.enums import LOW_RANK_ONLY, OFFLOADING_ONLY, SFT_ONLY, OnOom, Optim, Precision
from jobs.spec.field import Group, spec_field


@dataclass(frozen=True)
class MemoryFields:
    """The knobs that trade memory for time (or for nothing, like packing)."""

    per_device_train_batch_size: int = spec_field(
        8,
        Group.MEMORY,
        "Micro-batch size: examples per forward pass. Activation memory grows with it.",
        ge=1,
        le=4096,
        label="Micro-batch size",
    )
    gradient_accumulation_steps: int = spec_field(
        1,
        Group.MEMORY,
        "Micro-batches per optimizer step. Same effective batch with less memory; costs time.",
        ge=1,
        le=4096,
        label="Gradient accumulation",
    )
    gradient_checkpointing: bool = spec_field(
        False,
        Group.MEMORY,
        "Recompute activations in the backward pass: much less activation memory, ~20-30% slower.",
        label="Gradient checkpointing",
    )
    precision: Precision = spec_field(
        Precision.AUTO,
        Group.MEMORY,
        "auto: the best the device supports (bf16 on recent GPUs, fp32 on CPU). fp16 uses loss scaling and needs CUDA.",
        label="Precision",
        advanced=True,
    )
    optim: Optim = spec_field(
        Optim.ADAMW,
        Group.MEMORY,
        "Optimizer. AdamW keeps ~8 B/param of state; 8-bit AdamW ~2 B; paged variants spill to CPU under pressure (CUDA only). "
        "galore_*/apollo_* (full fine-tuning only) keep the targeted linears' state at optim_rank: a 7B full fine-tune "
        "on one 24 GB GPU (published); *_layerwise also update each weight in the backward pass, so its gradient "
        "never waits for the step (no gradient accumulation). GaLore recomputes an SVD every optim_update_proj_gap steps.",
        label="Optimizer",
    )
    optim_target_modules: str = spec_field(
        "all-linear",
        Group.MEMORY,
        "GaLore/APOLLO: the linear layers whose optimizer state is kept at low rank (all-linear, or names such as "
        "q_proj,v_proj, or a regex); the others keep full AdamW state.",
        label="Low-rank optimizer targets",
        when=LOW_RANK_ONLY,
        advanced=True,
    )
    optim_rank: int = spec_field(
        128,
        Group.MEMORY,
        "GaLore/APOLLO: rank of the projected optimizer state. State per m x n weight ~ 4 B x r x (2 max(m,n) + min(m,n)) "
        "instead of 8 B x m x n; lower saves more and learns less per step.",
        ge=1,
        le=65536,
        label="Low-rank optimizer rank",
        when=LOW_RANK_ONLY,
    )
    optim_update_proj_gap: int = spec_field(
        200,
        Group.MEMORY,
        "GaLore/APOLLO: steps between new projections (GaLore: one SVD per targeted weight, a pause of seconds on big models).",
        ge=1,
        le=1_000_000,
        label="Steps per projection update",
        when=LOW_RANK_ONLY,
        advanced=True,
    )
    use_liger_kernel: bool = spec_field(
        False,
        Group.MEMORY,
        "Liger's Triton kernels for RMSNorm, SwiGLU and RoPE (CUDA only; pip install 'tunedeck[gpu]'). Published: -60% "
        "memory, +20% tokens/s on Llama-3-8B with its fused loss; trl 1.16 keeps its own fused loss, so here it saves "
        "the layers' temporaries (not predicted: the activations stay at their unfused size).",
        label="Liger kernels",
    )
    activation_offloading: bool = spec_field(
        False,
        Group.MEMORY,
        "Keep the activations saved for the backward pass in host memory (CUDA only; sft, dpo, kto, reward): the GPU holds about one "
        "layer's worth; the worker's RAM holds the rest. With gradient checkpointing it offloads the checkpoints "
        "(offloaded checkpointing). Costs transfer time (~10-30%, published; hidden by streams when compute dominates).",
        label="Offload activations to host memory",
        when=OFFLOADING_ONLY,
    )
    torch_compile: bool = spec_field(
        False,
        Group.MEMORY,
        "Compile the model with torch.compile (inductor): torchtune measured +27% tokens/s and -15% memory on a 3B "
        "(published). The first steps pay the compile time (a minute or more); its workspace is not predicted.",
        label="torch.compile",
        advanced=True,
    )
    cpu_return_freed_memory: bool = spec_field(
        False,
        Group.MEMORY,
        "CPU workers only: a fixed malloc mmap threshold (128 KiB) so freed tensors leave the process: a lower real "
        "peak (0.84x on SmolLM2-135M LoRA, measured) for ~16-22% fewer tokens/s (measured, bench/overhead.py). "
        "Off: glibc's default; its heap keeps freed activations resident (predicted as the 'allocator' part).",
        label="Return freed memory (CPU)",
        advanced=True,
    )
    max_length: int = spec_field(
        512,
        Group.MEMORY,
        "Maximum tokens per example; longer rows are truncated. Activations grow with it.",
        ge=8,
        le=131072,
        label="Max tokens per example",
    )
    image_max_pixels: int | None = spec_field(
        None,
        Group.MEMORY,
        "Vision-language models whose processor resizes each image within a pixel budget (Qwen2-VL, Qwen2.5-VL): "
        "the most pixels an image is worked at (e.g. 200704 = 448x448). Fewer pixels, fewer image tokens: less "
        "memory and faster steps, less detail. Empty: the processor's own budget. Refused for processors that "
        "resize every image to one size (LLaVA, Gemma 3).",
        ge=784,
        le=100_000_000,
        label="Image pixel budget (max)",
        advanced=True,
    )
    image_min_pixels: int | None = spec_field(
        None,
        Group.MEMORY,
        "With image_max_pixels' processors: the fewest pixels an image is worked at (smaller images are "
        "enlarged). Empty: the processor's own.",
        ge=784,
        le=100_000_000,
        label="Image pixel budget (min)",
        advanced=True,
    )
    packing: bool = spec_field(
        False,
        Group.MEMORY,
        "Pack several short examples into one sequence (SFT only): fewer pad tokens, faster.",
        label="Packing",
        when=SFT_ONLY,
        advanced=True,
    )
    padding_free: bool = spec_field(
        False,
        Group.MEMORY,
        "Flatten each batch into one sequence without padding (SFT: needs packing, which turns it on anyway).",
        label="Padding-free batches",
        advanced=True,
    )
    auto_find_batch_size: bool = spec_field(
        False,
        Group.MEMORY,
        "On a CUDA out-of-memory error, halve the micro-batch and retry instead of failing.",
        label="Shrink the batch on out-of-memory",
        advanced=True,
    )
    on_oom: OnOom = spec_field(
        OnOom.RECOVER,
        Group.MEMORY,
        "recover: on a CUDA out-of-memory error, continue from the last checkpoint with a smaller micro-batch (same effective batch), then gradient checkpointing, then 8-bit AdamW; at most 3 times, each change recorded on the run. fail: stop with advice.",
        label="On out-of-memory",
        advanced=True,
    )
    ignore_memory_prediction: bool = spec_field(
        False,
        Group.MEMORY,
        "Queue the run even when the predicted peak memory exceeds the device's memory (the prediction can be wrong for unusual models).",
        label="Queue even if predicted not to fit",
        advanced=True,
    )

    @property
    def effective_batch_size(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps
