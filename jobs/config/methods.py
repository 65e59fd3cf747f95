"""Pure mapping of the adapter methods beyond the LoRA family (and LoRA's initialisations) to peft configs.

Spec in, (peft config class name, keyword arguments) out, as in `jobs.config.mapping`; no I/O. Each method's
memory/speed trade-off is written next to its mapping. The combinations peft refuses, found by
running each with tunedeck's checks switched off (tests/test_methods.py), are refused here first.
Found to run on the CPU (trl 1.16, peft 0.21.2): every method here with SFT, DPO and gradient
checkpointing; EVA with gradient checkpointing and with dora/qlora; PiSSA/OLoRA with dora. An
oft_block_size that does not divide a layer's input features is not refused: peft moves it to the
nearest divisor (and warns), and the pre-launch count, taken from peft, follows.

    found = method_kwargs(spec)              # ("LoKrConfig", {...}) or None for other methods
    problems = method_problems(spec, shape)  # [] or reasons to refuse, with the fix
"""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import LoraInit, Method
from jobs.spec.job import JobSpec

# peft's LLaMA-Adapter patches the attention of these model types only (peft.tuners.adaption_prompt.config).
ADAPTION_PROMPT_MODEL_TYPES = ("llama", "mistral", "gpt2")
# peft's exact SVD for PiSSA (not its randomized "pissa_niter_N"): deterministic, so a resumed run
# rebuilds the same residual base; it costs one full SVD per targeted weight at start-up.
PISSA_INIT = "pissa"


def targets(spec: JobSpec) -> str | list[str]:
    """`all-linear` passes through (peft expands it); a comma list becomes names."""
    raw = spec.lora_target_modules.strip()
    if raw == "all-linear":
        return raw
    return [name.strip() for name in raw.split(",") if name.strip()]


def lora_init_kwargs(spec: JobSpec) -> dict[str, Any]:
    """LoraConfig's `init_lora_weights` (and EVA's settings) for the spec's lora_init."""
    init = spec.lora_init
    # PiSSA puts the top-r singular directions of W into A and B and leaves the residual in the
    # base: the adapter starts on the weight's main directions, often converging faster than LoRA.
    # OLoRA does the same with a QR decomposition. Both change the base weights: the saved adapter
    # is converted back to one for the original base (twice the rank) - see jobs/lora_init.py.
    if init is LoraInit.PISSA:
        return {"init_lora_weights": PISSA_INIT}
    if init is LoraInit.OLORA:
        return {"init_lora_weights": "olora"}
    # EVA: A starts as the top singular vectors of each layer's inputs, from one pass over training
    # batches before step 1 (a few forward passes, no backward). rho=1 keeps r in every layer, so the
    # trainable parameter count is the one shown before launch (rho > 1 redistributes ranks).
    if init is LoraInit.EVA:
        return {"init_lora_weights": "eva", "eva_config": {"rho": 1.0}}
    # LoftQ (qlora): peft's replace_lora_weights_loftq re-initialises A and B after loading so that
    # quantized W + B A is closer to the 16-bit W; the config itself keeps the default init.
    return {}


def method_kwargs(spec: JobSpec) -> tuple[str, dict[str, Any]] | None:
    """(peft config class name, kwargs) for mora, adaption_prompt, lokr, loha, oft, vera, miss, hira; else None."""
    m = spec.method
    base: dict[str, Any] = {"task_type": "CAUSAL_LM"}
    # MoRA: one r^ x r^ matrix per layer, r^ = floor(sqrt((in + out) r)); LoRA's parameters and
    # memory, but the compress/decompress reshapes cost a little more time per layer (jobs/config/mora.py).
    if m is Method.MORA:
        return "MoraConfig", {
            **base,
            "r": spec.lora_r,
            "lora_dropout": spec.lora_dropout,
            "target_modules": targets(spec),
            "mora_type": spec.mora_type.value,
            "bias": "none",
        }
    # LLaMA-Adapter: adapter_len learned prompt tokens in each of the top adapter_layers layers, with
    # a zero-initialised gate; tiny parameter count, a little extra attention per adapted layer.
    if m is Method.ADAPTION_PROMPT:
        return "AdaptionPromptConfig", {**base, "adapter_len": spec.adapter_len, "adapter_layers": spec.adapter_layers}
    # LoKr / LoHa (LyCORIS): the update is a Kronecker product (LoKr) or a Hadamard product of two
    # low-rank products (LoHa): higher rank than LoRA for similar parameters; LoHa keeps four
    # factors per layer and recomputes their product each step (more activation memory than LoRA).
    if m is Method.LOKR:
        return "LoKrConfig", {**base, "r": spec.lora_r, "alpha": spec.lora_alpha, "target_modules": targets(spec)}
    if m is Method.LOHA:
        return "LoHaConfig", {**base, "r": spec.lora_r, "alpha": spec.lora_alpha, "target_modules": targets(spec)}
    # OFT: multiplies each weight by a block-diagonal orthogonal matrix (Cayley transform of skew
    # blocks): keeps the angles between neurons; a rotation matrix is built per step, more compute.
    if m is Method.OFT:
        return "OFTConfig", {**base, "r": 0, "oft_block_size": spec.oft_block_size, "target_modules": targets(spec)}
    # VeRA: one pair of frozen random matrices shared by all layers, only two scaling vectors per
    # layer train: 10x fewer parameters than LoRA; wants a large r (peft's default is 256).
    if m is Method.VERA:
        return "VeraConfig", {
            **base,
            "r": spec.lora_r,
            "vera_dropout": spec.lora_dropout,
            "target_modules": targets(spec),
        }
    # MiSS: one small shard matrix shared across the weight's rows; faster and lighter than LoRA.
    if m is Method.MISS:
        return "MissConfig", {
            **base,
            "r": spec.lora_r,
            "miss_dropout": spec.lora_dropout,
            "target_modules": targets(spec),
        }
    # HiRA: the update is W0 * (B A) elementwise, so its rank follows W0's, at LoRA's parameter count;
    # the Hadamard product with the full weight costs one weight-sized tensor per layer in the step.
    if m is Method.HIRA:
        return "HiraConfig", {
            **base,
            "r": spec.lora_r,
            "hira_dropout": spec.lora_dropout,
            "target_modules": targets(spec),
        }
    return None


def config_class(name: str) -> Any:
    """The peft config class of that name, or tunedeck's MoraConfig."""
    if name == "MoraConfig":
        from jobs.config.mora import MoraConfig

        return MoraConfig
    import peft

    return getattr(peft, name)


def method_problems(spec: JobSpec, shape: Any = None) -> list[Problem]:
    """What peft refuses for the spec's method; `shape` (jobs.memory.shape.ModelShape) enables the model checks."""
    m = spec.method
    out: list[Problem] = []
    if shape is None:
        return out
    if m is Method.ADAPTION_PROMPT:
        if shape.model_type not in ADAPTION_PROMPT_MODEL_TYPES:
            out.append(
                Problem(
                    "method",
                    f"peft's adaption_prompt (LLaMA-Adapter) supports model types "
                    f"{', '.join(ADAPTION_PROMPT_MODEL_TYPES)}; {spec.model} is {shape.model_type}",
                    "use a llama, mistral or gpt2 model, or another method such as lora",
                )
            )
        elif spec.adapter_layers > shape.num_layers:
            out.append(
                Problem(
                    "adapter_layers",
                    f"{spec.adapter_layers} is more than the model's {shape.num_layers} layers",
                    f"use at most {shape.num_layers}",
                )
            )
    return out
