"""The method x trainer x trick matrix, trained for real on the tiny offline Llama (CPU).

Every method and a representative set of memory tricks train for 2 steps in-process through
`jobs.train.training.train_spec`; each run asserts that the libraries received exactly the resolved config
(trainer args, peft config, BitsAndBytesConfig), that the trainable parameter count equals the
pre-launch estimate (`jobs.memory.params`), that the loss is finite, that trainable parameters moved and
(per method) that the saved bundle reloads with the same logits.

What was tried on this CPU (trl 1.16, peft 0.21.2, bitsandbytes 0.50.2, transformers 5.24), 2 steps
each on the tiny model, with the capability check switched off to see what the libraries do:
- runs: every method x SFT; every method x DPO (prompt/prefix/p-tuning and ia3 included); every
  method x gradient checkpointing except prefix tuning; every method x packing; every method x
  bf16 (use_cpu); adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit (warn, fall back to
  non-paged) and adafactor with lora and with full; gradient accumulation; padding_free + packing;
  auto_find_batch_size (lora, full, dpo); assistant_only_loss (messages; with packing; with
  prompt_tuning); completion_only_loss on prompt/completion rows (also with packing and with
  prefix tuning); text rows with and without packing; loss_type dft (SFT), hinge and ipo (DPO);
  DPO with padding_free, gradient checkpointing, bf16, adamw_bnb_8bit, and qlora + checkpointing;
  qlora with fp4, without double quantization, with fp16 / bf16 compute dtype; lora_8bit with
  adamw_bnb_8bit and checkpointing; qlora with packing and checkpointing; dora with bf16 and
  checkpointing; rsLoRA on q_proj,v_proj.
- rejected by the libraries (each now refused before queueing, with its fix):
  - padding_free without packing (SFT): trl ValueError "When `padding_free=True` without packing,
    `max_length` is not enforced..."
  - prefix_tuning + gradient_checkpointing: RuntimeError "The size of tensor a (58) must match the
    size of tensor b (62) at non-singleton dimension 3"
  - packing with DPO: DPOConfig has no `packing` (TypeError: unexpected keyword argument)
  - assistant_only_loss on text or prompt/completion string rows: trl ValueError "You set
    `assistant_only_loss=True`, but the dataset is not conversational..."
  - assistant_only_loss with a chat template without `{% generation %}` markers (that trl cannot
    patch): trl ValueError "The chat template is not training-compatible..."
  - fp16 on CPU is not rejected by the libraries: it silently trains in fp32 without a GradScaler,
    so it is refused as dishonest.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

from jobs.config.mapping import training_kwargs
from jobs.data.sources import SAMPLES_DIR
from jobs.devices.facts import CPU
from jobs.memory.model_config import arch_for
from jobs.memory.params import trainable_params
from jobs.spec.job import JobSpec, SpecError

pytestmark = pytest.mark.integration

METHODS = [
    "full",
    "lora",
    "dora",
    "qlora",
    "lora_8bit",
    "ia3",
    "prompt_tuning",
    "prefix_tuning",
    "p_tuning",
    "mora",
    "adaption_prompt",
    "lokr",
    "loha",
    "oft",
    "vera",
    "miss",
    "hira",
]


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small local data files (no eval split, so no evaluation pass) in each row format."""
    root = tmp_path_factory.mktemp("matrix-data")
    chat = (SAMPLES_DIR / "chat-format.train.jsonl").read_text().splitlines()[:4]
    pref = (SAMPLES_DIR / "preference-format.train.jsonl").read_text().splitlines()[:4]
    rows = [json.loads(line)["messages"] for line in chat]
    out = {
        "chat": root / "chat.jsonl",
        "pref": root / "pref.jsonl",
        "pc": root / "pc.jsonl",
        "text": root / "text.jsonl",
    }
    out["chat"].write_text("\n".join(chat) + "\n")
    out["pref"].write_text("\n".join(pref) + "\n")
    out["pc"].write_text(
        "".join(json.dumps({"prompt": m[0]["content"], "completion": " " + m[1]["content"]}) + "\n" for m in rows)
    )
    out["text"].write_text("".join(json.dumps({"text": f"{m[0]['content']} {m[1]['content']}"}) + "\n" for m in rows))
    return out


@pytest.fixture(scope="module")
def no_markers_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its chat template's `{% generation %}` markers removed."""
    import shutil

    from transformers import AutoTokenizer

    dest = tmp_path_factory.mktemp("no-markers") / "tiny"
    shutil.copytree(tiny_model, dest)
    tok = AutoTokenizer.from_pretrained(str(dest))
    tok.chat_template = tok.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    tok.save_pretrained(str(dest))
    return dest


def spec_for(tiny_model: Path, files: dict[str, Path], **changes: Any) -> JobSpec:
    base = dict(
        model=str(tiny_model),
        dataset=str(files["chat"]),
        method="lora",
        max_steps=2,
        per_device_train_batch_size=2,
        max_length=48,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        logging_steps=1,
        lora_r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        num_virtual_tokens=4,
        adapter_layers=2,
    )
    if changes.get("trainer") == "dpo":
        base["dataset"] = str(files["pref"])
    return JobSpec.from_dict({**base, **changes})


class Snapshot(TrainerCallback):
    """Copies the trainable parameters when training starts, to prove they moved."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.before = {n: p.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad}


def _plain(value: Any) -> Any:
    value = value.value if hasattr(value, "value") else value
    return sorted(value) if isinstance(value, (set, list, tuple)) else value


def train_and_check(spec: JobSpec, out: Path) -> Any:
    """Train `spec`; assert config received, parameter count, finite loss, parameters moved."""
    from jobs.train.training import train_spec

    snap = Snapshot()
    result = train_spec(spec, out, [snap], device=CPU)
    resolved, trainer = result.resolved, result.trainer
    # The record is what the trainer ran with: its args as resolved, and every change from the request.
    requested = training_kwargs(spec, CPU, str(out), has_eval=result.trainer.eval_dataset is not None)
    changed = resolved["library_changes"]
    for key, value in resolved["trainer_config"].items():
        got = getattr(trainer.args, key) if key != "padding_free" else trainer.padding_free
        if key == "report_to":
            assert got == [] and requested[key] == "none"
        elif key == "loss_type" and isinstance(got, list):
            assert got == value == [requested[key]]
        else:
            assert _plain(got) == _plain(value), key
            assert _plain(value) == _plain(requested[key]) or changed[key]["effective"] == _plain(value), key
    # ...and so did peft.
    if resolved["peft_config"] is not None:
        config = trainer.model.peft_config["default"]
        assert type(config).__name__ == resolved["peft_config_class"]
        for key, value in resolved["peft_config"].items():
            if value == "all-linear":
                continue  # peft expands it into the module names it found
            got = getattr(config, key)
            if dataclasses.is_dataclass(got):  # nested configs (eva_config) are recorded as plain dicts
                got = {k: getattr(got, k) for k in value}
            assert _plain(got) == _plain(value), key
    if resolved["quantization_config"] is not None:
        quant = trainer.model.base_model.model.config.quantization_config
        quant = quant if isinstance(quant, dict) else quant.to_dict()
        for key, value in resolved["quantization_config"].items():
            assert str(quant[key]).replace("torch.", "") == str(value), key
    # The pre-launch estimate is exactly what peft counts.
    estimate = trainable_params(spec, arch_for(spec.model).shape)
    assert result.metrics["trainable_params"] == estimate.trainable == resolved["trainable_params"]
    assert result.metrics["total_params"] == estimate.total
    # Loss finite, parameters moved.
    losses = [e["loss"] for e in result.log_history if "loss" in e]
    assert len(losses) == spec.max_steps and all(math.isfinite(x) for x in losses), losses
    after = {n: p.detach().float() for n, p in result.model.named_parameters() if p.requires_grad}
    assert snap.before and set(after) == set(snap.before)
    assert any(not torch.equal(after[n], snap.before[n]) for n in after), "no trainable parameter moved"
    for name in ("peak_memory_bytes", "train_runtime", "tokens_per_second", "step_time_mean"):
        assert result.metrics.get(name, 0) > 0, name
    return result


def logits_of(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer("Tell me about volcanoes.", return_tensors="pt")
    model.eval()
    with torch.no_grad():
        return model(**ids).logits.float()


# ---------------------------------------------------------------------- every method
@pytest.mark.parametrize("method", METHODS)
def test_method_trains_and_its_bundle_reloads(
    method: str, tiny_model: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from jobs.config.mora import load_mora
    from jobs.train.artifacts import write_bundle

    spec = spec_for(tiny_model, files, method=method)
    result = train_and_check(spec, tmp_path / "out")
    if method == "full":
        assert result.metrics["trainable_params"] == result.metrics["total_params"]
    else:
        assert 0 < result.metrics["trainable_params"] < result.metrics["total_params"] / 5
    bundle = write_bundle(tmp_path / "bundle", spec, result.model, result.tokenizer, result.metrics)
    base = AutoModelForCausalLM.from_pretrained(str(bundle if method == "full" else tiny_model))
    reloaded = (
        base
        if method == "full"
        else load_mora(base, str(bundle))
        if method == "mora"
        else PeftModel.from_pretrained(base, str(bundle))
    )
    got = logits_of(reloaded, result.tokenizer)
    assert torch.isfinite(got).all()
    if method in {"qlora", "lora_8bit"}:
        # Trained on a quantized base, reloaded on the full-precision one: the adapter is the same.
        from safetensors.torch import load_file

        saved = load_file(str(bundle / "adapter_model.safetensors"))
        trained = {n: p for n, p in result.model.named_parameters() if "lora_" in n}
        assert saved and len(saved) == len(trained)
        for name, tensor in saved.items():
            match = [
                p for n, p in trained.items() if n.replace(".default", "").endswith(name.split("base_model.model.")[-1])
            ]
            assert match and torch.equal(match[0].detach().cpu().to(tensor.dtype), tensor), name
    else:
        assert torch.allclose(got, logits_of(result.model, result.tokenizer), atol=1e-4)


# ---------------------------------------------------------------------- tricks
@pytest.mark.parametrize(
    "changes",
    [
        {"gradient_accumulation_steps": 2},
        {"gradient_checkpointing": True},
        {"precision": "bf16"},
        {"optim": "adamw_bnb_8bit"},
        {"optim": "paged_adamw_8bit"},
        {"optim": "adafactor", "method": "full"},
        {"packing": True},
        {"padding_free": True, "packing": True},
        {"assistant_only_loss": True},
        {"completion_only_loss": True, "dataset": "pc"},
        {"auto_find_batch_size": True},
        {
            "method": "qlora",
            "bnb_4bit_quant_type": "fp4",
            "bnb_4bit_use_double_quant": False,
            "bnb_4bit_compute_dtype": "bf16",
            "gradient_checkpointing": True,
        },
    ],
    ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items()),
)
def test_trick_trains_with_the_config_it_asked_for(
    changes: dict[str, Any], tiny_model: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    if changes.get("dataset") in files:
        changes = {**changes, "dataset": str(files[changes["dataset"]])}
    spec = spec_for(tiny_model, files, **changes)
    result = train_and_check(spec, tmp_path / "out")
    args = result.trainer.args
    for key, value in changes.items():
        if hasattr(args, key) and key not in {"optim"}:
            assert _plain(getattr(args, key)) == value, key
    if "optim" in changes:
        assert args.optim.value == changes["optim"]
        if changes["optim"] == "paged_adamw_8bit":
            assert any("paged optimizers need CUDA" in w for w in result.resolved["warnings"])
    if changes.get("precision") == "bf16":
        assert args.bf16 and args.use_cpu
    if changes.get("packing"):
        assert result.trainer.padding_free  # trl's bfd packing turns padding-free on by itself
        # ...and the run record says so, rather than the padding_free: false it asked for.
        assert result.resolved["trainer_config"]["padding_free"] is True
        if not changes.get("padding_free"):
            assert result.resolved["library_changes"]["padding_free"] == {"requested": False, "effective": True}
    if changes.get("gradient_checkpointing"):
        assert result.resolved["trainer_config"]["activation_checkpointing"] is True  # transformers 5's name
    if changes.get("assistant_only_loss") or changes.get("completion_only_loss"):
        # trl folds the assistant / completion mask into the labels: the prompt side is -100.
        labels = result.trainer.train_dataset[0]["labels"]
        assert 0 < sum(1 for x in labels if x == -100) < len(labels), labels
    if changes.get("completion_only_loss"):
        assert result.trainer.completion_only_loss is True


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_dpo_trains_against_the_adapter_free_base(
    method: str, tiny_model: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    spec = spec_for(tiny_model, files, trainer="dpo", method=method, max_length=128)
    result = train_and_check(spec, tmp_path / "out")
    assert type(result.trainer).__name__ == "DPOTrainer" and result.trainer.ref_model is None
    assert {"rewards/chosen", "rewards/margins"} <= {k for e in result.log_history for k in e}
    assert result.resolved["trainer_config"]["beta"] == 0.1 and result.resolved["trainer_config"]["loss_type"] == [
        "sigmoid"
    ]  # as trl holds it


# ---------------------------------------------------------------------- refused combinations
def refused(spec_or_dict: Any, tiny_model: Path) -> list[str]:
    """Every refusal message for a spec: from parsing, or from the capability check on the CPU."""
    try:
        spec = spec_or_dict if isinstance(spec_or_dict, JobSpec) else JobSpec.from_dict(spec_or_dict)
    except SpecError as exc:
        return [str(p) for p in exc.problems]
    from jobs.checks.pipeline import check
    from jobs.devices.probe import cpu_facts

    return [str(p) for p in check(spec, device=cpu_facts()).problems]


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"precision": "fp16"},
            "precision: fp16 needs CUDA: on the CPU trl would silently train in fp32 without loss "
            "scaling. Fix: use precision: auto (fp32 on CPU) or bf16",
        ),
        (
            {"method": "prefix_tuning", "gradient_checkpointing": True},
            "gradient_checkpointing: prefix tuning fails with gradient checkpointing",
        ),
        (
            {"trainer": "dpo", "packing": True},
            "packing: is only supported by the SFT trainer. Fix: set packing: false for dpo",
        ),
        ({"padding_free": True}, "padding_free: needs packing for sft"),
        ({"assistant_only_loss": True, "dataset": "text"}, "assistant_only_loss: needs chat `messages` rows"),
        ({"assistant_only_loss": True, "dataset": "pc"}, "has prompt_completion rows"),
        ({"assistant_only_loss": True, "model": "no-markers"}, "has no `{% generation %}` markers"),
        ({"assistant_only_loss": True, "trainer": "dpo"}, "assistant_only_loss: is an SFT option"),
        ({"loss_type": "ipo"}, "loss_type: ipo is a DPO loss. Fix: for sft use auto, dft, nll"),
        (
            {"loss_type": "dft", "trainer": "dpo"},
            "loss_type: dft is an SFT loss. Fix: for dpo use auto, hinge, ipo, sigmoid",
        ),
    ],
    ids=lambda x: "+".join(f"{k}={v}" for k, v in x.items()) if isinstance(x, dict) else None,
)
def test_refused_combination_names_its_fix(
    changes: dict[str, Any], message: str, tiny_model: Path, files: dict[str, Path], no_markers_model: Path
) -> None:
    changes = dict(changes)
    if changes.get("dataset") in files:
        changes["dataset"] = str(files[changes["dataset"]])
    if changes.get("model") == "no-markers":
        changes["model"] = str(no_markers_model)
    data = {
        "model": str(tiny_model),
        "dataset": str(files["pref" if changes.get("trainer") == "dpo" else "chat"]),
        **changes,
    }
    messages = refused(data, tiny_model)
    assert any(message in m for m in messages), messages
    assert all(". Fix: " in m for m in messages)


@pytest.mark.parametrize(
    "changes, error",
    [
        ({"padding_free": True}, "When `padding_free=True` without packing, `max_length` is not enforced"),
        ({"method": "prefix_tuning", "gradient_checkpointing": True}, "The size of tensor a"),
        ({"assistant_only_loss": True, "dataset": "text"}, "but the dataset is not conversational"),
        ({"assistant_only_loss": True, "model": "no-markers"}, "The chat template is not training-compatible"),
    ],
)
def test_the_libraries_really_reject_what_is_refused(
    changes: dict[str, Any],
    error: str,
    tiny_model: Path,
    files: dict[str, Path],
    no_markers_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without our check, trl/peft fail on these: the refusals are grounded, not guessed."""
    import jobs.train.training
    from jobs.spec.enums import Method

    monkeypatch.setattr(jobs.train.training, "capability_problems", lambda spec, device=None: [])
    fields = dict(changes)
    if fields.get("dataset") in files:
        fields["dataset"] = str(files[fields["dataset"]])
    if fields.get("model") == "no-markers":
        fields["model"] = str(no_markers_model)
    if "method" in fields:
        fields["method"] = Method(fields["method"])
    spec = dataclasses.replace(spec_for(tiny_model, files), **fields)  # skips JobSpec's own validation
    with pytest.raises(Exception, match=error.replace("`", ".").replace("(", ".").replace(")", ".")):
        jobs.train.training.train_spec(spec, tmp_path / "out", device=CPU)


def test_dpo_config_has_no_packing() -> None:
    from trl import DPOConfig

    with pytest.raises(TypeError, match="packing"):
        DPOConfig(output_dir="unused", packing=True, use_cpu=True, bf16=False)
