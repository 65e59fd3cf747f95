"""The newer methods end to end on the tiny model (CPU): LoRA initialisations, runs through the store,
and the refusals, each shown to be what peft/trl really do without tunedeck's check.

Found with the capability check switched off (trl 1.16, peft 0.21.2, CPU):
- runs: mora, adaption_prompt, lokr, loha, oft, vera, miss, hira with SFT, with DPO and with
  gradient checkpointing; lora_init eva with gradient checkpointing, with dora and with qlora;
  pissa and olora with lora and dora; oft with a block size that does not divide the layers
  (peft moves it to the nearest divisor, with a warning).
- rejected (now refused before queueing, with the fix):
  - adaption_prompt on a model type other than llama/mistral/gpt2: peft ValueError
    "Unsupported model type for adaption prompt: 'qwen2'."
  - adaption_prompt with more adapter_layers than the model has: peft ValueError
    "Config specifies more adapter layers (...) than the model has (...)."
  - lora_init loftq on a machine without CUDA: peft's replace_lora_weights_loftq computes on
    "cuda": AssertionError "Torch not compiled with CUDA enabled".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import tiny_spec

from jobs.config.mapping import capability_problems
from jobs.devices.facts import CPU
from jobs.spec.enums import LoraInit, Method

pytestmark = pytest.mark.integration


def logits(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer("Tell me about volcanoes.", return_tensors="pt")
    model.eval()
    with torch.no_grad():
        return model(**ids).logits.float()


def qwen2_folder(tmp_path: Path, tiny_model: Path) -> Path:
    """A tiny random Qwen2 model with the tiny model's tokenizer (an architecture LLaMA-Adapter lacks)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    config = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tok),
    )
    folder = tmp_path / "qwen2"
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


# ---------------------------------------------------------------------- LoRA initialisations
@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_converted_adapter_loads_on_the_original_base(init: str, tiny_model: Path, tmp_path: Path) -> None:
    """PiSSA/OLoRA train on a changed base; the bundle's adapter (rank 2r) reproduces the run on the original."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from jobs.train.artifacts import write_bundle
    from jobs.train.training import train_spec

    spec = tiny_spec(tiny_model, max_steps=3, lora_init=init, lora_r=4)
    out = tmp_path / "out"
    result = train_spec(spec, out, device=CPU)
    assert result.trainer.model.peft_config["default"].init_lora_weights == init
    bundle = write_bundle(tmp_path / "bundle", spec, result.model, result.tokenizer, result.metrics, output_dir=out)
    saved = json.loads((bundle / "adapter_config.json").read_text())
    assert saved["r"] == 2 * spec.lora_r and saved["init_lora_weights"] is True
    original = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    base_logits = logits(original, result.tokenizer)
    reloaded = PeftModel.from_pretrained(original, str(bundle))
    got = logits(reloaded, result.tokenizer)
    torch.testing.assert_close(got, logits(result.model, result.tokenizer), rtol=1e-3, atol=1e-3)
    assert not torch.allclose(got, base_logits, atol=1e-3)  # the adapter changed something
    assert f"{init} initialisation" in (bundle / "README.md").read_text()


def test_eva_runs_its_data_pass_before_training(tiny_model: Path, tmp_path: Path) -> None:
    """EVA's A is the inputs' top right-singular vectors: orthonormal rows at step 0 (random A is not)."""
    from transformers import TrainerCallback

    from jobs.train.training import train_spec

    class FirstA(TrainerCallback):
        a: torch.Tensor | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            name, p = next((n, p) for n, p in model.named_parameters() if "q_proj.lora_A" in n)
            self.a = p.detach().clone()

    spy = FirstA()
    spec = tiny_spec(tiny_model, max_steps=2, lora_init="eva", lora_r=4)
    result = train_spec(spec, tmp_path / "out", [spy], device=CPU)
    assert spy.a is not None and spy.a.shape[0] == spec.lora_r
    torch.testing.assert_close(spy.a @ spy.a.T, torch.eye(spec.lora_r), rtol=1e-3, atol=1e-3)
    assert result.metrics["trainable_params"] == result.resolved["trainable_params"]


# ---------------------------------------------------------------------- through the store
@pytest.mark.parametrize("method", ["mora", "adaption_prompt"])
def test_run_through_the_store_leaves_a_bundle_that_reloads(method: str, tiny_model: Path, store: Any) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from jobs.config.mora import load_mora
    from jobs.train.child import run
    from storage.models import RunStatus

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=4, method=method, adapter_layers=2))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED, record.error_summary
    bundle = Path({a.kind: a for a in store.artifacts(run_id)}["adapter"].path)
    card = (bundle / "README.md").read_text()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    if method == "mora":
        assert "from jobs.config.mora import load_mora" in card and "not a peft method" in card
        model = load_mora(base, str(bundle))
        assert model.peft_config["default"].use_mora
    else:
        model = PeftModel.from_pretrained(base, str(bundle))
    trained = sum(p.numel() for n, p in model.named_parameters() if "lora_A" in n or "adaption" in n)
    assert trained == record.final_metrics["trainable_params"]


# ---------------------------------------------------------------------- refusals, and what they stand for
def test_adaption_prompt_is_refused_for_other_architectures(tiny_model: Path, tmp_path: Path) -> None:
    from jobs.memory.model_config import arch_for

    def problems(spec: Any) -> list[str]:  # the model's layer shapes, as the checks pass them
        return [str(p) for p in capability_problems(spec, CPU, arch_for(spec.model).shape)]

    folder = qwen2_folder(tmp_path, tiny_model)
    messages = problems(tiny_spec(folder, method="adaption_prompt", adapter_layers=2))
    assert any("supports model types llama, mistral, gpt2" in m and "is qwen2" in m for m in messages), messages
    too_many = tiny_spec(tiny_model, method="adaption_prompt", adapter_layers=3)
    assert any("adapter_layers: 3 is more than the model's 2 layers" in m for m in problems(too_many))
    assert problems(tiny_spec(tiny_model, method="adaption_prompt", adapter_layers=2)) == []


def test_loftq_is_refused_without_cuda(tiny_model: Path) -> None:
    spec = tiny_spec(tiny_model, method="qlora", lora_init="loftq")
    assert any("lora_init: loftq needs CUDA" in str(p) for p in capability_problems(spec, CPU))


@pytest.mark.parametrize(
    "case, error",
    [
        ("qwen2", "Unsupported model type for adaption prompt"),
        ("layers", "more adapter layers"),
        ("loftq", "Torch not compiled with CUDA enabled"),
    ],
)
def test_the_libraries_really_reject_what_is_refused(
    case: str, error: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs.train.training

    if case == "loftq" and torch.cuda.is_available():
        pytest.skip("LoftQ runs where CUDA exists")
    monkeypatch.setattr(jobs.train.training, "capability_problems", lambda spec, device=None: [])
    spec = tiny_spec(tiny_model, max_steps=1, method="adaption_prompt", adapter_layers=2)
    if case == "qwen2":
        spec = dataclasses.replace(spec, model=str(qwen2_folder(tmp_path, tiny_model)))
    elif case == "layers":
        spec = dataclasses.replace(spec, adapter_layers=3)
    else:
        spec = dataclasses.replace(spec, method=Method.QLORA, lora_init=LoraInit.LOFTQ)
    with pytest.raises(Exception, match=error):
        jobs.train.training.train_spec(spec, tmp_path / "out", device=CPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loftq_initialises_qlora_on_a_gpu(tiny_model: Path, tmp_path: Path) -> None:
    from jobs.devices.probe import detect_device
    from jobs.train.training import train_spec

    spec = tiny_spec(tiny_model, max_steps=2, method="qlora", lora_init="loftq")
    result = train_spec(spec, tmp_path / "out", device=detect_device())
    assert result.metrics["trainable_params"] > 0
