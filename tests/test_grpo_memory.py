"""GRPO's memory prediction per phase (jobs.memory.rollout): generation's KV cache, the reference pass only
when beta > 0, a reward model's weights beside the policy. The figures are computed from the model's shape
(SmolLM2-135M's published config: 30 layers, 3 KV heads of 64, vocabulary 49,152); what they predict
against real CPU runs is `bench/grpo_memory.py`'s (docs/memory.md "Generation and scoring").
"""

from __future__ import annotations

import pytest

from jobs.devices.facts import DeviceFacts
from jobs.memory.model_config import arch_for
from jobs.memory.predict import predict
from jobs.spec.job import JobSpec

CPU = DeviceFacts(kind="cpu", name="cpu", total_bytes=64 * 2**30, runtime_bytes=400 * 2**20)
H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", total_bytes=139 * 2**30, compute_capability="9.0", bf16=True)


@pytest.fixture(scope="module")
def arch():
    return arch_for("smollm2-135m-instruct")


def grpo(**changes) -> JobSpec:
    fields = {
        "trainer": "grpo",
        "dataset": "sample:prompt-format",
        "rewards": "repetition",
        "method": "lora",
        "max_length": 64,
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "max_completion_length": 32,
        "beta": 0.0,
        "precision": "fp32",
    }
    return JobSpec.from_dict({**fields, **changes})


def generation(spec: JobSpec, arch, device: DeviceFacts = CPU) -> int:
    """The generation phase's bytes beyond what was loaded."""
    p = predict(spec, arch, device)
    return p.phases["generation"] - p.phases["load"]


def kv(arch, completions: int, tokens: int, elem: int = 4) -> int:
    return 2 * arch.layers * arch.kv_dim * elem * completions * tokens


def test_the_kv_cache_grows_with_the_generations_and_the_completion_length(arch) -> None:
    """One generation batch holds every completion of an optimizer step: per_device_train_batch_size x
    gradient_accumulation_steps (trl's generation_batch_size), each prompt + max_completion_length long."""
    base = generation(grpo(), arch)
    longer = generation(grpo(max_completion_length=96), arch)
    # the cache (and its one-layer growth copy) for 64 more tokens x 4 completions; nothing else changes
    assert longer - base == pytest.approx(kv(arch, 4, 64) * (1 + 1 / arch.layers), abs=2)
    more = generation(grpo(num_generations=8, per_device_train_batch_size=8), arch)
    accumulated = generation(grpo(num_generations=8, gradient_accumulation_steps=2), arch)
    assert more == accumulated  # the same 8 completions of 96 tokens are generated at once either way
    assert more - base >= kv(arch, 4, 96)
    p = predict(grpo(max_completion_length=96), arch, CPU)
    assert (
        "KV cache 2 x 30 layers x 192 x 4 B x 4 completions x (64 prompt + 96 completion)"
        in p.to_dict()["formulas"]["generation"]
    )


def test_a_long_generation_batch_peaks_in_generation(arch) -> None:
    """64 completions of 4,096 tokens generated at once, trained one at a time: the KV cache is the peak."""
    spec = grpo(
        num_generations=8,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=64,
        max_completion_length=4096,
        gradient_checkpointing=True,
    )
    p = predict(spec, arch, H200)
    assert p.phase == "generation"
    assert p.part("generation") >= kv(arch, 64, 64 + 4096, elem=2)
    assert p.part("activations") == 0 and p.part("logits") == 0
    assert p.total_bytes >= p.phases["generation"]


def test_the_reference_pass_is_there_only_when_beta_is_not_zero(arch) -> None:
    """trl keeps no reference at beta 0; with peft it scores with the adapter off, per micro-batch."""
    without = predict(grpo(beta=0.0), arch, CPU)
    with_kl = predict(grpo(beta=0.04), arch, CPU)
    assert without.phases["scoring"] == without.phases["load"]  # nothing to score with: no reference, no model
    assert with_kl.phases["scoring"] > with_kl.phases["load"] + 0.5 * 4 * 96 * arch.hidden * 4
    assert "reference log-probs of 4 completions" in with_kl.to_dict()["formulas"]["generation"]
    assert "reference log-probs" not in without.to_dict()["formulas"]["generation"]
    # a full fine-tune's reference is a second model: its weights, only with beta > 0
    full_kl = predict(grpo(method="full", beta=0.04), arch, CPU).part("weights")
    full = predict(grpo(method="full", beta=0.0), arch, CPU).part("weights")
    assert full_kl - full == 4 * arch.total_params


def test_a_reward_model_runs_weights_stay_beside_the_policy(arch) -> None:
    """A reward run's sequence-classification model (its LM head replaced by a one-output score), loaded in the
    run's precision, counts in every phase; its shape is its own model's when known."""
    from jobs.memory.rollout import reward_params

    plain = predict(grpo(), arch, CPU)
    scored = predict(grpo(reward_model_run=7), arch, CPU)
    weights = reward_params(arch) * 4
    assert reward_params(arch) == arch.total_params + arch.hidden  # SmolLM2 ties its head: only the score is new
    assert scored.part("reward_model") == weights and plain.part("reward_model") == 0
    assert scored.total_bytes - plain.total_bytes == pytest.approx(weights, abs=2)
    assert scored.phases["load"] - plain.phases["load"] == pytest.approx(weights, abs=2)
    assert any("reward_model_run 7" in n and "policy's shape" in n for n in scored.notes)
    small = arch_for("tiny-llama")
    other = predict(grpo(reward_model_run=7), arch, CPU, reward_arch=small)
    assert other.part("reward_model") == reward_params(small) * 4
    assert not any("policy's shape" in n for n in other.notes)
    half = predict(grpo(reward_model_run=7, precision="bf16"), arch, H200)
    assert half.part("reward_model") == reward_params(arch) * 2  # scored in the run's compute precision


def test_the_check_reads_the_reward_runs_own_model(store) -> None:
    """At submit the reward run's model is looked up in the store: its shape, not the policy's."""
    from jobs.checks.memory import reward_model_arch

    reward_run = store.create_run(
        JobSpec.from_dict({"model": "tiny-llama", "trainer": "reward", "dataset": "sample:preference-format"})
    )
    found = reward_model_arch(store, grpo(reward_model_run=reward_run))
    assert found is not None and found.total_params == arch_for("tiny-llama").total_params
    assert reward_model_arch(store, grpo()) is None
    assert reward_model_arch(store, grpo(reward_model_run=reward_run + 99)) is None


def test_other_trainers_keep_their_eight_parts(arch) -> None:
    from jobs.memory.breakdown import GENERATION_PARTS, PART_NAMES

    sft = predict(JobSpec(max_length=128), arch, CPU)
    assert [p.name for p in sft.parts] == list(PART_NAMES)
    assert set(sft.phases) == {"load", "forward", "backward", "optimizer"}
    names = [p.name for p in predict(grpo(), arch, CPU).parts]
    assert names == [*PART_NAMES[:6], *GENERATION_PARTS, *PART_NAMES[6:]]


def test_the_bench_cases_are_valid_grpo_specs(arch) -> None:
    """bench/grpo_memory.py's cases parse with its settings and cover LoRA, full, beta 0 and > 0, a long
    generation batch and a reward-model run (no training here: the bench trains)."""
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.grpo_memory import cases, with_reward_model
    from bench.memory_runs import FAST

    jobs = [*cases("smollm2-135m-instruct"), with_reward_model("smollm2-135m-instruct", 1)]
    specs = {j.name: JobSpec.from_dict({**j.fields, **FAST, "max_steps": 2}) for j in jobs}
    assert {s.method.value for s in specs.values()} >= {"lora", "full"}
    assert {s.beta > 0 for s in specs.values()} == {True, False}
    assert specs["lora-reward-model"].reward_model_run == 1
    assert (
        predict(specs["lora-long"], arch, CPU).phases["generation"]
        > predict(specs["lora-beta0"], arch, CPU).phases["generation"]
    )
