"""The newer memory tricks: mapping tables, refusals, predicted parts, Fit to GPU, and real CPU training.

Liger, activation offloading, 8-bit GaLore and torch.compile cannot run (or not in reasonable time) on
this CPU: they are tested by mapping and refusal. GaLore, APOLLO, LoRA+ and NEFTune train here.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobs.config.mapping import capability_problems, capability_warnings, training_kwargs
from jobs.devices.facts import CPU, Device, DeviceFacts
from jobs.memory.model_config import arch_for
from jobs.memory.planner import fit
from jobs.memory.predict import predict
from jobs.memory.trick_effects import low_rank_targets
from jobs.spec.job import JobSpec
from jobs.spec.tricks.loraplus import loraplus_kwargs
from jobs.spec.tricks.registry import package_problems, trick_kwargs

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QWEN7B = ROOT / "tests" / "fixtures" / "qwen2.5-7b"
GIB = 2**30
H100 = Device(cuda=True, bf16=True, compute_capability=(9, 0), name="NVIDIA H100")
H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", total_bytes=139 * GIB, compute_capability="9.0", bf16=True)
CPU_FACTS = DeviceFacts(kind="cpu", name="cpu", total_bytes=16 * GIB)


def S(**fields: Any) -> JobSpec:
    return JobSpec.from_dict(fields)


@pytest.fixture(scope="module")
def qwen7b():
    return arch_for(str(QWEN7B))


# ---------------------------------------------------------------------- mapping
@pytest.mark.parametrize(
    "fields, expected",
    [
        ({}, {}),
        ({"use_liger_kernel": True}, {"use_liger_kernel": True}),
        ({"activation_offloading": True}, {"activation_offloading": True}),
        ({"torch_compile": True}, {"torch_compile": True}),
        ({"neftune_noise_alpha": 5.0}, {"neftune_noise_alpha": 5.0}),
        (
            {"method": "full", "optim": "galore_adamw"},
            {"optim_target_modules": "all-linear", "optim_args": "rank=128,update_proj_gap=200"},
        ),
        (
            {"method": "full", "optim": "apollo_adamw_layerwise", "optim_rank": 8, "optim_update_proj_gap": 50},
            {"optim_target_modules": "all-linear", "optim_args": "rank=8,update_proj_gap=50"},
        ),
        (
            {"method": "full", "optim": "galore_adamw", "optim_target_modules": "q_proj, v_proj"},
            {"optim_target_modules": ["q_proj", "v_proj"], "optim_args": "rank=128,update_proj_gap=200"},
        ),
        (
            {"method": "full", "optim": "galore_adamw", "optim_target_modules": r".*attn.*"},
            {"optim_target_modules": r".*attn.*", "optim_args": "rank=128,update_proj_gap=200"},
        ),
        ({"cpu_return_freed_memory": True}, {}),  # the worker's environment, not a trainer argument
    ],
)
def test_trick_kwargs(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = S(**fields)
    assert trick_kwargs(spec) == expected
    assert expected.items() <= training_kwargs(spec, H100, "out").items()


@pytest.mark.parametrize(
    "ratio, expected",
    [(None, None), (16.0, {"lr": 2e-4, "loraplus_lr_ratio": 16.0, "loraplus_weight_decay": 0.0})],
)
def test_loraplus_kwargs(ratio: float | None, expected: dict[str, Any] | None) -> None:
    assert loraplus_kwargs(S(loraplus_lr_ratio=ratio, learning_rate=2e-4, weight_decay=0.0)) == expected


def test_the_trainer_configs_accept_the_mapped_tricks(tmp_path: Path) -> None:
    """trl builds its config with every CPU-capable trick set (names as trl 1.16 / transformers 5.24 spell them)."""
    from jobs.config.mapping import training_config

    spec = S(method="full", optim="galore_adamw", optim_rank=4, neftune_noise_alpha=5.0, torch_compile=True)
    args = training_config(spec, CPU, str(tmp_path))
    assert (args.optim, args.optim_args, args.neftune_noise_alpha, args.torch_compile) == (
        "galore_adamw",
        "rank=4,update_proj_gap=200",
        5.0,
        True,
    )
    offloaded = training_config(S(activation_offloading=True, use_liger_kernel=True), CPU, str(tmp_path))
    assert offloaded.activation_offloading and offloaded.use_liger_kernel


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "fields, device, field, words",
    [
        ({"use_liger_kernel": True}, CPU, "use_liger_kernel", "Triton"),
        ({"activation_offloading": True}, CPU, "activation_offloading", "host memory already"),
        ({"optim": "galore_adamw"}, CPU, "optim", "only the adapters train"),
        ({"method": "qlora", "optim": "apollo_adamw"}, H100, "optim", "low-rank already"),
        ({"method": "full", "optim": "galore_adamw_8bit"}, CPU, "optim", "needs CUDA"),
        (
            {"method": "full", "optim": "galore_adamw_layerwise", "gradient_accumulation_steps": 4},
            H100,
            "gradient_accumulation_steps",
            "cannot accumulate",
        ),
        (
            {"trainer": "grpo", "rewards": "repetition", "activation_offloading": True},
            H100,
            "activation_offloading",
            "grpo",
        ),
        ({"method": "ia3", "loraplus_lr_ratio": 16.0}, H100, "loraplus_lr_ratio", "has none"),
        ({"loraplus_lr_ratio": 16.0, "optim": "adafactor"}, H100, "loraplus_lr_ratio", "adafactor"),
        ({"method": "qlora", "torch_compile": True}, H100, "torch_compile", "bitsandbytes"),
        ({"method": "prefix_tuning", "torch_compile": True}, H100, "torch_compile", "cache object"),
    ],
)
def test_refusals_name_the_field_the_reason_and_a_fix(
    fields: dict[str, Any], device: Device, field: str, words: str
) -> None:
    problems = [p for p in capability_problems(S(**fields), device) if p.field == field]
    assert len(problems) == 1, capability_problems(S(**fields), device)
    assert words in problems[0].problem and problems[0].fix


@pytest.mark.parametrize(
    "fields, device",
    [
        ({"use_liger_kernel": True, "activation_offloading": True}, H100),  # trl keeps Liger's fused loss off
        ({"method": "full", "optim": "galore_adamw"}, CPU),
        ({"method": "full", "optim": "apollo_adamw_layerwise"}, CPU),
        ({"loraplus_lr_ratio": 16.0, "neftune_noise_alpha": 5.0, "torch_compile": True}, CPU),
        ({"activation_offloading": True, "gradient_checkpointing": True, "trainer": "dpo"}, H100),
    ],
)
def test_what_runs_where_it_would_run_is_not_refused(fields: dict[str, Any], device: Device) -> None:
    assert capability_problems(S(**fields), device) == []


def test_missing_packages_are_named_with_the_install_command() -> None:
    liger = S(use_liger_kernel=True)
    (p,) = package_problems(liger, H100, frozenset({"liger-kernel"}))
    assert p.field == "use_liger_kernel" and "liger-kernel" in p.problem and "pip install" in p.fix
    assert package_problems(liger, H100, frozenset()) == []
    (q,) = package_problems(S(method="full", optim="apollo_adamw"), CPU, frozenset({"apollo-torch", "x"}))
    assert q.field == "optim" and "apollo-torch" in q.problem


def test_warnings_for_tricks_that_do_less_than_they_say() -> None:
    assert any("ignores it" in w for w in capability_warnings(S(cpu_return_freed_memory=True), H100))
    layerwise = S(method="full", optim="galore_adamw_layerwise")
    assert any("clips nothing" in w for w in capability_warnings(layerwise, CPU))


# ---------------------------------------------------------------------- the worker's allocator
@pytest.mark.parametrize(
    "env, wanted, on",
    [
        ({}, False, False),
        ({}, True, True),
        ({"TUNEDECK_CPU_ALLOCATOR": "exact"}, False, True),
        ({"TUNEDECK_CPU_ALLOCATOR": "glibc"}, True, False),
        ({"TUNEDECK_CPU_ALLOCATOR": "bogus"}, True, True),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, True, False),  # the user's own value stays
    ],
)
def test_cpu_allocator_follows_the_spec_unless_the_worker_overrides(env: dict, wanted: bool, on: bool) -> None:
    from jobs.worker.processes import CPU_ALLOCATOR_ENV, cpu_allocator_env

    assert cpu_allocator_env(env, wanted) == (CPU_ALLOCATOR_ENV if on else {})


# ---------------------------------------------------------------------- predicted parts
def test_galore_and_apollo_keep_the_targeted_state_at_low_rank(qwen7b) -> None:
    adamw = predict(S(model=str(QWEN7B), method="full", max_length=256, per_device_train_batch_size=1), qwen7b, H200)
    galore = predict(S(model=str(QWEN7B), method="full", optim="galore_adamw", max_length=256), qwen7b, H200)
    apollo = predict(S(model=str(QWEN7B), method="full", optim="apollo_adamw", optim_rank=256), qwen7b, H200)
    assert galore.part("optimizer") < 0.35 * adamw.part("optimizer")
    assert (
        apollo.part("optimizer") < 0.35 * adamw.part("optimizer")
        and "APOLLO rank 256" in apollo.to_dict()["formulas"]["optimizer"]
    )
    targets = low_rank_targets(S(method="full", optim="galore_adamw"), qwen7b)
    assert len(targets) == 7 * qwen7b.layers + 1  # every block linear and the untied head
    assert len(
        low_rank_targets(S(method="full", optim="galore_adamw", optim_target_modules="q_proj,v_proj"), qwen7b)
    ) == (2 * qwen7b.layers)


def test_a_layerwise_optimizer_has_no_step_with_every_gradient_alive(qwen7b) -> None:
    spec = S(
        model=str(QWEN7B), method="full", optim="galore_adamw_layerwise", max_length=64, per_device_train_batch_size=1
    )
    p = predict(spec, qwen7b, H200)
    assert p.phase == "backward" and p.part("gradients") == 0 and "layer-wise" in p.to_dict()["formulas"]["optimizer"]


def test_offloaded_activations_move_to_a_host_figure(qwen7b) -> None:
    base = S(model=str(QWEN7B), max_length=2048, per_device_train_batch_size=4)
    plain = predict(base, qwen7b, H200)
    off = predict(base.replace(activation_offloading=True), qwen7b, H200)
    moved = plain.part("activations") - off.part("activations")
    assert off.host_bytes == moved > 0.8 * plain.part("activations") and off.to_dict()["host_bytes"] == moved
    assert any("host RAM" in n for n in off.notes)
    assert predict(base.replace(activation_offloading=True), qwen7b, CPU_FACTS).host_bytes == 0  # refused there


def test_unmodelled_effects_are_labelled_not_guessed(qwen7b) -> None:
    base = S(model=str(QWEN7B), max_length=256)
    tricked = predict(base.replace(use_liger_kernel=True, torch_compile=True), qwen7b, H200)
    assert tricked.total_bytes == predict(base, qwen7b, H200).total_bytes
    assert any("Liger" in n and "not modelled" in n for n in tricked.notes)
    assert any("torch.compile" in n and "not modelled" in n for n in tricked.notes)


def test_fit_to_gpu_offers_offloaded_checkpointing_when_checkpointing_alone_does_not_fit(qwen7b) -> None:
    spec = S(model=str(QWEN7B), max_length=32768, per_device_train_batch_size=1)  # LoRA, a long context
    ckpt = predict(spec.replace(gradient_checkpointing=True), qwen7b, H200)
    offloaded = predict(spec.replace(gradient_checkpointing=True, activation_offloading=True), qwen7b, H200)
    target = int(
        (ckpt.total_bytes + offloaded.total_bytes) / 2 / 0.9
    )  # checkpointing alone misses, with offloading fits
    plan = fit(spec, qwen7b, H200, target, allow_qlora=False)
    assert plan and plan[0].spec.activation_offloading and plan[0].spec.gradient_checkpointing
    assert "activation_offloading: true" in plan[0].changes


def test_fit_on_the_cpu_turns_the_allocator_on_only_when_the_job_needs_it(qwen7b) -> None:
    # 128 tokens: every activation tensor under glibc's 32 MiB mmap limit, so the heap keeps them
    spec = S(
        model=str(QWEN7B),
        max_length=128,
        per_device_train_batch_size=1,
        gradient_checkpointing=True,
        optim="adamw_bnb_8bit",
    )  # fmt: skip  (nothing left to change but the allocator)
    glibc = predict(spec, qwen7b, CPU_FACTS)
    exact = predict(spec.replace(cpu_return_freed_memory=True), qwen7b, CPU_FACTS)
    assert exact.total_bytes < glibc.total_bytes
    roomy = fit(spec, qwen7b, CPU_FACTS, int(glibc.total_bytes / 0.8))
    assert roomy and not roomy[0].spec.cpu_return_freed_memory  # it fits without: the faster allocator stays
    between = (exact.total_bytes + glibc.total_bytes) // 2
    tight = fit(spec, qwen7b, replace(CPU_FACTS, total_bytes=int(between / 0.9)), int(between / 0.9))
    assert tight and tight[0].spec.cpu_return_freed_memory
    assert "cpu_return_freed_memory: true" in tight[0].changes


# ---------------------------------------------------------------------- real training on the CPU
@pytest.fixture(scope="module")
def truth_work(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(work folder, a tiny Llama of the bench's llama-h64 shape, its SFT rows at 64 tokens), built once."""
    from bench.memory_truth import build_data, build_model, quiet

    quiet()
    work = tmp_path_factory.mktemp("tricks")
    model = build_model(work, "llama-h64")
    return work, model, build_data(work, model, "sft", 64)


@pytest.mark.integration
@pytest.mark.parametrize(
    "fields",
    [
        {"method": "full", "optim": "galore_adamw", "optim_rank": 8},
        {"method": "full", "optim": "galore_adamw_layerwise", "optim_rank": 8},
        {"method": "full", "optim": "apollo_adamw", "optim_rank": 8},
        {"method": "lora", "loraplus_lr_ratio": 16.0},
        {"method": "lora", "neftune_noise_alpha": 5.0},
    ],
    ids=["galore", "galore-layerwise", "apollo", "loraplus", "neftune"],
)
def test_cpu_tricks_train_and_are_predicted_within_15_percent(truth_work, fields: dict[str, Any]) -> None:
    """Two real optimizer steps, every tensor byte counted (jobs.memory.count), against the prediction."""
    from bench.memory_truth import measure_cpu, predicted
    from jobs.devices.probe import cpu_facts

    work, model, data = truth_work
    spec = S(model=str(model), dataset=str(data), max_steps=2, logging_steps=1, max_length=64,
             per_device_train_batch_size=4, learning_rate=1e-3, **fields)  # fmt: skip
    p = predicted(spec, model, cpu_facts())
    counted = measure_cpu(spec, work / "out")["peak"]
    error = (p.total_bytes - p.part("overhead") - p.part("runtime") - counted) / counted
    assert abs(error) <= 0.15, f"predicted {p.parts_dict()} vs counted {counted}: {100 * error:+.1f}%"


@pytest.mark.integration
def test_loraplus_gives_b_its_higher_learning_rate(truth_work) -> None:
    from jobs.config.mapping import peft_config, training_config
    from jobs.data.loading import load_datasets
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model

    work, model_dir, data = truth_work
    spec = S(model=str(model_dir), dataset=str(data), max_steps=1, max_length=64, learning_rate=1e-4,
             loraplus_lr_ratio=16.0)  # fmt: skip
    model, tokenizer = load_model(spec, CPU)
    train, _ = load_datasets(spec)
    args = training_config(spec, CPU, str(work / "lp"))
    trainer = build_trainer(spec, model, tokenizer, args, train, None, peft_config(spec, model.config.model_type), [])
    rates = {}
    for group in trainer.optimizer.param_groups:
        names = {n for n, p in trainer.model.named_parameters() if any(p is q for q in group["params"])}
        for n in names:
            rates["B" if "lora_B" in n else "A" if "lora_A" in n else "other"] = group["lr"]
    assert rates["A"] == pytest.approx(1e-4) and rates["B"] == pytest.approx(16e-4)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert any(not (p.detach() == before[n]).all() for n, p in trainer.model.named_parameters() if n in before)


def test_the_form_shows_the_host_figure_and_what_is_not_modelled() -> None:
    from app.ui.memory import predict_for, verdict_markdown

    spec = S(model=str(QWEN7B), activation_offloading=True, torch_compile=True, max_length=512)
    text = verdict_markdown(spec, predict_for(spec, lambda: H200))
    assert "Host RAM: **" in text and "the worker's RAM must hold them" in text
    assert "torch.compile: the compiler's workspace and fused buffers are not modelled" in text


def test_the_worker_starts_a_runs_child_with_the_allocator_its_spec_asks_for(
    store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training_helpers

    from jobs.worker.loop import Worker

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)  # a user's own value would win (the table above)
    monkeypatch.delenv("TUNEDECK_CPU_ALLOCATOR", raising=False)
    worker = Worker(store, worker_id="w-alloc", sample=False)
    worker.trains_on_cpu = True
    plain = store.create_run(training_helpers.tiny_spec(tiny_model))
    asked = store.create_run(training_helpers.tiny_spec(tiny_model).replace(cpu_return_freed_memory=True))
    assert "MALLOC_MMAP_THRESHOLD_" not in worker.child_env(plain)
    assert worker.child_env(asked)["MALLOC_MMAP_THRESHOLD_"] == "131072"
    worker.trains_on_cpu = False  # a GPU worker: torch's allocator, whatever the spec says
    assert "MALLOC_MMAP_THRESHOLD_" not in worker.child_env(asked)
