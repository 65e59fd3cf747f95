"""Each trainer's facts live in its record (`jobs.spec.trainer_records`), and the records are true of trl.

- every `Trainer` has a record, looked up by enum member or YAML word;
- each record's trl classes import, its config takes the keywords the record says only it reads and lacks
  the ones the record drops, trl's default loss is the record's, and its trainer takes what
  `jobs.train.trainers.build_trainer` passes because of the record (ref_model, reward functions);
- importing the records stays cheap (no trl);
- no `Trainer.<NAME>` is named outside the enum, the records and the few files listed in `ALLOWED`: a new
  branch on a trainer becomes a fact in its record instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
from enum import Enum

import pytest
from import_graph import ROOT, module_files

from jobs.spec.enums import LossType, Trainer
from jobs.spec.evaluation import greater_is_better
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import RECORDS, TrainerRecord, record_for, trainers_where

# Where a trainer may be named: the enum (and its applicability sets), the records, and two spec sections that
# other work owns (the `trainer` field's default; GRPO's beta `when=` set). Keep it this short.
ALLOWED = {
    "jobs/spec/enums.py",
    "jobs/spec/trainer_records.py",
    "jobs/spec/sections/method.py",
    "jobs/spec/sections/trainers.py",
}
NAMED = re.compile(r"\bTrainer\.(" + "|".join(t.name for t in Trainer) + r")\b")


def _default(field: dataclasses.Field) -> object:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def test_every_trainer_has_one_record() -> None:
    assert list(RECORDS) == list(Trainer)
    for trainer, record in RECORDS.items():
        assert record.trainer is trainer
        assert record_for(trainer) is record is record_for(trainer.value)
    with pytest.raises(ValueError):
        record_for("ppo")


@pytest.mark.parametrize("trainer", list(Trainer), ids=lambda t: t.value)
def test_the_record_is_true_of_trl(trainer: Trainer) -> None:
    record = record_for(trainer)
    config = record.config_type()
    assert dataclasses.is_dataclass(config) and config.__name__ == record.config_class
    fields = {f.name: f for f in dataclasses.fields(config)}
    assert set(record.kwargs) <= set(fields), set(record.kwargs) - set(fields)
    assert not set(record.unsupported) & set(fields), set(record.unsupported) & set(fields)
    if "loss_type" in record.kwargs:
        trl_default = _default(fields["loss_type"])
        assert record.default_loss == (trl_default[0] if isinstance(trl_default, list) else trl_default)
        assert record.default_loss in {loss.value for loss in record.losses}
    else:
        assert record.default_loss == "auto" and not record.losses
    built = record.trainer_type()
    assert built.__name__ == record.trainer_class
    takes = inspect.signature(built.__init__).parameters
    if record.ref_model_none:
        assert "ref_model" in takes
    if record.generates:
        assert {"reward_funcs", "reward_processing_classes"} <= set(takes)


@pytest.mark.parametrize("trainer", list(Trainer), ids=lambda t: t.value)
def test_the_record_is_consistent(trainer: Trainer) -> None:
    from jobs.config.trainers import KWARG_VALUES
    from jobs.train.trainers import CALLBACKS

    record = record_for(trainer)
    assert set(record.kwargs) <= set(KWARG_VALUES)  # each keyword has its value from the spec
    assert set(record.callbacks) <= set(CALLBACKS)
    assert record.eval_loss or record.watch != "eval_loss"
    assert record.better == ("higher" if greater_is_better(record.watch) else "lower")
    assert record.reference in ("always", "beta", "none")
    assert record.losses <= set(LossType)
    assert record.row_formats and record.rows and record.sample.startswith("sample:")
    spec = JobSpec(trainer=trainer)
    for refusal in record.refuses:  # a refusal names a spec field and values it can take
        kind = type(getattr(spec, refusal.field))
        assert issubclass(kind, Enum)
        assert all(kind(v) for v in refusal.values)


def test_the_facts_pick_the_trainers_they_did() -> None:
    """The sets that were spelled out as lists of trainers before the records (behaviour kept)."""
    assert trainers_where(paired=True) == (Trainer.DPO, Trainer.REWARD, Trainer.ORPO, Trainer.CPO)
    assert trainers_where(renders_tools=False) == (Trainer.ORPO, Trainer.CPO)
    assert trainers_where(generates=True) == (Trainer.GRPO,)
    assert trainers_where(score_head=True) == trainers_where(drops_long_rows=True) == (Trainer.REWARD,)
    assert trainers_where(image_chat=True) == (Trainer.SFT,) and trainers_where(image_pairs=True) == (Trainer.DPO,)
    assert trainers_where(min_batch=2) == (Trainer.KTO,) and trainers_where(eval_loss=False) == (Trainer.GRPO,)
    assert [t for t, r in RECORDS.items() if "padding_free" in r.unsupported] == [
        Trainer.KTO,
        Trainer.REWARD,
        Trainer.ORPO,
        Trainer.CPO,
        Trainer.GRPO,
    ]
    assert [t for t, r in RECORDS.items() if r.task_type != "CAUSAL_LM"] == [Trainer.REWARD]


def test_importing_the_records_stays_cheap() -> None:
    code = "import sys, jobs.spec.trainer_records; print(sorted(m for m in ('trl', 'transformers', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_trainers_are_named_only_in_their_records() -> None:
    named = {
        path.relative_to(ROOT).as_posix(): sorted(set(NAMED.findall(path.read_text())))
        for path in module_files().values()
    }
    outside = {path: names for path, names in named.items() if names and path not in ALLOWED}
    assert not outside, f"branch on the trainer's record (jobs/spec/trainer_records.py) instead: {outside}"


def test_a_record_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        record_for(Trainer.SFT).generates = True  # type: ignore[misc]
    assert isinstance(record_for(Trainer.SFT), TrainerRecord)
