"""GRPO's generation through vLLM (`use_vllm`): what cannot run that way (its GRPOConfig keywords:
`jobs.config.trainers.KWARG_VALUES`, `vllm_max_model_length`).

Always trl's colocate mode: vLLM runs inside the training process on the same GPU, in a share of its memory
reserved when the trainer starts (`vllm_gpu_memory_utilization`; the predictor's `vllm` part,
`jobs.memory.rollout.vllm_share`). trl's server mode needs a vLLM server started apart (`trl vllm-serve`) on GPUs
of its own, which a tunedeck worker does not start. Pure: the device and whether the package is installed
come in as arguments (`jobs.config.mapping.device_problems`, `jobs.checks.trick_packages`).

What trl 1.16 does with the policy in colocate mode (`trl/generation/vllm_generation.py`): vLLM loads the base
model again from its name or folder (`LLM(model=model.name_or_path, ...)`), and before each generation
`sync_weights` pushes the policy's weights into it; a peft model has its adapter merged in place
(`merge_adapter`), its base weights pushed under their base names, then unmerged. Hence the refusals:

- lora_8bit: trl raises "vLLM does not support in-flight 8-bit quantization." when it meets a Linear8bitLt;
- qlora: trl starts vLLM with quantization="bitsandbytes" (vLLM quantizes the base again, with scales of its
  own), then pushes the merged layers' packed 4-bit data without their quantization state; trl issue #3654
  reports vLLM's weight loader failing on the shapes ("assert param_data.shape == loaded_weight.shape");
- prompt_tuning, prefix_tuning, p_tuning, adaption_prompt: their virtual tokens or gated prompts are not
  weights of the base, so there is nothing to merge (peft 0.21: AttributeError "'LlamaForCausalLM' object has no
  attribute 'merge_adapter'", tried on a tiny Llama for all four) and vLLM would sample from the bare base.

    problems = vllm_device_problems(spec, device) + vllm_method_problems(spec)   # jobs.config.mapping's checks
    vllm_package_problems(spec, device, installed)                              # jobs.checks.trick_packages
    vllm_length_problems(spec, longest_prompt)                                  # jobs.checks.pipeline, measured
"""

from __future__ import annotations

from jobs.errors import Problem
from jobs.spec.enums import PROMPT_FAMILY, Method
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from jobs.spec.tricks.record import HasCuda

MODULE = "vllm"  # what `jobs.checks.trick_packages` looks up
EXTRA = "tunedeck[vllm]"  # pyproject.toml's optional extra: trl's own vllm extra (the vLLM versions trl 1.16 supports)
TURN_OFF = "set use_vllm: false (transformers' generate samples the completions)"
# method -> why trl's colocate mode cannot serve it (the module's docstring has the detail)
REFUSED_METHODS: dict[Method, str] = {
    Method.LORA_8BIT: "trl refuses an 8-bit base with vLLM ('vLLM does not support in-flight 8-bit quantization')",
    Method.QLORA: (
        "trl pushes the merged 4-bit weights to vLLM without their quantization scales, which vLLM computed "
        "for itself when it loaded the base (trl issue #3654: vLLM's loader fails on their shapes)"
    ),
    **{
        m: f"{m.value} adds virtual tokens, not weights: trl cannot merge it into the weights it pushes to vLLM, "
        "so vLLM would sample from the bare base"
        for m in sorted(PROMPT_FAMILY, key=lambda m: m.value)
    },
    Method.ADAPTION_PROMPT: (
        "adaption_prompt adds gated prompts, not weights: trl cannot merge it into the weights it pushes to vLLM, "
        "so vLLM would sample from the bare base"
    ),
}


def _applies(spec: JobSpec) -> bool:
    """use_vllm under a trainer that generates (under another one the spec's own check refuses the field)."""
    return spec.use_vllm and record_for(spec.trainer).generates


def vllm_device_problems(spec: JobSpec, device: HasCuda) -> list[Problem]:
    """use_vllm on a device that is not a CUDA GPU."""
    if not _applies(spec) or device.cuda:
        return []
    return [
        Problem(
            "use_vllm",
            "vLLM runs on CUDA GPUs only, and this run would start on the CPU",
            f"{TURN_OFF}, or run it on a GPU worker",
        )
    ]


def vllm_package_problems(spec: JobSpec, device: HasCuda, installed: bool) -> list[Problem]:
    """use_vllm where the vllm package is not installed (on a CUDA device only: elsewhere the device is refused)."""
    if not _applies(spec) or installed or not device.cuda:
        return []
    return [
        Problem(
            "use_vllm",
            "needs the Python package vllm, which is not installed where the run would start",
            f"pip install '{EXTRA}' on the GPU worker, or {TURN_OFF}",
        )
    ]


def vllm_method_problems(spec: JobSpec) -> list[Problem]:
    """use_vllm with a method trl's colocate mode cannot pass to vLLM."""
    why = REFUSED_METHODS.get(spec.method) if _applies(spec) else None
    if why is None:
        return []
    return [
        Problem(
            "use_vllm",
            f"cannot sample for method: {spec.method.value}: {why}",
            f"use method: lora (or another adapter that merges into the weights, or full), or {TURN_OFF}",
        )
    ]


def vllm_length_problems(spec: JobSpec, longest_prompt: int | None) -> list[Problem]:
    """A training prompt longer than max_length with use_vllm: grpo keeps prompts whole, and vLLM's context is
    max_length + max_completion_length (`jobs.config.trainers.vllm_max_model_length`), so vLLM would refuse it
    at generation. `longest_prompt`: the data's longest prompt in tokens (None: not measured)."""
    if not _applies(spec) or longest_prompt is None or longest_prompt <= spec.max_length:
        return []
    context = spec.max_length + spec.max_completion_length
    return [
        Problem(
            "max_length",
            f"the longest training prompt has {longest_prompt} tokens; with use_vllm, vLLM's context is max_length "
            f"+ max_completion_length ({context} tokens) and it refuses a longer prompt when it generates",
            f"set max_length: {longest_prompt} or more, or drop the longest prompts",
        )
    ]
