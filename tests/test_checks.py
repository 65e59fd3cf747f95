"""The one check pipeline (`jobs.checks.pipeline.check`): each check runs once per submit, whatever the
entry point, and an unexpected error in a check fails the submit instead of hiding a refusal."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import training_helpers

from jobs.checks.access import AccessPolicy
from jobs.checks.pipeline import check
from jobs.spec.job import JobSpec

# The functions behind each check, by module and name (where the pipeline looks them up).
COUNTED = {
    "access": ("jobs.checks.access", "AccessPolicy.problems"),
    "model": ("jobs.models.references", "check_model"),
    "data": ("jobs.data.inspection", "check_dataset"),
    "tokenizer": ("jobs.models.tokenizer", "local_tokenizer"),
    "architecture": ("jobs.memory.model_config", "arch_with_source"),
    "prediction": ("jobs.memory.predict", "predict"),
    "lengths": ("jobs.checks.pipeline", "measured_lengths"),
    "device": ("jobs.checks.pipeline", "device_problems"),
    "combinations": ("jobs.checks.pipeline", "combination_problems"),
}


def count_calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count every call of the functions in COUNTED (data sets by field), still calling them."""
    import importlib

    calls: Counter = Counter()
    for name, (module_name, attr) in COUNTED.items():
        owner: Any = importlib.import_module(module_name)
        *path, leaf = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        real = getattr(owner, leaf)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            field = kwargs.get("field", args[2] if len(args) > 2 else "dataset") if _name == "data" else ""
            calls[f"{_name} {field}".strip()] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, leaf, counted)
    return calls


def a_spec(tiny_model: Path) -> JobSpec:
    """Every step has work: two data sets, assistant_only_loss (rows and template), a model on disk."""
    return training_helpers.tiny_spec(
        tiny_model, max_steps=1, assistant_only_loss=True, eval_dataset="sample:chat-format:eval"
    )


ONCE = {
    "access": 1,
    "model": 1,
    "data dataset": 1,
    "data eval_dataset": 1,
    "tokenizer": 1,
    "architecture": 1,
    "prediction": 2,  # this data's worst micro-batch, and the bound of rows at max_length
    "lengths": 1,
    "device": 1,
    "combinations": 1,
}


def test_a_form_submit_runs_each_check_once(store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ui import form as ui_form

    spec = a_spec(tiny_model)
    calls = count_calls(monkeypatch)
    errors, run_id = ui_form.launch(store, *ui_form.form_values(spec), policy=AccessPolicy.dashboard())
    assert errors == "" and run_id is not None
    assert dict(calls) == ONCE


def test_an_api_submit_runs_each_check_once(store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app import api

    spec = a_spec(tiny_model)
    calls = count_calls(monkeypatch)
    out = api.submit_yaml(store, spec.to_yaml(), AccessPolicy.dashboard())
    assert out["problems"] == [] and out["run_id"] is not None
    assert dict(calls) == ONCE


def test_a_cli_submit_and_a_sweep_run_each_check_once(store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.queue.submit import submit
    from jobs.queue.sweep import queue_sweep
    from jobs.spec.tricks.registry import Trick

    spec = a_spec(tiny_model)
    calls = count_calls(monkeypatch)
    submit(store, spec)
    assert dict(calls) == ONCE
    calls.clear()
    queue_sweep(store, spec, [Trick.BASELINE], steps=1)
    # the probes' own device/combination checks come on top: one per probe spec
    assert {k: v for k, v in calls.items() if k not in ("device", "combinations")} == {
        k: v for k, v in ONCE.items() if k not in ("device", "combinations")
    }


def test_a_predictor_bug_fails_submit_loudly(store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app import api
    from app.ui import form as ui_form
    from jobs.queue.submit import submit

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the predictor")

    monkeypatch.setattr("jobs.memory.predict.predict", broken)
    spec = training_helpers.tiny_spec(tiny_model, max_steps=1)
    with pytest.raises(RuntimeError, match="a bug in the predictor"):
        submit(store, spec)
    with pytest.raises(RuntimeError, match="a bug in the predictor"):
        ui_form.launch(store, *ui_form.form_values(spec))
    with pytest.raises(RuntimeError, match="a bug in the predictor"):
        api.submit_yaml(store, spec.to_yaml())
    assert store.count_runs() == 0  # nothing queued without its memory check


def test_a_bug_reading_the_architecture_fails_loudly(store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.queue.submit import submit

    def broken(text: str) -> Any:
        raise KeyError("hidden_size")

    monkeypatch.setattr("jobs.memory.model_config._arch_from_text", broken)
    with pytest.raises(KeyError, match="hidden_size"):
        submit(store, training_helpers.tiny_spec(tiny_model, max_steps=1))
    assert store.count_runs() == 0


def test_values_that_do_not_parse_still_get_their_data_checked(data_home: Path, tmp_path: Path) -> None:
    checked = check({"lora_r": 0, "dataset": str(tmp_path / "missing.jsonl")})
    assert checked.spec is None and checked.prediction is None
    assert {"lora_r", "dataset"} <= {p.field for p in checked.problems}
    refused = check({"lora_r": 0, "dataset": "/etc/passwd"}, policy=AccessPolicy.for_server(login=True))
    assert any("data folders" in p.problem for p in refused.problems if p.field == "dataset")


def test_check_returns_the_facts_later_steps_use(tiny_model: Path) -> None:
    from jobs.devices.probe import cpu_facts

    checked = check(a_spec(tiny_model), device=cpu_facts())
    assert checked.problems == [] and checked.accepted() == a_spec(tiny_model)
    assert set(checked.data) == {"dataset", "eval_dataset"} and checked.data["dataset"].n_rows > 0
    assert checked.prediction is not None and checked.prediction.device == cpu_facts()
    assert checked.memory.source.endswith("config.json")
