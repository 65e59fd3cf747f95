"""Hyperparameter search (issue 47): the space checked against the spec's fields, the plan's problems, and the
driver's turns on a real store and a real Optuna study (no training: the runs' metrics and ends are written
as a worker and its training child would write them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.devices.facts import DeviceFacts
from jobs.search.driver import advance, search_tag, start_search
from jobs.search.plan import SearchError, SearchPlan
from jobs.search.space import SpaceError, parse_space
from storage.models import RunStatus
from storage.records import MetricPoint
from tests.training_helpers import claim_run, tiny_spec

MIB = 1024**2
BACKENDS = ("sqlite", "postgresql")  # the store's tables and Optuna's study in the same database, on each


def _base(model: Path | str = "tiny", **changes: Any) -> Any:
    return tiny_spec(Path(model), eval_split=0.25, eval_steps=2, max_steps=4, **changes)


@pytest.mark.parametrize(
    "item,field,words",
    [
        ("learnin_rate=loguniform(1e-5,1e-3)", "space.learnin_rate", "not a spec field"),
        ("optim=uniform(0,1)", "space.optim", "not a numeric field"),
        ("learning_rate=loguniform(0,1e-3)", "space.learning_rate", "log scale"),
        ("learning_rate=uniform(1e-3,1e-5)", "space.learning_rate", "not below"),
        ("learning_rate=uniform(1e-4,5)", "space.learning_rate", "out of range"),
        ("lora_r=uniform(8.5,16)", "space.lora_r", "whole numbers"),
        ("lora_r=[8,0]", "space.lora_r", "out of range"),
        ("optim=[adamw_torch,sgdd]", "space.optim", "sgdd"),
        ("lora_r", "space", "not FIELD=VALUES"),
        ("lora_r=8", "space.lora_r", "neither a range nor a list"),
        ("model=[tiny, other]", "space.model", "not a numeric, true/false or choice field"),
    ],
)
def test_space_refuses_what_the_spec_would(item: str, field: str, words: str) -> None:
    with pytest.raises(SpaceError) as err:
        parse_space([item], _base())
    assert any(p.field == field and words in p.problem + p.fix for p in err.value.problems), err.value.problems


def test_space_reads_ranges_and_choices() -> None:
    space = parse_space(
        [
            "learning_rate=loguniform(1e-5, 1e-3)",
            "lora_r=[8,16,32]",
            "lora_dropout=[0, 1e-1]",
            "lora_alpha=int(8,64)",
        ],
        _base(),
    )
    kinds = {d.field: (d.kind, d.whole) for d in space.dimensions}
    assert kinds == {
        "learning_rate": ("loguniform", False),
        "lora_r": ("choice", False),
        "lora_dropout": ("choice", False),
        "lora_alpha": ("int", True),
    }
    assert space.dimensions[1].choices == (8, 16, 32)
    assert space.dimensions[2].choices == (0.0, 0.1)  # numbers, though YAML reads 1e-1 as text


def test_plan_reports_every_problem_at_once() -> None:
    no_eval = tiny_spec(Path("tiny"))
    with pytest.raises(SearchError) as err:
        SearchPlan.build(no_eval, ["lora_r=uniform(8,16)"], trials=0, parallel=99, sampler="grid")
    fields = {p.field for p in err.value.problems}
    assert {"trials", "parallel", "sampler", "eval_steps"} <= fields, err.value.problems


def _publish_cpu(store: Any, total_bytes: int) -> None:
    """A CPU worker's device as it publishes it (TUNEDECK_CPU_MEMORY caps it; no runtime baseline yet)."""
    facts = DeviceFacts(kind="cpu", name="cpu", total_bytes=total_bytes, host="here")
    store.publish_device("here:1", "here", facts.to_dict())


def _finish(store: Any, run_id: int, losses: list[float], status: RunStatus = RunStatus.SUCCEEDED) -> None:
    """What a worker and its child write for a trial's run: eval_loss at steps 2, 4, ..., then its end."""
    claim_run(store, run_id, "here:1", "cpu")
    store.add_metrics(run_id, [MetricPoint(2 * (i + 1), "eval_loss", v, 0.0) for i, v in enumerate(losses)])
    if status is RunStatus.SUCCEEDED:
        store.mark_succeeded(run_id, {"eval_loss": losses[-1]})


def _optuna_states(store: Any, search: Any) -> list[str]:
    from jobs.search.study import study_trials

    return [t.state.name for t in study_trials(store, search)]


def test_a_point_that_will_not_fit_is_told_failed_and_never_queued(store: Any, tiny_model: Path) -> None:
    _publish_cpu(store, 100 * MIB)  # rank 8 predicts ~12 MiB on the tiny model, rank 4096 ~210 MiB
    plan = SearchPlan.build(_base(tiny_model), ["lora_r=[8,4096]"], trials=2, parallel=2, sampler="grid")
    search = start_search(store, plan)
    studies: dict[int, Any] = {}
    assert advance(store, search.id, studies)
    trials = {t.params["lora_r"]: t for t in store.search_trials(search.id)}
    assert trials[8].state == "running" and trials[8].run_id is not None
    refused = trials[4096]
    assert refused.state == "infeasible" and refused.run_id is None and "Will not fit" in (refused.reason or "")
    assert [r.id for r in store.queued()] == [trials[8].run_id]  # the refused point was never queued
    assert search_tag(search.id) in store.get_run(trials[8].run_id).tags
    assert sorted(_optuna_states(store, search)) == ["FAIL", "RUNNING"]

    _finish(store, trials[8].run_id, [2.0, 1.5])
    assert not advance(store, search.id, studies)  # told, budget spent: finished
    done = {t.params["lora_r"]: t for t in store.search_trials(search.id)}[8]
    assert done.state == "complete" and done.value == 1.5
    assert store.get_search(search.id).state == "finished"
    assert sorted(_optuna_states(store, search)) == ["COMPLETE", "FAIL"]


def test_a_trial_worse_than_the_median_is_pruned_through_cancel(store: Any, tiny_model: Path) -> None:
    _publish_cpu(store, 64 * 1024 * MIB)
    plan = SearchPlan.build(_base(tiny_model), ["learning_rate=loguniform(1e-4,1e-2)"], trials=3, seed=1)
    search = start_search(store, plan)
    studies: dict[int, Any] = {}
    advance(store, search.id, studies)
    first = store.search_trials(search.id)[0]
    assert first.params == {"learning_rate": plan.base.learning_rate}  # the base spec's own point comes first
    _finish(store, first.run_id, [1.0, 0.5])
    advance(store, search.id, studies)
    second = store.search_trials(search.id)[1]
    assert second.state == "running"
    _finish(store, second.run_id, [9.0], status=RunStatus.RUNNING)  # training, worse than the first at step 2
    store.get_run(second.run_id)
    advance(store, search.id, studies)
    pruning = store.search_trials(search.id)[1]
    assert pruning.state == "pruning" and "pruned at step 2" in (pruning.reason or "")
    assert store.run_control(second.run_id).cancel_requested  # the normal cancel path: the worker stops it
    assert len(store.search_trials(search.id)) == 2  # parallel 1: nothing new while it stops
    store.mark_cancelled(second.run_id)  # what the worker writes once its child has stopped
    advance(store, search.id, studies)
    trials = store.search_trials(search.id)
    assert trials[1].state == "pruned" and trials[1].value == 9.0
    assert _optuna_states(store, search)[:2] == ["COMPLETE", "PRUNED"]
    assert trials[2].state == "running"  # the budget goes on


def test_a_restart_between_ask_and_queue_neither_loses_nor_repeats_a_trial(store: Any, tiny_model: Path) -> None:
    _publish_cpu(store, 64 * 1024 * MIB)
    plan = SearchPlan.build(_base(tiny_model), ["lora_r=[8,16]"], trials=3, parallel=1, include_base=False)
    search = start_search(store, plan)
    from jobs.search.study import open_study

    study = open_study(store, search, plan)
    lost = study.ask()  # asked, then the worker died before recording it
    asked = study.ask()
    asked.suggest_categorical("lora_r", [8, 16])
    store.add_trial(search.id, asked.number, asked._trial_id, dict(asked.params))  # recorded, never queued

    studies: dict[int, Any] = {}  # a fresh worker: the study is opened again
    advance(store, search.id, studies)
    trials = store.search_trials(search.id)
    assert [(t.number, t.state) for t in trials] == [(asked.number, "running")]
    assert len(store.queued()) == 1
    states = dict(zip(range(len(s := _optuna_states(store, search))), s))
    assert states[lost.number] == "FAIL"
    advance(store, search.id, studies)  # a second turn queues nothing more while it trains
    assert len(store.queued()) == 1 and len(store.search_trials(search.id)) == 1


@pytest.mark.sqlite_only  # the command line's words; the driver tests hold its SQL on both databases
def test_cli_starts_shows_and_refuses_with_the_field_named(
    store: Any, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(_base(tiny_model).to_yaml())
    assert main(["search", str(spec), "--space", "lora_r=[8,0]", "--space", "optim=uniform(0,1)"]) == 2
    err = capsys.readouterr().err
    assert "space.lora_r" in err and "space.optim" in err
    assert store.list_searches() == []  # nothing recorded, nothing queued
    assert main(["search", str(spec), "--space", "learning_rate=loguniform(1e-4,1e-2)", "--trials", "3"]) == 0
    [search] = store.list_searches()
    assert f"search {search.id}:" in capsys.readouterr().out
    assert main(["search", "show", str(search.id)]) == 0
    assert "minimize eval_loss" in capsys.readouterr().out
    assert main(["search", "best", str(search.id)]) == 2  # no complete trial yet
    assert "no complete trial" in capsys.readouterr().err
    assert main(["search", "show", "999"]) == 2


def test_a_cpu_workers_memory_can_be_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.devices.probe import CPU_MEMORY_ENV, cpu_facts

    monkeypatch.setenv(CPU_MEMORY_ENV, "100MiB")
    assert cpu_facts().total_bytes == 100 * MIB
    monkeypatch.setenv(CPU_MEMORY_ENV, "")
    assert cpu_facts().total_bytes > 100 * MIB  # unset: the host's RAM


@pytest.mark.sqlite_only
def test_the_api_starts_a_search_or_names_every_problem(store: Any, tiny_model: Path) -> None:
    import gradio as gr

    from app.api_search import SearchEndpoints

    api = SearchEndpoints(store)
    spec_yaml = _base(tiny_model).to_yaml()
    refused = api.search(spec_yaml, ["lora_r=[8,0]", "model=[a,b]"], trials=0)
    assert refused["search_id"] is None and store.list_searches() == []
    assert {p["field"] for p in refused["problems"]} >= {"space.lora_r", "space.model", "trials"}
    started = api.search(spec_yaml, ["lora_r=[8,16]"], trials=2, sampler="grid")
    assert started["problems"] == [] and store.get_search(started["search_id"]).state == "active"
    shown = api.search_show(started["search_id"])
    assert shown["trials"] == 2 and shown["rows"] == [] and shown["best"] is None
    assert api.search_best(started["search_id"])["problems"][0]["field"] == "search"
    with pytest.raises(gr.Error):
        api.search_show(999)


@pytest.mark.sqlite_only
def test_a_schema_12_database_gains_the_search_tables(data_home: Path) -> None:
    import sqlite3

    from storage import models as m
    from storage.settings import database_url
    from storage.store import Store

    old = Store()
    old.dispose()
    with sqlite3.connect(database_url().removeprefix("sqlite:///")) as con:
        con.execute("DROP TABLE search_trials")
        con.execute("DROP TABLE searches")
        con.execute("UPDATE meta SET value = '12' WHERE key = 'schema_version'")
    store = Store()
    try:
        assert store.schema_version == m.SCHEMA_VERSION >= 13
        record = store.create_search("s", "{}")
        assert store.get_search(record.id).study_name == f"tunedeck-search-{record.id}"
    finally:
        store.dispose()
