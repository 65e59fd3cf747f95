"""ORPO and CPO: preference tuning without a reference model, from trl.experimental (pinned, tested).

trl 1.16 keeps ORPOTrainer/CPOTrainer in `trl.experimental` ("APIs here are unstable and may change
or be removed without notice"), so pyproject pins trl to 1.16.x and these tests train both on the
CPU. Their sample is the bundled `sample:preference-format`.

Tried on this CPU with the capability check off (tiny Llama, 2 steps, each for orpo and cpo):
full, lora, dora, qlora, lora_8bit, ia3, prefix_tuning, gradient checkpointing train (padding_free
too, only because the mapping drops it: ORPOConfig/CPOConfig have no such field). prompt_tuning and
p_tuning fail ("Expected input batch_size (340) to match target batch_size (324)"): refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.config.mapping import capability_problems, resolved_config
from jobs.devices.facts import CPU
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec, SpecError
from storage.models import RunStatus
from tests.training_helpers import tiny_spec


def test_trl_is_pinned_where_the_experimental_trainers_live() -> None:
    import tomllib

    import trl
    from trl.experimental.cpo import CPOConfig, CPOTrainer  # noqa: F401
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer  # noqa: F401

    assert trl.__version__.startswith("1.16.")
    deps = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
    assert "trl>=1.16,<1.17" in deps


@pytest.mark.parametrize(
    "trainer,cls,kw",
    [
        ("orpo", "experimental.orpo.ORPOConfig", {"beta": 0.1}),
        ("cpo", "experimental.cpo.CPOConfig", {"beta": 0.1, "loss_type": "sigmoid"}),
    ],
)
def test_mapping(trainer: str, cls: str, kw: dict, tmp_path: Path) -> None:
    from jobs.config.mapping import training_config

    spec = JobSpec(trainer=Trainer(trainer), dataset="sample:preference-format")
    resolved = resolved_config(spec, CPU, str(tmp_path))
    assert resolved["trainer_config_class"] == cls
    got = resolved["trainer_config"]
    assert {k: got[k] for k in kw} == kw and "padding_free" not in got and "packing" not in got
    if trainer == "orpo":
        assert "loss_type" not in got
    args = training_config(spec, CPU, str(tmp_path))
    assert type(args).__name__ == cls.rsplit(".", 1)[1] and args.bf16 is False


def test_cpo_takes_dpo_losses() -> None:
    assert JobSpec(trainer=Trainer.CPO, loss_type="hinge").problems() == []


REFUSED = [
    ({"trainer": "orpo", "loss_type": "sigmoid"}, "loss_type: sigmoid is a DPO loss. Fix: for orpo use auto"),
    (
        {"trainer": "cpo", "loss_type": "nll"},
        "loss_type: nll is an SFT loss. Fix: for cpo use auto, hinge, ipo, sigmoid",
    ),
    ({"trainer": "orpo", "padding_free": True}, "padding_free: is not supported by the ORPO trainer"),
    (
        {"trainer": "cpo", "packing": True},
        "packing: is only supported by the SFT trainer. Fix: set packing: false for cpo",
    ),
    ({"trainer": "cpo", "dataset": "sample:kto-format"}, "the cpo trainer needs prompt/chosen/rejected rows"),
    ({"trainer": "orpo", "method": "prompt_tuning"}, "method: prompt_tuning fails with orpo"),
    ({"trainer": "cpo", "method": "p_tuning"}, "method: p_tuning fails with cpo"),
]


@pytest.mark.parametrize("changes,message", REFUSED)
def test_refused_before_queueing(changes: dict, message: str) -> None:
    from jobs.checks.pipeline import check

    data = {"dataset": "sample:preference-format", **changes}
    try:
        spec = JobSpec.from_dict(data)
    except SpecError as exc:
        messages = [str(p) for p in exc.problems]
    else:
        messages = [str(p) for p in capability_problems(spec, CPU) + check(spec).problems]
    assert any(message in m for m in messages), messages


@pytest.mark.parametrize("trainer", ["orpo", "cpo"])
def test_config_has_no_padding_free(trainer: str) -> None:
    import importlib

    module = importlib.import_module(f"trl.experimental.{trainer}")
    with pytest.raises(TypeError, match="padding_free"):
        getattr(module, f"{trainer.upper()}Config")(output_dir="unused", use_cpu=True, bf16=False, padding_free=True)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "trainer,series", [("orpo", {"reward margin", "log odds ratio"}), ("cpo", {"reward margin", "reward accuracy"})]
)
def test_trains_through_the_worker(trainer: str, series: set[str], store, tiny_model: Path) -> None:
    """The real worker and child: LoRA ORPO / CPO on the preference sample; metrics reach the run page."""
    from app.ui.run import RunPageData
    from jobs.worker.loop import Worker

    spec = tiny_spec(
        tiny_model,
        trainer=trainer,
        dataset="sample:preference-format",
        max_steps=3,
        max_train_samples=12,
        max_length=128,
        eval_split=4,
    )
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    assert run.resolved_config["trainer_config_class"].startswith("experimental.")
    names = set(store.metric_names(run_id))
    assert {"loss", "rewards/margins", "eval_loss"} <= names
    assert len(store.metrics(run_id, ["loss"])) == 3
    assert set(RunPageData(store).frames(run_id, trainer)[4]["series"]) == series


@pytest.mark.integration
@pytest.mark.parametrize("trainer,method", [("orpo", "p_tuning"), ("cpo", "prompt_tuning")])
def test_prompt_learning_really_fails(
    trainer: str, method: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With our check off, trl fails on these: the refusal is grounded, not guessed."""
    import dataclasses

    import jobs.train.training
    from jobs.spec.enums import Method

    monkeypatch.setattr(jobs.train.training, "capability_problems", lambda spec, device=None: [])
    spec = tiny_spec(
        tiny_model,
        trainer=trainer,
        dataset="sample:preference-format",
        max_steps=1,
        max_train_samples=4,
        max_length=128,
        num_virtual_tokens=4,
        eval_split=1,
    )
    spec = dataclasses.replace(spec, method=Method(method))
    with pytest.raises(ValueError, match="to match target batch_size"):
        jobs.train.training.train_spec(spec, tmp_path / "out", device=CPU)
