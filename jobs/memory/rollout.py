"""A generating trainer's phases before its training step (GRPO): generation and scoring, and a reward
model's weights held beside the policy throughout. docs/memory.md "Generation and scoring".

trl 1.16's GRPOTrainer forms one generation batch per optimizer step: generation_batch_size =
per_device_train_batch_size x steps_per_generation, and steps_per_generation defaults to
gradient_accumulation_steps, so a batch holds `spec.effective_batch_size` completions (each prompt
repeated num_generations times). Per batch, in order:

1. generation: `model.generate` over the whole batch at once (no grad, gradient checkpointing off): a
   KV cache that grows to prompt + max_completion_length tokens per completion (transformers'
   DynamicCache concatenates a layer's keys and values per token, so one layer's copy is briefly
   doubled), the prefill's transients (one block at a time) and the sampled position's fp32 logits
   (`logits_to_keep=1`) with the sampler's copies of them;
2. scoring: with beta != 0 the reference log-probs, per micro-batch under no_grad (a peft model with
   its adapter disabled; a full fine-tune's second model, whose weights the weights part holds),
   through trl's fused LM head; each reward model scores every completion of the batch at once
   under inference_mode;
3. training: the micro-batch's forward and backward (`jobs.memory.predict`).

With use_vllm (trl's colocate mode, `jobs.config.vllm`) vLLM samples instead of `model.generate`, in the share of
the GPU it reserved when the trainer started (`vllm_share`: the prediction's `vllm` part, held in every phase):
generation adds nothing in the training process, and scoring gains the policy's own log-probs per micro-batch,
which trl recomputes to correct for vLLM's sampling (the size of the reference pass).

The reward model (a finished reward run: `jobs.train.reward_model`) is loaded before training in the
run's compute precision and stays: its weights count in every phase. Its shape is its own model's
(`reward` below); without one (the run is not readable where the prediction is made) the policy's
shape stands in and a note says so. A judge reward's local judge model (`jobs.train.judges`: loaded on the first
scoring, held for the run) counts the same way in the `reward_model` part, its generation (a few tokens for each of
JUDGE_BATCH prompts at a time) in the scoring phase; an endpoint judge adds nothing.

    r = rollout(spec, arch, reward_arch, prompt=longest_prompt, elem=4, device=facts, resident=True)
    r.reward_bytes, r.generation_bytes, r.scoring_bytes     # and each one's formula
    r.vllm_bytes                                            # use_vllm: vLLM's share of the GPU
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobs.devices.facts import DeviceFacts
from jobs.memory.parts import Arch, head_bytes
from jobs.spec.job import JobSpec
from jobs.spec.rewards import JUDGE_BATCH, JUDGE_REPLY_TOKENS
from jobs.units import human_bytes

SAMPLER_COPIES = 4  # the sampled position's logits: fp32 upcast, temperature-scaled, softmax, the sampler's draw


@dataclass(frozen=True)
class Rollout:
    """Bytes of the generation and scoring phases beyond what every phase holds, and the reward model's weights."""

    reward_bytes: float
    reward_formula: str
    generation_bytes: float
    generation_formula: str
    scoring_bytes: float
    scoring_formula: str
    notes: tuple[str, ...] = ()
    vllm_bytes: float = 0.0  # use_vllm: vLLM's reserved share of the GPU, held from the trainer's start on
    vllm_formula: str = ""


def vllm_share(fraction: float, device: DeviceFacts) -> tuple[float, str]:
    """What vLLM reserves in colocate mode when the trainer starts: `fraction` of the GPU's total memory, for its
    own copy of the weights, its activations and its KV cache (`jobs.config.vllm`); none off CUDA (refused)."""
    head = f"vLLM (colocate, {fraction:.0%} of GPU)"
    if not device.cuda:
        return 0.0, f"{head}: none, vLLM runs on CUDA GPUs only (refused at submit)"
    if not device.total_bytes:
        return 0.0, f"{head}: the GPU's total memory is not known, so its share is not counted"
    share = fraction * device.total_bytes
    return share, (
        f"{head}: {fraction:g} x {human_bytes(device.total_bytes)} ({device.name}) reserved when the trainer "
        "starts for its copy of the weights and its KV cache"
    )


def kv_cache_bytes(arch: Arch, sequences: int, tokens: int, elem: int) -> float:
    """Keys and values of every layer for `sequences` x `tokens` positions."""
    return 2.0 * arch.layers * arch.kv_dim * elem * sequences * tokens


def block_transient(arch: Arch, tokens: int, elem: int) -> float:
    """The most a block holds at once in a forward without grad: the residual stream and its normed copy, and
    the larger of the attention's q, k, v with their rotated copies and the output, or a (gated) MLP's
    intermediates (gate's activation, up and their product)."""
    attention = 2 * arch.q_dim + 4 * arch.kv_dim + arch.hidden
    mlp = (3 if arch.gated_mlp else 2) * arch.intermediate
    return float(tokens * (2 * arch.hidden + max(attention, mlp)) * elem)


def reward_params(arch: Arch) -> int:
    """A sequence-classification model of `arch`: its LM head (when untied) replaced by a one-output score."""
    return arch.total_params - arch.head_params + arch.hidden


JUDGE_TEMPLATE_TOKENS = 64  # the judge prompt's own words around the rubric, the prompt and the completion


def judges(
    spec: JobSpec, arch: Arch, judge_archs: Mapping[str, Arch], length: int, elem: int
) -> tuple[float, list[str], float, str, list[str]]:
    """The local judge models of `spec`'s judge rewards (each loaded once, held for the run: `jobs.train.judges`):
    (their weights' bytes, one formula each, the largest one's generation transient while scoring, its formula,
    notes); an endpoint judge adds nothing. `judge_archs`: each judge's shape by reference (missing: the policy's)."""
    weights, formulas, notes = 0.0, [], []
    transient, transient_formula = 0.0, ""
    refs = dict.fromkeys(r.local_judge for r in spec.declared_rewards if r.local_judge)
    for ref in refs:
        assert ref is not None
        shape = judge_archs.get(ref)
        if shape is None:
            notes.append(f"reward judge {ref}: its model is not readable here, so it is counted at the policy's shape")
            shape = arch
        weights += shape.total_params * elem
        formulas.append(f"reward judge {ref}'s model: {shape.total_params:,} params x {elem} B")
        rubric = max(len(r.rubric or "") for r in spec.declared_rewards if r.local_judge == ref) // 3
        tokens = length + rubric + JUDGE_TEMPLATE_TOKENS + JUDGE_REPLY_TOKENS  # rubric: ~3 characters a token
        kv = kv_cache_bytes(shape, JUDGE_BATCH, tokens, elem)
        scored = kv + kv / shape.layers + block_transient(shape, JUDGE_BATCH * tokens, elem)
        scored += JUDGE_BATCH * shape.vocab * 4.0 * SAMPLER_COPIES
        if scored > transient:
            transient = scored
            transient_formula = (
                f"reward judge {ref} answering {JUDGE_BATCH} prompts of {tokens} tokens: KV cache {human_bytes(kv)} "
                f"+ its block transient + the sampled logits {human_bytes(scored)}"
            )
    return weights, formulas, transient, transient_formula, notes


def rollout(
    spec: JobSpec,
    arch: Arch,
    reward_arch: Arch | None,
    prompt: int,
    elem: int,
    device: DeviceFacts,
    resident: bool,
    judge_archs: Mapping[str, Arch] | None = None,
) -> Rollout:
    """The generation and scoring figures of `spec` whose prompts are `prompt` tokens long (the longest) on
    `device` (its total memory sizes vLLM's share with use_vllm); `judge_archs`: its judge rewards' local models'
    shapes by reference (`judges`)."""
    batch = spec.effective_batch_size  # one generation batch: every completion of an optimizer step
    length = prompt + spec.max_completion_length
    cuda = device.cuda
    notes: list[str] = []
    # 1. generation
    kv = kv_cache_bytes(arch, batch, length, elem)
    kv_growth = kv / arch.layers  # one layer's keys and values copied as the cache grows by a token
    prefill = block_transient(arch, batch * prompt, elem)
    sampled = batch * arch.vocab * 4.0 * SAMPLER_COPIES
    generation = kv + kv_growth + prefill + sampled
    generation_formula = (
        f"KV cache 2 x {arch.layers} layers x {arch.kv_dim} x {elem} B x {batch} completions x ({prompt} prompt + "
        f"{spec.max_completion_length} completion) tokens {human_bytes(kv)} + one layer's copy as it grows "
        f"+ the prefill's block transient {human_bytes(prefill)} + the sampled position's logits "
        f"{batch}x{arch.vocab}x4 B x {SAMPLER_COPIES}"
    )
    vllm, vllm_formula = 0.0, ""
    if spec.use_vllm:  # vLLM samples in its own share (the `vllm` part): transformers' generate never runs
        vllm, vllm_formula = vllm_share(spec.vllm_gpu_memory_utilization, device)
        generation = 0.0
        generation_formula = "none here: vLLM samples the completions in its reserved share (the vllm part)"
    # 2. scoring: the reference pass per micro-batch, then each reward model over the whole batch
    passes: list[tuple[float, str]] = []
    rows = spec.per_device_train_batch_size * length
    head, _ = head_bytes(arch, rows, elem, 1 if cuda else elem, False, cuda, resident)
    head -= rows * arch.hidden * 4  # a forward: no hidden-state gradient
    forward = block_transient(arch, rows, elem) + head  # one micro-batch's log-probs without gradients
    n = spec.per_device_train_batch_size
    if spec.beta != 0:
        passes.append((forward, f"reference log-probs of {n} completions {human_bytes(forward)}"))
    if spec.use_vllm:  # trl recomputes the policy's log-probs to correct for vLLM's sampling (importance sampling)
        passes.append(
            (forward, f"the policy's log-probs of {n} completions (vLLM's correction) {human_bytes(forward)}")
        )
    reward, reward_formula = 0.0, "none (no reward model run)"
    if spec.reward_model_run is not None:
        shape = reward_arch if reward_arch is not None else arch
        if reward_arch is None:
            notes.append(
                f"reward_model_run {spec.reward_model_run}: its model is not readable here, so its weights are "
                "counted at the policy's shape"
            )
        params = reward_params(shape)
        reward = float(params * elem)
        reward_formula = f"reward run {spec.reward_model_run}'s model: {params:,} params x {elem} B (run's precision)"
        scored = block_transient(shape, batch * length, elem) + batch * length * shape.hidden * elem
        passes.append((scored, f"reward model scoring {batch} completions {human_bytes(scored)}"))
    judged, judge_formulas, judging, judging_formula, judge_notes = judges(spec, arch, judge_archs or {}, length, elem)
    if judged:
        reward += judged
        reward_formula = " + ".join(([reward_formula] if spec.reward_model_run is not None else []) + judge_formulas)
        notes += judge_notes
        passes.append((judging, judging_formula))
    scoring = max((b for b, _ in passes), default=0.0)
    scoring_formula = " or ".join(f for _, f in passes) if passes else "no reference pass (beta 0), no reward model"
    return Rollout(
        reward,
        reward_formula,
        generation,
        generation_formula,
        scoring,
        scoring_formula,
        tuple(notes),
        vllm,
        vllm_formula,
    )


NO_ROLLOUT = Rollout(0.0, "", 0.0, "", 0.0, "")  # a trainer that does not generate
