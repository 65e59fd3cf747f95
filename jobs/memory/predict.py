"""Predict a job's peak training memory before launch, as a breakdown the form and CLI show.

Input: a `JobSpec`, the model's config (never its weights), the `DeviceFacts` of the worker
that will run it and, when measured, the training rows' token lengths (`RowLengths`: the
activations and logits are sized by the worst micro-batch those rows can form; without them, by
every row at max_length, the worst case). Output: a typed `Prediction` (`jobs.memory.breakdown`) with
parts whose sum is the predicted peak (eight; a generating trainer's generation, reward model and vLLM too), each with the formula that produced it, and the predicted
figure at each phase of a step. One function per part, each named after its docs/memory.md section:

    weights_term        "Weights"
    adapter_term        "Trainable parameters" (with gradient_bytes)
    optimizer_term      "Optimizer state"
    activations_term    "Activations" (and "Mixture of experts")
    logits_term         "Logits and loss"
    overhead_term       "Overhead" (the runtime part: `jobs.memory.breakdown.runtime_part`)

`bench/memory_truth.py` checks the prediction against counted (CPU) or measured (CUDA) peaks.

    arch = arch_for(spec.model)                      # None when no config.json is readable here
    p = predict(spec, arch, facts, lengths)          # lengths: RowLengths, or None for the worst case
    p.total_bytes, p.verdict, p.parts_dict(), p.phases, p.not_modelled
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobs.config.mapping import QUANTIZED_METHODS, resolve_precision
from jobs.data.tokens.lengths import RowLengths, TokenBatch, worst_case_batch
from jobs.devices.facts import DeviceFacts
from jobs.memory.breakdown import ALLOCATOR_SLACK, VLLM_PART, Part, Prediction, context_bytes, overhead_at, runtime_part
from jobs.memory.elementwise import elementwise_bytes
from jobs.memory.mixers import (
    delta_net_bytes,
    delta_net_dims,
    delta_net_formula,
    mamba2_dims,
    mixer_bytes,
    mixer_formula,
    modelled_out,
)
from jobs.memory.moe_parts import active_params as moe_active_params
from jobs.memory.params import ParamCount, trainable_params
from jobs.memory.parts import (
    ActivationPlan,
    Arch,
    block_elements,
    dequantized_bytes,
    head_bytes,
    int8_bytes,
    nf4_bytes_per_param,
)
from jobs.memory.peak import Term, peak_phase
from jobs.memory.rollout import NO_ROLLOUT, Rollout, rollout
from jobs.memory.targets import activation_plan, adapted_experts, optimizer_bytes, trainable_shapes
from jobs.memory.trick_effects import Figures, trick_effects
from jobs.spec.enums import PROMPT_FAMILY, Method, Optim, Precision
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from jobs.spec.tricks import checkpointing
from jobs.spec.tricks.registry import memory_notes
from jobs.units import human_bytes


@dataclass(frozen=True)
class Setting:
    """What every part depends on, worked out once: the spec, the model, the device and the micro-batch."""

    spec: JobSpec
    arch: Arch
    device: DeviceFacts
    rss: bool  # count a host process's resident pages (CPU worker) instead of allocated bytes
    precision: Precision
    count: ParamCount
    batch: TokenBatch
    length: int  # tokens per row the activations are sized for (virtual tokens and grpo completions included)
    plan: ActivationPlan
    notes: tuple[str, ...]

    @property
    def cuda(self) -> bool:
        return self.device.kind == "cuda"

    @property
    def generates(self) -> bool:
        return record_for(self.spec.trainer).generates

    @property
    def half(self) -> bool:
        return self.precision in (Precision.BF16, Precision.FP16)

    @property
    def elem(self) -> int:
        return 2 if self.half else 4  # activations and matmul outputs under autocast

    @property
    def mask_bytes(self) -> int:
        return 1 if self.cuda else self.elem  # dropout masks: bool on CUDA, the input's dtype on the CPU

    @property
    def tokens(self) -> int:
        return self.batch.sequences * self.length

    @property
    def adapter_elem(self) -> int:
        """Bytes per trained value: peft keeps adapters in fp32; on a quantized base trl casts them to bf16."""
        return 4 if self.spec.method is Method.FULL or self.spec.method not in QUANTIZED_METHODS else 2


def setting(
    spec: JobSpec, arch: Arch, device: DeviceFacts, lengths: RowLengths | None, resident: bool | None
) -> Setting:
    cuda = device.kind == "cuda"
    precision = resolve_precision(spec, device.device())
    batch = lengths.worst_batch(spec) if lengths is not None else worst_case_batch(spec)
    length = batch.length + (spec.num_virtual_tokens if spec.method in PROMPT_FAMILY else 0)
    notes: list[str] = []
    if record_for(spec.trainer).generates:
        # Each training row is one prompt (its measured length, else max_length; grpo does not truncate
        # prompts) plus one completion of max_completion_length tokens; generation and scoring: jobs.memory.rollout.
        length += spec.max_completion_length
        notes.append(
            f"grpo: rows taken as {'the longest prompt' if lengths is not None else 'max_length prompt'} + "
            "max_completion_length tokens"
        )
    return Setting(
        spec,
        arch,
        device,
        (not cuda) if resident is None else resident,
        precision,
        trainable_params(spec, arch.shape),
        batch,
        length,
        activation_plan(spec, arch),
        tuple(notes),
    )


# ---------------------------------------------------------------------- docs/memory.md "Weights"
def weights_term(s: Setting) -> Term:
    spec, arch, m = s.spec, s.arch, s.spec.method
    n = arch.total_params
    if m is Method.FULL:
        weights = 4.0 * n
        wf = (
            f"{n:,} params x 4 B (fp32 masters; autocast computes in 16 bits)"
            if s.half
            else f"{n:,} params x 4 B (fp32)"
        )
        if s.half:  # autocast keeps one 16-bit copy of each trained linear weight for the step
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
        base = 2 if s.half else 4
        weights = float(n * base)
        wf = f"{n:,} frozen params x {base} B"
    if s.rss and m in QUANTIZED_METHODS:
        # Quantizing reads every linear weight from the model's file; the tensors loaded as they are (the
        # embeddings) still point into that file's mapping, so the pages read stay in the process's RSS.
        weights += float(arch.linear_params * arch.checkpoint_bytes)
        wf += f" + the file pages read to quantize them ({arch.linear_params:,} x {arch.checkpoint_bytes} B, still mapped)"
    reference = record_for(spec.trainer).reference
    if m is Method.FULL and (reference == "always" or (reference == "beta" and spec.beta > 0)):
        weights += 4.0 * n  # trl loads a second copy as the frozen reference, in the model's dtype
        wf += f" + reference model {n:,} x 4 B"
    return Term(weights, wf)


# ---------------------------------------------------------------------- docs/memory.md "Trainable parameters"
def adapter_term(s: Setting) -> Term:
    """The adapter's own weights (none for a full fine-tune: the weights part holds them)."""
    p, a_elem = s.count.trainable, s.adapter_elem
    if s.spec.method is Method.FULL:
        return Term(0.0, "none (full fine-tune)")
    why = "bf16: trl casts adapters on a quantized base" if a_elem == 2 else "peft keeps adapters in fp32"
    return Term(float(a_elem * p), f"{p:,} trainable params x {a_elem} B ({why})")


def gradient_bytes(s: Setting) -> float:
    """Every trainable parameter's gradient, in the trained weights' dtype."""
    return float(s.adapter_elem * s.count.trainable)


# ---------------------------------------------------------------------- docs/memory.md "Optimizer state"
def optimizer_term(s: Setting) -> tuple[Term, float]:
    """(the state kept between steps, the extra bytes during the step)."""
    shapes = trainable_shapes(s.spec, s.arch, s.count.trainable)
    state, temp, formula = optimizer_bytes(s.spec.optim, s.count.trainable, shapes, s.cuda, s.adapter_elem)
    return Term(state, formula), temp


# ---------------------------------------------------------------------- docs/memory.md "Logits and loss"
def logits_term(s: Setting) -> Term:
    rows, arch = s.batch.sequences, s.arch
    if record_for(s.spec.trainer).score_head:
        # A sequence-classification model: one score per row from the last token, no vocabulary logits;
        # the backward's fp32 gradient of the final hidden states is what the head adds.
        return Term(
            float(rows * s.length * arch.hidden * 4),
            f"reward head: one score per row (no vocabulary logits) + fp32 hidden grad {rows * s.length}x{arch.hidden}",
        )
    # trl folds tiles in a Triton kernel on CUDA; torch ops elsewhere
    found, formula = head_bytes(
        arch, rows * (s.length - 1), s.elem, s.mask_bytes, s.spec.method is Method.FULL, s.cuda, s.rss
    )
    return Term(found, formula)


# ---------------------------------------------------------------------- docs/memory.md "Activations"
def activations_term(s: Setting, logits: float) -> tuple[Term, float, float]:
    """What the blocks keep for the backward (and a MoE block's routed experts, peft's folded expert copies,
    a quantized base's de-quantized weight) and, with checkpointing, the bytes of the recomputed block that
    the head's transient absorbs and the bytes the no-grad forward frees (what it would have saved): the
    allocator may keep both resident (`jobs.memory.trick_effects`)."""
    spec, arch, plan, tokens, elem = s.spec, s.arch, s.plan, s.tokens, s.elem
    per_block = block_elements(arch, plan, s.mask_bytes, elem)
    extra = elementwise_bytes(arch, s.length, elem, s.mask_bytes, s.cuda)
    per_block += extra.per_layer  # the config's dropout layers and composed activation (jobs.memory.elementwise)
    moe, folded, folded_grad = arch.shape.moe, 0.0, 0.0
    if moe is not None:  # docs/memory.md "Mixture of experts": routed top-k activations instead of a dense MLP
        from jobs.memory.moe_parts import dense_mlp_per_token, folded_expert_bytes, routed_bytes_per_token

        routed = routed_bytes_per_token(arch, moe, elem, plan.weights_train) - dense_mlp_per_token(arch) * elem
        per_block += routed * moe.moe_layers / arch.layers
        if adapted_experts(spec, arch):
            weight_bytes = 4 if spec.method in QUANTIZED_METHODS or not s.half else 2
            folded, folded_grad = folded_expert_bytes(moe, weight_bytes, checkpointing.on(spec))
    # docs/memory.md "Activations": a gated delta-net layer's chunked rule (fp32) and a Mamba-2 layer's chunked
    # scan, on top of their blocks' figure.
    delta, mamba2 = delta_net_dims(arch.shape.config), mamba2_dims(arch.shape.config)
    delta_layer = delta_net_bytes(delta, s.batch.sequences, s.length) if delta is not None else 0.0
    mixer_layer = mixer_bytes(mamba2, s.batch.sequences, s.length, elem) if mamba2 is not None else 0.0
    mixers = (delta_layer * delta.layers if delta is not None else 0.0) + (
        mixer_layer * mamba2.layers if mamba2 is not None else 0.0
    )
    absorbed = freed = 0.0
    dequantized = dequantized_bytes(arch, elem) if spec.method in (Method.QLORA, Method.LORA_8BIT) else 0.0
    if checkpointing.on(spec):
        freed = tokens * arch.layers * per_block + mixers
        # Only each block's input stays; one block (its mixer's scan, peft's folded expert copy and its gradient,
        # a de-quantized weight included) is recomputed at a time, after the head's backward has finished, so
        # the larger of the two transients counts, not both.
        recomputed = (
            tokens * (per_block + extra.backward) + max(delta_layer, mixer_layer) + folded + folded_grad + dequantized
        )
        absorbed = min(recomputed, logits)
        acts = tokens * (arch.layers * arch.hidden * elem + extra.checkpointed) + max(0.0, recomputed - logits)
        formula = (
            f"{tokens:,} tokens x {arch.layers} block inputs x {arch.hidden} x {elem} B "
            f"+ one recomputed block ({per_block:,.0f} B/token"
            f"{' and its mixer' if mixers else ''}{', folded expert copy' if folded else ''}"
            f"{', de-quantized weight' if dequantized else ''}) beyond the head's transient"
        )
        folded = dequantized = 0.0  # counted in the recomputed block
    else:  # the last block's backward transient (attention dropout's, a folded copy's gradient) counts beyond the
        # head's, like a recomputed block
        acts = tokens * arch.layers * per_block + mixers + max(0.0, tokens * extra.backward + folded_grad - logits)
        formula = f"{tokens:,} tokens x {arch.layers} layers x {per_block:,.0f} B/token/layer"
    if delta is not None:
        formula += delta_net_formula(delta, delta_layer)
    if mamba2 is not None:
        formula += mixer_formula(mamba2, mixer_layer)
    acts += tokens * arch.hidden * (3 if plan.weights_train else 2) * elem  # final norm and the head's input copy
    acts += tokens * extra.once
    formula += f" (with {extra.words})" if extra.words else ""
    if folded:
        acts += folded
        formula += f" + peft's folded expert weights (W + BA) kept for the backward {human_bytes(folded)}"
    if dequantized:
        acts += dequantized
        formula += " + one de-quantized weight"
    return Term(acts, formula), absorbed, freed


# ---------------------------------------------------------------------- docs/memory.md "Overhead"
def overhead_term(s: Setting, subtotal: float) -> Term:
    if not s.cuda:
        return Term(0.0, "none on the CPU (tensors only)")
    ctx = context_bytes(s.device)
    return Term(
        overhead_at(subtotal, s.device),
        f"CUDA context {ctx / 2**20:.0f} MiB ({s.device.name}) + {ALLOCATOR_SLACK:.0%} allocator slack",
    )


# ---------------------------------------------------------------------- the peak
def _rollout(
    s: Setting,
    spec: JobSpec,
    arch: Arch,
    device: DeviceFacts,
    reward_arch: Arch | None,
    judge_archs: Mapping[str, Arch] | None,
) -> Rollout:
    """A generating trainer's generation and scoring figures (`jobs.memory.rollout`); none for the others."""
    if not s.generates:
        return NO_ROLLOUT
    return rollout(spec, arch, reward_arch, s.batch.length, s.elem, device, s.rss, judge_archs)


def predict(
    spec: JobSpec,
    arch: Arch,
    device: DeviceFacts,
    lengths: RowLengths | None = None,
    *,
    resident: bool | None = None,
    reward_arch: Arch | None = None,
    judge_archs: Mapping[str, Arch] | None = None,
) -> Prediction:
    """The predicted peak of one training step of `spec` on `device` (see docs/memory.md): for the worst
    micro-batch of the rows measured in `lengths`, or for rows of max_length tokens when None.

    `resident`: count what a host process keeps resident (its RSS: what a CPU worker measures) instead of what is
    allocated (torch's figure); default: resident on the CPU, allocated on CUDA. `reward_arch`, `judge_archs`: a grpo
    reward_model_run's model, its judge rewards' by reference (jobs.memory.rollout; missing: the policy's shape)."""
    s = setting(spec, arch, device, lengths, resident)
    p, notes = s.count.trainable, list(s.notes)
    weights, adapter = weights_term(s), adapter_term(s)
    grads = gradient_bytes(s)
    optimizer, opt_temp = optimizer_term(s)
    logits = logits_term(s)
    acts, absorbed, freed = activations_term(s, logits.bytes)
    # The newer tricks change some of these figures (jobs/memory/trick_effects.py).
    per_layer = s.tokens * arch.hidden * s.elem if checkpointing.on(spec) else acts.bytes / arch.layers
    largest_act = s.tokens * max(arch.intermediate, arch.q_dim) * s.elem
    figures = Figures(grads, optimizer.bytes, opt_temp, optimizer.formula, acts.bytes, acts.formula, logits.bytes,
                      per_layer, largest_act, absorbed, freed)  # fmt: skip
    fx = trick_effects(spec, arch, s.cuda, s.rss, figures)
    grads, opt_temp = fx.figures.grads, fx.figures.opt_temp
    optimizer, acts = Term(fx.figures.opt_state, fx.figures.of), Term(fx.figures.acts, fx.figures.actf)
    notes.extend(fx.notes)
    roll = _rollout(s, spec, arch, device, reward_arch, judge_archs)
    notes.extend([*memory_notes(spec), *roll.notes])  # memory_notes: tricks whose effect is not modelled (Liger, ...)
    # in every phase, from loading on; vLLM's share is one block of its own: no allocator slack on it
    held_all = weights.bytes + adapter.bytes + roll.reward_bytes + roll.vllm_bytes
    fixed = held_all + optimizer.bytes
    accumulated = grads if spec.gradient_accumulation_steps > 1 else 0.0
    backward = fixed + acts.bytes + logits.bytes + accumulated
    step = fixed + grads + opt_temp
    peak = peak_phase(p, fixed, (backward, step, grads, opt_temp, accumulated), (optimizer, acts, logits), roll)
    notes.extend(peak.notes)
    o, a, lg, before = peak.held
    subtotal = held_all + peak.gradients.bytes + o.bytes + a.bytes + lg.bytes + before.bytes
    overhead = overhead_term(s, subtotal - roll.vllm_bytes)
    if not s.cuda and fx.heap_bytes:  # glibc's retained heap on the CPU (jobs/memory/trick_effects.py)
        overhead = Term(fx.heap_bytes, fx.heap_formula)
    runtime = Term(*runtime_part(device, spec.trainer, s.cuda))
    # The first optimizer step, as the training child measures it (docs/memory.md "Phases"): no optimizer
    # state exists before it, so the backward's figure is the peak of later steps less that state; a
    # generating trainer generates and scores before its forward.
    first = {"load": held_all}
    if s.generates:
        first.update(generation=held_all + roll.generation_bytes, scoring=held_all + roll.scoring_bytes)
    first.update(forward=held_all + acts.bytes + logits.bytes, backward=backward - optimizer.bytes - accumulated)
    first["optimizer"] = step
    phases = {name: int(v + overhead_at(v - roll.vllm_bytes, device) + runtime.bytes) for name, v in first.items()}
    if spec.optim in (Optim.PAGED_ADAMW_8BIT, Optim.PAGED_ADAMW_32BIT) and s.cuda:
        notes.append("paged optimizer: its state can move to CPU RAM under pressure, so the peak may be lower")
    named = [("weights", weights), ("adapter", adapter), ("gradients", peak.gradients), ("optimizer", o),
             ("activations", a), ("logits", lg), ("overhead", overhead), ("runtime", runtime)]  # fmt: skip
    if s.generates:  # docs/memory.md "Generation and scoring"
        named[6:6] = [("generation", before), ("reward_model", Term(roll.reward_bytes, roll.reward_formula))]
    if roll.vllm_formula:  # use_vllm (docs/memory.md "Generation with vLLM")
        named[8:8] = [(VLLM_PART, Term(roll.vllm_bytes, roll.vllm_formula))]
    return Prediction(
        tuple(Part(name, int(t.bytes), t.formula) for name, t in named),
        peak.phase,
        device,
        p,
        s.count.total if spec.method is not Method.FULL else arch.total_params,
        s.precision.value,
        tuple(notes),
        batch=s.batch,
        phases=phases,
        lengths=lengths.stats(spec.max_length) if lengths is not None else None,
        active_params=moe_active_params(arch),
        not_modelled=modelled_out(arch.shape),
        host_bytes=int(fx.host_bytes),
    )
