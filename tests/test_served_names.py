"""Names never shadow ids or base models on the dashboard's OpenAI-compatible API (issue #48).

A run named `1` answered as model `1`, so run 1 could not be reached by its id; a run named `tiny-llama`
hid the base model `/v1/models` lists. Now an id always wins, then a base model, then a run's name;
`/v1/models` lists exactly what each name answers as; a run name that reads as an id or a base model is
refused before queueing. Runs stored before with such names keep them and answer by their id.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.openai_api import ApiError, model_list, resolve_model
from jobs.models.served_names import run_id_in, run_name_problems
from jobs.spec.job import JobSpec, SpecError


def _finished(store: Any, model: str = "tiny-llama", name: str | None = None) -> int:
    """A succeeded run; `name` is stored as it is (as a run stored before the name check)."""
    run_id = int(store.create_run(JobSpec(model=model, run_name=name)))
    assert store.claim_next_on_device("names-host:1", "0", host="names-host").id == run_id
    store.mark_succeeded(run_id, {})
    return run_id


def test_ids_in_the_ways_people_write_them() -> None:
    assert [run_id_in(t) for t in ("3", " 3 ", "#3", "run:3", "run 3", "Run #3", "run3")] == [3] * 7
    assert [run_id_in(t) for t in ("run-3", "3b", "tiny-llama", "v3", "", "3.0")] == [None] * 6


def test_an_id_always_wins_over_a_name(store: Any) -> None:
    first = _finished(store, name="alpha")
    shadow = _finished(store, name=str(first))  # stored before names were checked
    assert resolve_model(store, str(first)) == (first, "run")  # was the run named "1"
    assert resolve_model(store, f"run:{first}") == (first, "run")
    assert resolve_model(store, f"#{first}") == (first, "run")
    assert resolve_model(store, str(shadow)) == (shadow, "run")  # still reached, by its own id
    assert resolve_model(store, "alpha") == (first, "run")
    with pytest.raises(ApiError):
        resolve_model(store, "999")  # an id that is no finished run is not read as a name either


def test_a_base_model_wins_over_a_run_named_after_it(store: Any) -> None:
    trained = _finished(store, model="tiny-llama", name="plain")
    shadow = _finished(store, model="smollm2-135m-instruct", name="tiny-llama")
    assert resolve_model(store, "tiny-llama") == (trained, "base")  # was the run named "tiny-llama"
    assert resolve_model(store, str(shadow)) == (shadow, "run")


def test_the_model_list_says_exactly_what_each_name_answers_as(store: Any) -> None:
    first = _finished(store, name="alpha")
    _finished(store, name=str(first))
    _finished(store, model="smollm2-135m-instruct", name="tiny-llama")
    older = _finished(store, name="twin")
    newer = _finished(store, name="twin")
    listed = model_list(store)
    ids = [m["id"] for m in listed]
    assert len(ids) == len(set(ids))
    for entry in listed:
        kind = "base" if entry["id"] == entry["root"] and "parent" not in entry else "run"
        answer = resolve_model(store, entry["id"])
        assert answer[1] == kind and (kind == "base" or answer[0] == int(entry["id"])), entry
        if "name" in entry:  # a name is listed only with the run it answers as
            assert resolve_model(store, entry["name"]) == (int(entry["id"]), "run"), entry
    names = {int(m["id"]): m.get("name") for m in listed if "parent" in m}
    assert names[first] == "alpha" and names[newer] == "twin" and names[older] is None
    assert [n for n in names.values() if n in (str(first), "tiny-llama")] == []
    assert {"tiny-llama", "smollm2-135m-instruct"} <= {m["id"] for m in listed if "parent" not in m}


@pytest.mark.parametrize("name", ["7", "#7", "run:7", "run 7", "tiny-llama", "smollm2-135m-instruct", "org/stored"])
def test_a_run_name_that_would_be_shadowed_is_refused(store: Any, name: str) -> None:
    store.create_run(JobSpec(model="org/stored"))  # another run's base model: served once it finishes
    (problem,) = run_name_problems(JobSpec(model="tiny-llama", run_name=name), store)
    assert problem.field == "run_name" and f"`{name}`" in problem.problem
    assert "leave run_name empty" in problem.fix
    assert run_name_problems(JobSpec(model="tiny-llama", run_name=f"{name}-tuned"), store) == []
    assert run_name_problems(JobSpec(model="tiny-llama"), store) == []


def test_submit_refuses_the_name_and_queues_nothing(store: Any) -> None:
    from jobs.queue.submit import submit

    values = {"model": "tiny-llama", "dataset": "sample:chat-format", "max_steps": 3, "max_length": 64}
    for name in ("1", "tiny-llama"):
        before = store.count_runs()
        with pytest.raises(SpecError) as err:
            submit(store, {**values, "run_name": name})
        assert [p.field for p in err.value.problems] == ["run_name"]
        assert store.count_runs() == before


# ---------------------------------------------------------------------- the real dashboard
@pytest.mark.integration
def test_the_dashboards_v1_reaches_run_1_by_id(store: Any, data_home: Path) -> None:
    """On the real server (no worker, so a run answers 503 naming the run it resolved to)."""
    from browser_helpers import free_port, start_server, stop_server

    first = _finished(store, name="alpha")
    shadow = _finished(store, name=str(first))
    _finished(store, model="smollm2-135m-instruct", name="tiny-llama")
    port = free_port()
    proc = start_server(data_home, port, data_home / "names-server.log", args=["--no-worker"])
    try:
        listed = _models_once_served(port, proc)
        assert str(first) not in [m.get("name") for m in listed]
        assert "tiny-llama" not in [m.get("name") for m in listed]
        status, body = _ask(port, str(first))
        assert status == 503 and f"reach run {first}'s weights" in body["error"]["message"], body
        status, body = _ask(port, str(shadow))
        assert status == 503 and f"reach run {shadow}'s weights" in body["error"]["message"], body
    finally:
        stop_server(proc)


def _models_once_served(port: int, proc: Any, timeout: float = 300.0) -> list[dict[str, Any]]:
    """`/v1/models`, once `serve` has added the /v1 routes beside the page (404 until then)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60) as reply:
                return list(json.loads(reply.read())["data"])
        except urllib.error.HTTPError as err:
            assert err.code == 404 and proc.poll() is None and time.monotonic() < deadline, err
        time.sleep(0.2)


def _ask(port: int, model: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, dict(json.loads(reply.read()))
    except urllib.error.HTTPError as err:
        return err.code, dict(json.loads(err.read()))
