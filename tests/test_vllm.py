"""GRPO's generation through vLLM (`use_vllm`, trl's colocate mode; jobs.config.vllm): the spec fields, the
GRPOConfig they map to, the refusals before queueing (another trainer, a CPU worker, no vllm package, methods
trl cannot pass to vLLM), vLLM's share of the GPU in the memory prediction, the form and the trl import.
vllm itself is not installed here (GPU hosts only): `bench/gpu_check.sh`'s vllm section runs it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from jobs.config.mapping import capability_problems
from jobs.devices.facts import CPU, Device, DeviceFacts
from jobs.spec.job import JobSpec, SpecError
from tests.training_helpers import refusal_messages, tiny_spec

H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", total_bytes=139 * 2**30, compute_capability="9.0", bf16=True)
GPU = H200.device()


def grpo(**changes: Any) -> dict[str, Any]:
    return {"trainer": "grpo", "dataset": "sample:prompt-format", "rewards": "repetition", "method": "lora", **changes}


def messages(data: dict[str, Any], device: Device) -> list[str]:
    try:
        return [str(p) for p in capability_problems(JobSpec.from_dict(data), device)]
    except SpecError as exc:
        return [str(p) for p in exc.problems]


@pytest.fixture
def vllm_installed(monkeypatch: pytest.MonkeyPatch):
    """Whether `vllm` is found where the checks look (this interpreter), whatever this machine has."""
    real = importlib.util.find_spec

    def found(installed: bool) -> None:
        marker = real("json")
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: (marker if installed else None) if name == "vllm" else real(name, *a),
        )

    return found


# ---------------------------------------------------------------------- the spec and its mapping
@pytest.mark.parametrize(
    "data,message",
    [
        (
            {"trainer": "sft", "dataset": "sample:chat-format", "use_vllm": True},
            "use_vllm: is a grpo option; the sft trainer does not read it. Fix: remove use_vllm",
        ),
        (
            {"trainer": "dpo", "dataset": "sample:preference-format", "vllm_gpu_memory_utilization": 0.5},
            "vllm_gpu_memory_utilization: is a grpo option",
        ),
        (
            grpo(use_vllm=True, vllm_gpu_memory_utilization=0.0),
            "vllm_gpu_memory_utilization: 0 is out of range. Fix: use a value > 0 and <= 0.95",
        ),
        (grpo(use_vllm=True, vllm_gpu_memory_utilization=1.0), "vllm_gpu_memory_utilization: 1 is out of range"),
        (
            grpo(vllm_gpu_memory_utilization=0.5),
            "vllm_gpu_memory_utilization: is vLLM's share of the GPU, and use_vllm is off: nothing would read it. "
            "Fix: set use_vllm: true",
        ),
    ],
)
def test_the_fields_are_refused_outside_grpo_and_out_of_range(data: dict, message: str) -> None:
    found = refusal_messages(data)
    assert any(message in m for m in found), found


def test_use_vllm_maps_to_colocate_mode_with_its_share_and_context(tmp_path: Path) -> None:
    from jobs.config.mapping import training_config

    keys = ("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_max_model_length")
    on = JobSpec.from_dict(
        grpo(
            use_vllm=True, vllm_gpu_memory_utilization=0.45, max_length=200, max_completion_length=56, precision="fp32"
        )
    )
    config = training_config(on, GPU, str(tmp_path))
    assert {k: getattr(config, k) for k in keys} == dict(zip(keys, (True, "colocate", 0.45, 256), strict=True))
    assert config.vllm_server_base_url is None  # no server: nothing of the spec names one
    off = training_config(JobSpec.from_dict(grpo()), CPU, str(tmp_path))
    assert {k: getattr(off, k) for k in keys} == dict(zip(keys, (False, "colocate", 0.3, None), strict=True))


# ---------------------------------------------------------------------- refused before queueing
def test_a_cpu_device_is_refused_with_the_reason() -> None:
    found = messages(grpo(use_vllm=True), CPU)
    assert found == [
        "use_vllm: vLLM runs on CUDA GPUs only, and this run would start on the CPU. Fix: set use_vllm: false "
        "(transformers' generate samples the completions), or run it on a GPU worker"
    ]
    assert messages(grpo(use_vllm=True), GPU) == []


def test_a_gpu_without_the_package_is_refused_with_the_extra_to_install(vllm_installed) -> None:
    from jobs.checks.trick_packages import missing_package_problems

    spec = JobSpec.from_dict(grpo(use_vllm=True))
    vllm_installed(False)
    (problem,) = missing_package_problems(spec, GPU)
    assert (problem.field, problem.problem) == (
        "use_vllm",
        "needs the Python package vllm, which is not installed where the run would start",
    )
    assert "pip install 'tunedeck[vllm]'" in problem.fix and "use_vllm: false" in problem.fix
    assert missing_package_problems(spec, CPU) == []  # the device's own refusal says it there
    vllm_installed(True)
    assert missing_package_problems(spec, GPU) == []


@pytest.mark.parametrize(
    "method,reason",
    [
        ("qlora", "without their quantization scales"),
        ("lora_8bit", "vLLM does not support in-flight 8-bit quantization"),
        ("prompt_tuning", "adds virtual tokens, not weights"),
        ("prefix_tuning", "adds virtual tokens, not weights"),
        ("p_tuning", "adds virtual tokens, not weights"),
        ("adaption_prompt", "adds gated prompts, not weights"),
    ],
)
def test_methods_trl_cannot_pass_to_vllm_are_refused(method: str, reason: str) -> None:
    found = [m for m in messages(grpo(use_vllm=True, method=method), GPU) if m.startswith("use_vllm:")]
    assert len(found) == 1 and f"cannot sample for method: {method}" in found[0] and reason in found[0], found
    assert not [m for m in messages(grpo(method=method), GPU) if m.startswith("use_vllm:")]


@pytest.mark.parametrize("method", ["lora", "dora", "full", "ia3"])
def test_methods_whose_weights_merge_are_accepted(method: str) -> None:
    assert not [m for m in messages(grpo(use_vllm=True, method=method), GPU) if m.startswith("use_vllm:")]


def publish_live(store: Any, worker_id: str, facts: DeviceFacts) -> None:
    store.publish_device(worker_id, facts.host, facts.to_dict())
    store.worker_beat(worker_id, 4242, facts.host)


@pytest.mark.parametrize(
    "facts,expected",
    [
        (DeviceFacts(kind="cpu", name="cpu", total_bytes=64 * 2**30, host="cpu-box"), "vLLM runs on CUDA GPUs only"),
        (H200, "needs the Python package vllm"),
    ],
)
def test_submit_refuses_with_nothing_queued(
    store: Any, tiny_model: Path, vllm_installed, facts: DeviceFacts, expected: str
) -> None:
    """Through `jobs.queue.submit.submit` against the worker's published device: refused, nothing queued."""
    from jobs.queue.submit import submit

    vllm_installed(False)
    publish_live(store, "w:1", DeviceFacts(**{**facts.to_dict(), "host": facts.host or "gpu-box"}))
    spec = tiny_spec(tiny_model, trainer="grpo", dataset="sample:prompt-format", rewards="repetition", use_vllm=True,
                     num_generations=2, max_completion_length=8, max_steps=1)  # fmt: skip
    with pytest.raises(SpecError) as exc:
        submit(store, spec)
    assert [p.field for p in exc.value.problems] == ["use_vllm"], exc.value.problems
    assert expected in exc.value.problems[0].problem
    assert store.count_runs() == 0


def test_a_prompt_longer_than_vllms_context_is_refused(tiny_model: Path, vllm_installed) -> None:
    """grpo keeps prompts whole, and vLLM's context is max_length + max_completion_length: the data's measured
    longest prompt decides, before queueing."""
    from jobs.checks.pipeline import check

    vllm_installed(True)
    fields = dict(trainer="grpo", dataset="sample:prompt-format", rewards="repetition", num_generations=2,
                  max_completion_length=8, max_steps=1, precision="fp32")  # fmt: skip
    refused = check(tiny_spec(tiny_model, use_vllm=True, max_length=8, **fields), device=H200)
    (problem,) = refused.problems
    assert problem.field == "max_length" and "vLLM's context is max_length + max_completion_length (16 tokens)" in (
        problem.problem
    )
    longest = int(problem.problem.split("has ")[1].split(" tokens")[0])
    assert longest > 8 and problem.fix.startswith(f"set max_length: {longest} or more")
    assert check(tiny_spec(tiny_model, use_vllm=True, max_length=longest, **fields), device=H200).problems == []
    assert check(tiny_spec(tiny_model, max_length=8, **fields), device=H200).problems == []  # generate: no limit


def test_the_form_refuses_it_on_a_cpu_worker(store: Any, tiny_model: Path) -> None:
    """The launch form has the checkbox and the share (a slider), and its launch goes through the same check."""
    import gradio as gr

    from app.ui import form as ui_form
    from jobs.spec.field_info import field_infos

    infos = {f.name: f for f in field_infos()}
    assert isinstance(ui_form.make_component(infos["use_vllm"]), gr.Checkbox)
    share = ui_form.make_component(infos["vllm_gpu_memory_utilization"])
    assert isinstance(share, gr.Slider) and (share.minimum, share.maximum, share.value) == (0.0, 0.95, 0.3)
    publish_live(store, "w:2", DeviceFacts(kind="cpu", name="cpu", total_bytes=64 * 2**30, host="cpu-box"))
    spec = tiny_spec(tiny_model, trainer="grpo", dataset="sample:prompt-format", rewards="repetition", use_vllm=True,
                     num_generations=2, max_completion_length=8, max_steps=1)  # fmt: skip
    errors, run_id = ui_form.launch(store, *ui_form.form_values(spec))
    assert run_id is None and "vLLM runs on CUDA GPUs only" in str(errors)
    assert store.count_runs() == 0


# ---------------------------------------------------------------------- memory
@pytest.fixture(scope="module")
def arch():
    from jobs.memory.model_config import arch_for

    return arch_for("smollm2-135m-instruct")


@pytest.mark.parametrize("share", [0.3, 0.55])
def test_vllms_share_is_its_own_part_and_replaces_the_kv_cache(arch, share: float) -> None:
    from jobs.memory.predict import predict

    off = predict(JobSpec.from_dict(grpo(beta=0.0)), arch, H200)
    on = predict(JobSpec.from_dict(grpo(beta=0.0, use_vllm=True, vllm_gpu_memory_utilization=share)), arch, H200)
    assert on.part("vllm") == int(share * H200.total_bytes)
    assert on.to_dict()["formulas"]["vllm"].startswith(f"vLLM (colocate, {share:.0%} of GPU): {share:g} x 139.0 GiB")
    assert "vllm" not in off.parts_dict()
    # transformers' generate no longer runs: no KV cache, nothing added in the generation phase
    assert "KV cache" in off.to_dict()["formulas"]["generation"]
    assert "KV cache" not in on.to_dict()["formulas"]["generation"]
    assert off.phases["generation"] > off.phases["load"] and on.phases["generation"] == on.phases["load"]
    # the share is held from the trainer's start, in every phase, and adds no allocator slack
    assert on.phases["load"] - off.phases["load"] == pytest.approx(share * H200.total_bytes, abs=2)
    assert on.part("overhead") == off.part("overhead")
    names = [p.name for p in on.parts]
    assert names[names.index("reward_model") + 1] == "vllm"
    # trl recomputes the policy's log-probs of each micro-batch for vLLM's correction (beta 0: no reference pass)
    assert "vLLM's correction" in on.to_dict()["formulas"]["generation"]


def test_fit_to_gpu_does_not_offer_qlora_with_vllm() -> None:
    """The planner's variants leave out what use_vllm refuses (a 4-bit base)."""
    from jobs.memory.planner import variants

    def methods(**changes: Any) -> set[str]:
        return {v.method.value for v in variants(JobSpec.from_dict(grpo(**changes)), H200)}

    assert methods() == {"lora", "qlora"}
    assert methods(use_vllm=True) == {"lora"}


def test_without_a_known_gpu_total_no_share_is_counted(arch) -> None:
    from dataclasses import replace

    from jobs.memory.predict import predict

    p = predict(JobSpec.from_dict(grpo(use_vllm=True)), arch, replace(H200, total_bytes=0))
    assert p.part("vllm") == 0 and "total memory is not known" in p.to_dict()["formulas"]["vllm"]


# ---------------------------------------------------------------------- trl configs
def test_a_trl_config_with_vllm_imports_and_server_mode_is_refused() -> None:
    from jobs.spec.imports import ImportConfigError, build_spec, import_config

    imported = import_config(
        {
            "model_name_or_path": "m",
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.4,
            "vllm_server_port": 8000,
        }
    )
    spec = build_spec(imported, {"model": "tiny-llama", "dataset": "sample:prompt-format", "rewards": "repetition"})
    assert (spec.trainer.value, spec.use_vllm, spec.vllm_gpu_memory_utilization) == ("grpo", True, 0.4)
    assert [n.key for n in imported.not_carried] == ["vllm_server_port"]
    with pytest.raises(ImportConfigError) as err:
        import_config({"model_name_or_path": "m", "use_vllm": True, "vllm_mode": "server"})
    text = str(err.value)
    assert "vllm_mode: `server` has no tunedeck equivalent" in text and "a vLLM server started apart" in text
    assert "use vllm_mode: colocate" in text


# ---------------------------------------------------------------------- the GPU check's row
def test_the_gpu_checks_vllm_row_skips_without_vllm(vllm_installed, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/vllm_gpu.py imports cleanly on a CPU machine and says why it skips (it trains only where vllm and a
    GPU are)."""
    import sys

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench import vllm_gpu

    vllm_installed(False)
    assert vllm_gpu.main(["--workdir", "/nonexistent-never-written"]) == 0
    out = capsys.readouterr().out
    assert "skipped: the vllm package is not installed" in out and "tunedeck[vllm]" in out
