"""Predict a job's peak training memory before launch, as a breakdown the form and CLI show.

Input: a `JobSpec`, the model's config (never its weights), the `DeviceFacts` of the worker
that will run it and, when measured, the training rows' token lengths (`RowLengths`: the
activations and logits are sized by the worst micro-batch those rows can form; without them, by
every row at max_length, the worst case). Output: a `Prediction` with eight parts (weights,
adapter, gradients, optimizer, activations, logits, overhead, runtime) whose sum is the predicted
peak, each with the formula that produced it, and the predicted figure at each phase of a step. docs/memory.md explains every part; `bench/memory_truth.py` checks the
prediction against counted (CPU) or measured (CUDA) peaks.

    arch = arch_for(spec.model)                      # None when no config.json is readable here
    p = predict(spec, arch, facts, lengths)          # lengths: RowLengths, or None for the worst case
    p.total_bytes, p.verdict, p.parts_dict(), p.phases
"""

from __future__ import annotations

import math

from jobs.config.mapping import QUANTIZED_METHODS, resolve_precision
from jobs.data.token_lengths import RowLengths, worst_case_batch
from jobs.devices.facts import DeviceFacts
from jobs.memory.params import _targeted, trainable_params
from jobs.memory.parts import (
    ActivationPlan,
    Arch,
    adafactor_state_bytes,
    adam8bit_state_bytes,
    block_elements,
    head_bytes,
    int8_bytes,
    nf4_bytes_per_param,
)
from jobs.memory.prediction import ALLOCATOR_SLACK, Part, Prediction, context_bytes, overhead_at
from jobs.spec.enums import LORA_FAMILY, PROMPT_FAMILY, Method, Optim, Precision, Trainer
from jobs.spec.job import JobSpec
from jobs.units import human_bytes


def _trainable_shapes(spec: JobSpec, arch: Arch) -> list[tuple[int, ...]]:
    """Shapes of the tensors the optimizer updates (for per-tensor optimizer rules)."""
    from jobs.config.mapping import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return list(arch.param_shapes)
    if m in LORA_FAMILY:
        kwargs = peft_kwargs(spec, arch.model_type, arch.shape.moe)[1]  # type: ignore[index]
        out: list[tuple[int, ...]] = []
        for lin in _targeted(spec, arch.shape, kwargs["target_modules"]):
            out += [(spec.lora_r, lin.in_features), (lin.out_features, spec.lora_r)]
            if m is Method.DORA:
                out.append((lin.out_features,))
        return out
    count = trainable_params(spec, arch.shape).trainable
    if m is Method.PROMPT_TUNING:
        return [(spec.num_virtual_tokens, arch.hidden)]
    return [(count,)]


def _plan(spec: JobSpec, arch: Arch) -> ActivationPlan:
    from jobs.config.mapping import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return ActivationPlan(weights_train=True)
    if m in LORA_FAMILY:
        kwargs = peft_kwargs(spec, arch.model_type, arch.shape.moe)[1]  # type: ignore[index]
        targets = {lin.name.split(".")[-1] for lin in _targeted(spec, arch.shape, kwargs["target_modules"])}
        return ActivationPlan(
            weights_train=False,
            adapters=tuple(x for x in arch.block_linears if x.name in targets),
            lora_r=spec.lora_r,
            dropout=spec.lora_dropout > 0,
            dora=m is Method.DORA,
            adapter_elem=2 if m in QUANTIZED_METHODS else None,
        )
    if m is Method.IA3:
        kwargs = peft_kwargs(spec, arch.model_type, arch.shape.moe)[1]  # type: ignore[index]
        targets = set(kwargs["target_modules"])
        return ActivationPlan(
            weights_train=False,
            ia3=tuple(x for x in arch.block_linears if x.name in targets),
            ia3_feedforward=frozenset(kwargs["feedforward_modules"]),
        )
    return ActivationPlan(weights_train=False)


def predict(
    spec: JobSpec, arch: Arch, device: DeviceFacts, lengths: RowLengths | None = None, *, resident: bool | None = None
) -> Prediction:
    """The predicted peak of one training step of `spec` on `device` (see docs/memory.md): for the worst
    micro-batch of the rows measured in `lengths`, or for rows of max_length tokens when None.

    `resident`: count what a host process keeps resident (its RSS: what a CPU worker measures) instead of
    what is allocated (torch's figure); default: resident on the CPU, allocated on CUDA."""
    cuda = device.kind == "cuda"
    rss = (not cuda) if resident is None else resident
    precision = resolve_precision(spec, device.device())
    half = precision in (Precision.BF16, Precision.FP16)
    elem = 2 if half else 4  # activations and matmul outputs under autocast
    mask_bytes = 1 if cuda else elem  # dropout masks: bool on CUDA, the input's dtype on the CPU
    m = spec.method
    count = trainable_params(spec, arch.shape)
    p = count.trainable
    n = arch.total_params
    notes: list[str] = []

    # ---- weights (docs/memory.md "Weights")
    if m is Method.FULL:
        weights = 4.0 * n
        wf = (
            f"{n:,} params x 4 B (fp32 masters; autocast computes in 16 bits)" if half else f"{n:,} params x 4 B (fp32)"
        )
        if half:  # autocast keeps one 16-bit copy of each trained linear weight for the step
            weights += 2.0 * arch.linear_params
            wf += f" + 16-bit autocast copies of {arch.linear_params:,} linear weights x 2 B"
    elif m is Method.QLORA:
        per = nf4_bytes_per_param(spec.bnb_4bit_use_double_quant)
        rest = n - arch.linear_params
        weights = arch.linear_params * per + rest * 4.0
        wf = (
            f"{arch.linear_params:,} block linear weights x {per:.4f} B ({spec.bnb_4bit_quant_type.value}"
            f"{' + double quant' if spec.bnb_4bit_use_double_quant else ''}) + {rest:,} embeddings/head/norms/biases "
            "x 4 B (prepare_model_for_kbit_training upcasts them to fp32)"
        )
    elif m is Method.LORA_8BIT:
        rest = n - arch.linear_params
        weights = int8_bytes(arch) + rest * 4.0
        wf = f"{arch.linear_params:,} block linear weights x 1 B + fp32 row scales + {rest:,} other params x 4 B (fp32 upcast)"
    else:
        base = 2 if half else 4
        weights = float(n * base)
        wf = f"{n:,} frozen params x {base} B"
    if rss and m in QUANTIZED_METHODS:
        # Quantizing reads every linear weight from the model's file; the tensors loaded as they are (the
        # embeddings) still point into that file's mapping, so the pages read stay in the process's RSS.
        weights += float(arch.linear_params * arch.checkpoint_bytes)
        wf += f" + the file pages read to quantize them ({arch.linear_params:,} x {arch.checkpoint_bytes} B, still mapped)"
    if m is Method.FULL and (spec.trainer is Trainer.DPO or (spec.trainer is Trainer.GRPO and spec.beta > 0)):
        weights += 4.0 * n  # trl loads a second copy as the frozen reference, in the model's dtype
        wf += f" + reference model {n:,} x 4 B"
    # ---- adapter, gradients, optimizer (docs/memory.md "Trainable parameters")
    # peft keeps adapters in fp32; for a quantized base trl casts them to bf16 (QLoRA paper s.3),
    # all but DoRA's magnitudes, and the gradients and AdamW's moments follow the weights' dtype.
    a_elem = 2 if m in QUANTIZED_METHODS else 4
    adapter = 0.0 if m is Method.FULL else float(a_elem * p)
    af = (
        "none (full fine-tune)"
        if m is Method.FULL
        else f"{p:,} trainable params x {a_elem} B ({'bf16: trl casts adapters on a quantized base' if a_elem == 2 else 'peft keeps adapters in fp32'})"
    )
    grads = float(a_elem * p) if m is not Method.FULL else 4.0 * p
    shapes = _trainable_shapes(spec, arch)
    largest = max((_numel(s) for s in shapes), default=0)
    opt_state, opt_temp, of = _optimizer(spec.optim, p, shapes, largest, cuda, a_elem if m is not Method.FULL else 4)
    # ---- activations (docs/memory.md "Activations")
    batch = lengths.worst_batch(spec) if lengths is not None else worst_case_batch(spec)
    rows = batch.sequences
    length = batch.length + (spec.num_virtual_tokens if m in PROMPT_FAMILY else 0)
    if spec.trainer is Trainer.GRPO:
        # An approximation: each row is one prompt (its measured length, else max_length; grpo does not
        # truncate prompts) plus one completion of max_completion_length tokens. Generation's KV cache is
        # freed before the training pass, and a reward run's model (reward_model_run) is not counted.
        length += spec.max_completion_length
        kv = 2 * arch.layers * arch.kv_dim * elem * spec.effective_batch_size * length
        notes.append(
            f"grpo: rows taken as {'the longest prompt' if lengths is not None else 'max_length prompt'} + "
            "max_completion_length tokens; generation's KV cache "
            f"(~{kv / 2**20:,.0f} MiB for {spec.effective_batch_size} completions) and any reward model "
            "are not counted"
        )
    tokens = rows * length
    plan = _plan(spec, arch)
    per_block = block_elements(arch, plan, mask_bytes, elem)
    moe, folded = arch.shape.moe, 0.0
    if moe is not None:  # docs/memory.md "Mixture of experts": routed top-k activations instead of a dense MLP
        from jobs.memory.moe_parts import dense_mlp_per_token, folded_expert_bytes, routed_bytes_per_token

        routed = routed_bytes_per_token(arch, moe, elem, plan.weights_train) - dense_mlp_per_token(arch) * elem
        per_block += routed * moe.moe_layers / arch.layers
        if _adapted_experts(spec, arch):
            weight_bytes = 4 if m in QUANTIZED_METHODS or not half else 2
            folded = folded_expert_bytes(moe, weight_bytes, spec.gradient_checkpointing)
    # ---- logits (docs/memory.md "Logits and loss")
    fused_kernel = cuda  # trl folds tiles in a Triton kernel on CUDA; torch ops elsewhere
    head_rows = rows * (length - 1)
    if spec.trainer is Trainer.REWARD:
        # A sequence-classification model: one score per row from the last token, no vocabulary logits;
        # the backward's fp32 gradient of the final hidden states is what the head adds.
        logits = float(rows * length * arch.hidden * 4)
        lf = f"reward head: one score per row (no vocabulary logits) + fp32 hidden grad {rows * length}x{arch.hidden}"
    else:
        logits, lf = head_bytes(arch, head_rows, elem, mask_bytes, m is Method.FULL, fused_kernel, rss)
    if spec.gradient_checkpointing:
        # Only each block's input stays; one block is recomputed at a time, after the head's
        # backward has finished, so the larger of the two transients counts, not both.
        acts = tokens * arch.layers * arch.hidden * elem + max(0.0, tokens * per_block - logits)
        actf = (
            f"{tokens:,} tokens x {arch.layers} block inputs x {arch.hidden} x {elem} B "
            f"+ one recomputed block ({per_block:,.0f} B/token) beyond the head's transient"
        )
    else:
        acts = tokens * arch.layers * per_block
        actf = f"{tokens:,} tokens x {arch.layers} layers x {per_block:,.0f} B/token/layer"
    acts += tokens * arch.hidden * (3 if plan.weights_train else 2) * elem  # final norm and the head's input copy
    if folded:
        acts += folded
        actf += f" + peft's folded expert weights (W + BA) kept for the backward {human_bytes(folded)}"
    if m in (Method.QLORA, Method.LORA_8BIT):
        big = max(lin.in_features * lin.out_features for lin in arch.block_linears)
        acts += big * elem * 2  # one de-quantized weight (and its transpose) at a time
        actf += " + one de-quantized weight"
    # ---- the peak: in the backward (activations alive) or at the optimizer step (all gradients alive)
    accumulated = grads if spec.gradient_accumulation_steps > 1 else 0.0
    backward = weights + adapter + opt_state + acts + logits + accumulated
    step = weights + adapter + opt_state + grads + opt_temp
    if backward >= step:
        phase, g, gf = "backward", accumulated, ("earlier micro-batches' gradients, " if accumulated else "none yet; ")
        gf += f"{p:,} x 4 B once the backward ends"
        a, lg, o = acts, logits, opt_state
    else:
        phase, g, gf = "optimizer step", grads, f"{p:,} trainable params x 4 B (fp32)"
        a, lg, o = 0.0, 0.0, opt_state + opt_temp
        notes.append("the peak is at the optimizer step: activations are freed by then")
    overhead = 0.0
    ovf = "none on the CPU (tensors only)"
    if cuda:
        ctx = context_bytes(device)
        overhead = overhead_at(weights + adapter + g + o + a + lg, device)
        ovf = f"CUDA context {ctx / 2**20:.0f} MiB ({device.name}) + {ALLOCATOR_SLACK:.0%} allocator slack"
    runtime = 0 if cuda else device.runtime_bytes
    rtf = (
        "host memory, not in torch's reserved figure (on CUDA)"
        if cuda
        else (
            f"the training process before the model: Python, torch, transformers, trl ({human_bytes(runtime)}, "
            "measured by the worker)"
            if runtime
            else "not measured yet (no worker has published its runtime baseline): tensors only"
        )
    )
    # The first optimizer step, as the training child measures it (docs/memory.md "Phases"): no optimizer
    # state exists before it, so the backward's figure is the peak of later steps less that state.
    first = {
        "load": weights + adapter,
        "forward": weights + adapter + acts + logits,
        "backward": backward - opt_state - accumulated,
        "optimizer": step,
    }
    phases = {name: int(value + overhead_at(value, device) + runtime) for name, value in first.items()}
    if spec.optim in (Optim.PAGED_ADAMW_8BIT, Optim.PAGED_ADAMW_32BIT) and cuda:
        notes.append("paged optimizer: its state can move to CPU RAM under pressure, so the peak may be lower")
    parts = (
        Part("weights", int(weights), wf),
        Part("adapter", int(adapter), af),
        Part("gradients", int(g), gf),
        Part("optimizer", int(o), of),
        Part("activations", int(a), actf),
        Part("logits", int(lg), lf),
        Part("overhead", int(overhead), ovf),
        Part("runtime", runtime, rtf),
    )
    return Prediction(
        parts,
        phase,
        device,
        p,
        count.total if m is not Method.FULL else n,
        precision.value,
        tuple(notes),
        batch=batch,
        phases=phases,
        lengths=lengths.stats(spec.max_length) if lengths is not None else None,
        active_params=_active_params(arch),
    )


def _active_params(arch: Arch) -> int | None:
    """Parameters one token passes through (top-k of the experts, every other weight); None for a dense model."""
    moe = arch.shape.moe
    if moe is None:
        return None
    return int(arch.total_params - moe.expert_param_count * (1 - moe.active_param_share))


def _adapted_experts(spec: JobSpec, arch: Arch) -> bool:
    """Whether LoRA adapts the fused expert weights (peft's ParamWrapper) under the spec's moe_targets."""
    from jobs.config.mapping import peft_kwargs

    if spec.method not in LORA_FAMILY or arch.shape.moe is None:
        return False
    found = peft_kwargs(spec, arch.model_type, arch.shape.moe)
    return found is not None and any(".experts." in t for t in found[1].get("target_parameters", ()))


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _optimizer(
    optim: Optim, p: int, shapes: list[tuple[int, ...]], largest: int, cuda: bool, elem: int = 4
) -> tuple[float, float, str]:
    """(state bytes kept between steps, extra bytes during the step, formula); `elem`: the trained weights' bytes."""
    if optim in (Optim.ADAMW, Optim.PAGED_ADAMW_32BIT):
        # torch AdamW keeps two moments in the parameters' dtype. On CUDA it updates all tensors at
        # once (foreach): one temporary per parameter; on the CPU it loops tensor by tensor: two
        # temporaries of the largest tensor.
        temp = elem * p if cuda and optim is Optim.ADAMW else 2.0 * elem * largest
        kind = "fp32" if elem == 4 else "bf16"
        return 2.0 * elem * p, temp, f"{p:,} x {2 * elem} B (two {kind} moments)"
    if optim in (Optim.ADAMW_8BIT, Optim.PAGED_ADAMW_8BIT):
        state = adam8bit_state_bytes([_numel(s) for s in shapes])
        return state, 4.0 * largest, f"{p:,} x ~2 B (two 8-bit moments + block scales; tensors < 4096 values keep fp32)"
    if optim is Optim.ADAFACTOR:
        state = adafactor_state_bytes(shapes)
        return state, 12.0 * largest, "fp32 row + column second moments per matrix, full per vector (factored)"
    raise ValueError(f"no memory rule for optimizer {optim}")  # pragma: no cover - the enum is closed
