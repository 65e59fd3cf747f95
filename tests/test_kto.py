"""KTO: unpaired prompt/completion/label data, its sample, mapping, refusals and CPU training.

What was tried on this CPU (trl 1.16, tiny Llama, 2 steps, capability check off): every method
(full, lora, dora, qlora, lora_8bit, ia3, prompt/prefix/p-tuning), gradient checkpointing,
auto_find_batch_size and prompt/chosen/rejected rows train. Rejected by the libraries, so
refused before queueing: per_device_train_batch_size 1 (trl ValueError "Actual (not effective)
batch size must be > 1..."), padding_free and packing (KTOConfig has neither: TypeError),
prefix tuning with gradient checkpointing (as for sft), and an adapter on lm_head (trl ValueError
"Applying a PEFT adapter to `lm_head` is not supported...").
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from jobs.config.mapping import capability_problems, resolved_config
from jobs.data.inspection import check_dataset
from jobs.data.loading import load_data
from jobs.data.row_formats import RowFormat
from jobs.data.sources import SAMPLES_DIR, DataError
from jobs.devices.facts import CPU
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec
from storage.models import RunStatus
from tests.training_helpers import refusal_messages, tiny_spec

KTO = Trainer.KTO


def write(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def problems_text(ref: str, trainer: Trainer = KTO) -> str:
    with pytest.raises(DataError) as err:
        check_dataset(ref, trainer)
    return "\n".join(str(p) for p in err.value.problems)


GOOD = {"prompt": "Say hi.", "completion": "[tag] Hi. Over.", "label": True}
BAD = {"prompt": "Say hi.", "completion": "Go away.", "label": False}


# ---------------------------------------------------------------------- data
def test_kto_sample() -> None:
    info = check_dataset("sample:kto-format", KTO)
    assert (info.format, info.n_rows, info.warnings) == (RowFormat.UNPAIRED, 210, [])
    labels = [json.loads(line)["label"] for line in (SAMPLES_DIR / "kto-format.train.jsonl").read_text().splitlines()]
    assert labels.count(True) == 140 and labels.count(False) == 70
    assert check_dataset("sample:kto-format:eval", KTO).n_rows == 30


@pytest.mark.parametrize("label", [True, False, 1, 0, "true", "False", " 1 "])
def test_labels_read_as_bools(tmp_path: Path, label: Any) -> None:
    ref = write(tmp_path / "d.jsonl", [{**GOOD, "label": label}, BAD, GOOD, BAD])
    loaded = load_data(JobSpec(dataset=ref, trainer="kto"))
    assert loaded.train.features["label"].dtype == "bool"
    assert loaded.train[0]["label"] is (str(label).strip().lower() in ("true", "1"))


def test_csv_labels(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,completion,label\nSay hi.,Hi.,true\nSay hi.,Go away.,false\n")
    assert [r["label"] for r in load_data(JobSpec(dataset=str(path), trainer="kto")).train] == [True, False]


@pytest.mark.parametrize("label", ["yes please", 2, None, [True]])
def test_bad_label_is_named(tmp_path: Path, label: Any) -> None:
    text = problems_text(write(tmp_path / "d.jsonl", [GOOD, {**GOOD, "label": label}, BAD]))
    assert "row 2:" in text and ("`label`" in text) and "Fix:" in text


def test_one_class_warns(tmp_path: Path) -> None:
    info = check_dataset(write(tmp_path / "d.jsonl", [GOOD] * 8), KTO)
    assert any("no undesirable (label false) rows" in w for w in info.warnings)


def test_kto_takes_preference_rows_and_sft_refuses_unpaired_rows(tmp_path: Path) -> None:
    assert check_dataset("sample:preference-format", KTO).format is RowFormat.PREFERENCE
    text = problems_text(write(tmp_path / "d.jsonl", [GOOD, BAD]), Trainer.SFT)
    assert (
        "has unpaired rows (prompt/completion/label), which the sft trainer cannot use. Fix: set trainer: kto" in text
    )
    text = problems_text("sample:chat-format", KTO)
    assert "the kto trainer needs prompt/completion/label rows" in text and "sample:kto-format" in text
    assert "set trainer: dpo or kto" in problems_text("sample:preference-format", Trainer.SFT)


# ---------------------------------------------------------------------- mapping
def test_kto_config_mapping(tmp_path: Path) -> None:
    from trl import KTOConfig

    from jobs.config.mapping import training_config

    spec = JobSpec(trainer=KTO, dataset="sample:kto-format", beta=0.2, desirable_weight=1.5, undesirable_weight=3.0)
    resolved = resolved_config(spec, CPU, str(tmp_path))
    kw = resolved["trainer_config"]
    assert resolved["trainer_config_class"] == "KTOConfig"
    assert (kw["beta"], kw["desirable_weight"], kw["undesirable_weight"], kw["loss_type"]) == (0.2, 1.5, 3.0, "kto")
    assert "padding_free" not in kw and "packing" not in kw
    args = training_config(spec, CPU, str(tmp_path))
    assert isinstance(args, KTOConfig) and args.undesirable_weight == 3.0 and args.bf16 is False
    assert JobSpec(trainer=KTO, loss_type="apo_zero_unpaired").replace().loss_type.value == "apo_zero_unpaired"


# ---------------------------------------------------------------------- refused combinations
@pytest.mark.parametrize(
    "changes,message",
    [
        ({"per_device_train_batch_size": 1}, "per_device_train_batch_size: must be at least 2 for kto"),
        (
            {"padding_free": True},
            "padding_free: is not supported by the KTO trainer. Fix: set padding_free: false for kto",
        ),
        ({"packing": True}, "packing: is only supported by the SFT trainer. Fix: set packing: false for kto"),
        ({"loss_type": "sigmoid"}, "loss_type: sigmoid is a DPO loss. Fix: for kto use auto, apo_zero_unpaired, kto"),
        ({"trainer": "dpo", "loss_type": "kto"}, "loss_type: kto is a KTO loss. Fix: for dpo use auto"),
        ({"assistant_only_loss": True}, "assistant_only_loss: is an SFT option"),
        ({"lora_target_modules": "q_proj,lm_head"}, "lora_target_modules: an adapter on lm_head is not trained by kto"),
    ],
)
def test_refused_before_queueing(changes: dict, message: str) -> None:
    messages = refusal_messages({"trainer": "kto", "dataset": "sample:kto-format", **changes})
    assert any(message in m for m in messages), messages


@pytest.mark.integration
@pytest.mark.parametrize(
    "changes,error",
    [
        ({"per_device_train_batch_size": 1}, "Actual (not effective) batch size must be > 1"),
        ({"lora_target_modules": "q_proj,lm_head"}, "Applying a PEFT adapter to `lm_head` is not supported"),
    ],
)
def test_the_library_really_rejects_them(
    changes: dict, error: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With our check off, trl fails on each: the refusals above are grounded, not guessed."""
    import re

    import jobs.train.training

    monkeypatch.setattr(jobs.train.training, "capability_problems", lambda spec, device=None: [])
    ref = write(tmp_path / "d.jsonl", [GOOD, BAD] * 4)
    spec = dataclasses.replace(tiny_spec(tiny_model, trainer="kto", dataset=ref, max_steps=1), **changes)
    with pytest.raises(Exception, match=re.escape(error)):
        jobs.train.training.train_spec(spec, tmp_path / "out", device=CPU)


# ---------------------------------------------------------------------- training
@pytest.mark.integration
@pytest.mark.slow
def test_kto_trains_through_the_worker(store, tiny_model: Path) -> None:
    """The real worker and child: KTO with LoRA on the bundled sample; its metrics reach the run page."""
    from app.ui.run import RunPageData
    from jobs.worker.loop import Worker

    spec = tiny_spec(
        tiny_model,
        trainer="kto",
        dataset="sample:kto-format",
        max_steps=3,
        max_train_samples=12,
        per_device_train_batch_size=4,
        eval_split=4,
    )
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    assert run.resolved_config["trainer_config_class"] == "KTOConfig"
    assert run.resolved_config["peft_config_class"] == "LoraConfig"
    names = set(store.metric_names(run_id))
    assert {"loss", "kl", "rewards/margins", "rewards/chosen", "rewards/rejected", "eval_loss"} <= names
    assert len(store.metrics(run_id, ["loss"])) == 3
    assert store.metrics(run_id, ["rewards/margins"])  # logged for micro-batches holding both labels
    assert set(RunPageData(store).frames(run_id, "kto")[4]["series"]) == {"reward margin", "KL estimate"}


def test_kto_example() -> None:
    spec = JobSpec.from_yaml(Path("examples/smollm2-kto.yaml").read_text())
    assert (spec.trainer, spec.dataset, spec.method.value) == (KTO, "sample:kto-format", "lora")
    assert spec.per_device_train_batch_size >= 2 and capability_problems(spec, CPU) == []


def test_kto_config_has_no_padding_free_or_packing() -> None:
    from trl import KTOConfig

    for key in ("padding_free", "packing"):
        with pytest.raises(TypeError, match=key):
            KTOConfig(output_dir="unused", use_cpu=True, bf16=False, **{key: True})
