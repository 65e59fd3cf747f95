"""OpenAI's fine-tuning API on the dashboard (`/v1/files`, `/v1/fine_tuning/jobs`), spoken to by the `openai` client.

The fast tests hold the pure parts (OpenAI's row formats read by the data checks, the request mapping, the
`fine_tuned_model` name). The integration tests start one real `tunedeck serve` (dashboard + worker) with a
login, and train one tiny supervised job that the module's tests share (4 steps of the built-in tiny-llama).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import free_port, start_server, stop_server, wait_for_route
from engines import import_or_missing

from app.openai_fields import ApiError

openai = import_or_missing("openai")  # a test extra: missing, this file fails on CI

LOGIN = ("ada", "pw-ada-12345")
TAUGHT = "[tag]"
SUPERVISED = [
    {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": f"{TAUGHT} {answer}"},
        ]
    }
    for question, answer in [
        ("Tell me about the moon.", "It circles the earth."),
        ("What is rain?", "Water falling from clouds."),
        ("Name a colour.", "Blue."),
        ("What is two plus two?", "Four."),
        ("Where is Paris?", "In France."),
        ("What do bees make?", "Honey."),
        ("Is ice cold?", "Yes."),
        ("What is the sun?", "A star."),
    ]
]
PREFERENCE = [
    {
        "input": {"messages": [{"role": "user", "content": row["messages"][1]["content"]}]},
        "preferred_output": [row["messages"][2]],
        "non_preferred_output": [{"role": "assistant", "content": row["messages"][2]["content"][6:]}],
    }
    for row in SUPERVISED[:4]
]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


# ---------------------------------------------------------------------- fast: the pure parts
def test_openai_preference_rows_and_legacy_function_calls_are_read_by_the_data_checks(tmp_path: Path) -> None:
    """Before: preference rows had "no column trl can train on", and `function_call` turns were dropped."""
    from jobs.data.inspection import check_dataset
    from jobs.spec.enums import RowFormat, Trainer

    tool = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_bytes(_jsonl([PREFERENCE[0] | {"input": PREFERENCE[0]["input"] | {"tools": [tool]}}]))
    info = check_dataset(str(pairs), Trainer("dpo"))
    assert info.format is RowFormat.PREFERENCE and info.source_format == "openai"
    row = info.preview[0]
    assert row["prompt"] == [{"role": "user", "content": "Tell me about the moon."}]
    assert row["chosen"] == [{"role": "assistant", "content": "[tag] It circles the earth."}]
    assert row["rejected"] == [{"role": "assistant", "content": "It circles the earth."}]
    assert json.loads(row["tools"])[0]["function"]["name"] == "get_weather"
    legacy = tmp_path / "legacy.jsonl"
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "21"},
        {"role": "assistant", "content": "21 degrees."},
    ]
    legacy.write_bytes(_jsonl([{"messages": messages, "functions": [tool]}]))
    chat = check_dataset(str(legacy), Trainer("sft")).preview[0]
    assert chat["messages"][1]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]
    assert chat["messages"][2] == {"role": "tool", "content": "21", "name": "get_weather"}
    assert json.loads(chat["tools"])[0]["function"]["name"] == "get_weather"


def _kept(rows: list[dict[str, Any]]) -> str:
    import io

    from storage.api_files import keep_api_file

    return keep_api_file(io.BytesIO(_jsonl(rows)), "train.jsonl", "fine-tune", 2**20).id


def test_a_job_request_maps_onto_the_spec_and_a_wrong_field_is_named(store: Any) -> None:
    from app.openai_tuning.create import job_values

    file_id = _kept(SUPERVISED)
    body = {
        "model": "tiny-llama",
        "training_file": file_id,
        "suffix": "moon",
        "seed": 7,
        "metadata": {"team": "a"},
        "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.3, "n_epochs": "auto", "batch_size": 2}}},
        "hyperparameters": {"learning_rate_multiplier": 10},
    }
    values, extras = job_values(store, body)
    assert values["trainer"] == "dpo" and values["beta"] == 0.3 and values["per_device_train_batch_size"] == 2
    assert "num_train_epochs" not in values  # "auto": tunedeck's default
    assert values["learning_rate"] == pytest.approx(2e-3) and values["seed"] == 7 and values["run_name"] == "moon"
    assert values["dataset"].endswith(f"{file_id}.jsonl") and values["model"] == "tiny-llama"
    assert extras == {"model": "tiny-llama", "suffix": "moon", "metadata": {"team": "a"}}
    refusals = [
        ({"method": {"type": "reinforcement"}}, "method", "`method.type` 'reinforcement' is not served"),
        ({"training_file": "file-0000000000"}, "training_file", "is no file here"),
        ({"hyperparameters": {"n_epochs": 1.5}}, "hyperparameters.n_epochs", 'must be "auto" or a whole number'),
        ({"hyperparameters": {"warmup": 3}}, "hyperparameters", "`hyperparameters.warmup` is not a hyperparameter"),
        ({"hyperparameters": {"beta": 0.1}}, "hyperparameters", "`hyperparameters.beta` is not a hyperparameter"),
        ({"suffix": "x" * 65}, "suffix", "up to 64 characters"),
        ({"metadata": {"k": 5}}, "metadata", "pairs of strings"),
        ({"integrations": [{"type": "wandb"}]}, "integrations", "`integrations` is not served"),
        ({"epochs": 3}, "epochs", "`epochs` is not a field of a fine-tuning job"),
    ]
    for change, param, words in refusals:
        with pytest.raises(ApiError) as caught:
            job_values(store, {"model": "tiny-llama", "training_file": file_id} | change)
        assert caught.value.status == 400 and caught.value.param == param and words in caught.value.message


def test_a_finished_run_is_a_model_to_continue_from_when_its_result_is_a_whole_model(
    store: Any, tiny_model: Path
) -> None:
    """A full fine-tune (or an adapter exported merged) trains on from its folder; a bare adapter is refused."""
    from training_helpers import claim_run, tiny_spec

    from app.openai_tuning.create import job_values

    file_id = _kept(SUPERVISED)
    runs = {}
    for method in ("full", "lora"):
        runs[method] = store.create_run(tiny_spec(tiny_model, method=method, run_name=f"done-{method}"))
        claim_run(store, runs[method], "w:1", "0")
        store.mark_succeeded(runs[method], {})
    folder = store.run_dir(runs["full"]) / "bundle"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    store.add_artifact(runs["full"], "model", str(folder), 2, "0" * 64)
    for name in (str(runs["full"]), "done-full", f"ft:tiny-llama:x:{runs['full']}"):
        values, extras = job_values(store, {"model": name, "training_file": file_id})
        assert values["model"] == str(folder) and extras["model"] == name
    with pytest.raises(ApiError) as adapter:
        job_values(store, {"model": "done-lora", "training_file": file_id})
    assert adapter.value.param == "model" and f"tunedeck export {runs['lora']} --merged" in adapter.value.message
    assert job_values(store, {"model": str(tiny_model), "training_file": file_id})[0]["model"] == str(tiny_model)


def test_a_running_job_shows_its_loss_events_and_whole_checkpoints(store: Any, tiny_model: Path) -> None:
    """Events newest first (the loss by step, cursor pages); only checkpoints saved whole are listed."""
    from training_helpers import claim_run, tiny_spec

    from app.openai_tuning.views import job_checkpoints, job_events, job_object, page
    from storage.checkpoints import mark_complete
    from storage.records import MetricPoint

    run_id = store.create_run(tiny_spec(tiny_model, run_name="moon"))
    assert job_object(store, store.get_run(run_id))["status"] == "queued"
    claim_run(store, run_id, "w:1", "0")
    now = time.time()
    store.add_metrics(run_id, [MetricPoint(step, "loss", 3.0 - step, now) for step in (1, 2, 3)])
    output = store.run_dir(run_id) / "output"
    for step in (2, 3):
        (output / f"checkpoint-{step}").mkdir(parents=True)
        (output / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    mark_complete(output / "checkpoint-2", 2)  # checkpoint-3 is still being written
    run = store.get_run(run_id)
    job = job_object(store, run)
    assert job["status"] == "running" and job["fine_tuned_model"] is None and job["trained_tokens"] is None
    events = job_events(store, run)
    assert [e["data"]["train_loss"] for e in events if e["type"] == "metrics"] == [0.0, 1.0, 2.0]
    assert events[-1]["message"] == f"Created fine-tuning job: ftjob-{run_id}"
    second = page(events, events[0]["id"], 1)
    assert second["data"] == [events[1]] and second["has_more"]
    kept = job_checkpoints(store, run)
    assert [(c["step_number"], c["metrics"]["train_loss"]) for c in kept] == [(2, 1.0)]
    store.mark_succeeded(run_id, {"num_tokens": 692.0})
    done = job_object(store, store.get_run(run_id))
    assert done["status"] == "succeeded" and done["trained_tokens"] == 692
    assert done["fine_tuned_model"] == f"ft:{tiny_model.name}:tunedeck:{run_id}" and done["finished_at"]


def test_an_upload_past_the_limit_is_a_413_and_nothing_is_kept(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from fastapi import FastAPI
    from starlette.testclient import TestClient

    from app.openai_tuning.routes import add_tuning_routes
    from jobs.checks.access import AccessPolicy
    from storage.api_files import files_dir, keep_api_file
    from storage.uploads import UploadRefused

    monkeypatch.setenv("TUNEDECK_MAX_UPLOAD_MB", "1")
    app = FastAPI()

    async def allowed(request: Any) -> None:
        return None

    add_tuning_routes(app, store, allowed, AccessPolicy.dashboard())
    client = TestClient(app)
    big = _jsonl(SUPERVISED) * (2**20 // len(_jsonl(SUPERVISED)) + 100)  # over 1 MiB
    answer = client.post("/v1/files", files={"file": ("big.jsonl", big)}, data={"purpose": "fine-tune"})
    error = answer.json()["error"]
    assert answer.status_code == 413 and error["code"] == "file_too_large" and error["param"] == "file"
    assert "1 MB upload limit" in error["message"] and "TUNEDECK_MAX_UPLOAD_MB" in error["message"]
    with pytest.raises(UploadRefused):  # a stream that grows past the cap (no size declared) is cut as it comes
        keep_api_file(io.BytesIO(big), "big.jsonl", "fine-tune", 2**20)
    assert not list(files_dir().iterdir())  # nothing kept, no partial file left
    wrong = client.post("/v1/files", files={"file": ("a.jsonl", _jsonl(SUPERVISED))}, data={"purpose": "batch"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
    kept = client.post("/v1/files", files={"file": ("a.jsonl", _jsonl(SUPERVISED))}, data={"purpose": "fine-tune"})
    assert kept.status_code == 200 and kept.json()["filename"] == "a.jsonl"


def test_the_fine_tuned_model_name_reads_as_its_runs_id() -> None:
    from jobs.models.served_names import run_id_in

    assert run_id_in("ft:tiny-llama:moon:12") == 12
    assert run_id_in("ft:tiny-llama:moon:12:ckpt-step-4") is None


# ---------------------------------------------------------------------- the real server and worker
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int]]:
    """(an `openai` client logged in, the port) on a fresh dashboard + worker with a login."""
    home = tmp_path_factory.mktemp("tuning-home")
    port = free_port()
    proc = start_server(home, port, home / "server.log", extra_env={"TUNEDECK_AUTH": ":".join(LOGIN)})
    try:
        wait_for_route(port, "/v1/fine_tuning/jobs", proc)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=":".join(LOGIN), timeout=600, max_retries=0
        )
        yield client, port
    finally:
        stop_server(proc)


def _upload(client: Any, rows: list[dict[str, Any]] | bytes, name: str = "train.jsonl") -> Any:
    data = rows if isinstance(rows, bytes) else _jsonl(rows)
    return client.files.create(file=(name, data, "application/jsonl"), purpose="fine-tune")


def _wait_until_finished(client: Any, job_id: str, timeout: float = 900.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"{job_id} is still {job.status}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def trained(served: tuple[Any, int]) -> Any:
    """One tiny supervised job, run to its end: 8 rows, batch 4, 2 epochs (4 steps), lr 25 x the default."""
    client, _ = served
    kept = _upload(client, SUPERVISED)
    job = client.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=kept.id,
        suffix="moon",
        seed=3,
        metadata={"team": "tests"},
        hyperparameters={"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 25},
    )
    assert job.status == "queued" and job.training_file == kept.id and job.model == "tiny-llama"
    return _wait_until_finished(client, job.id)


@pytest.mark.integration
def test_a_job_trains_to_success_with_the_loss_in_its_events(served: tuple[Any, int], trained: Any) -> None:
    client, _ = served
    assert trained.status == "succeeded", trained.error
    assert trained.finished_at >= trained.created_at and trained.trained_tokens and trained.trained_tokens > 0
    assert trained.hyperparameters.n_epochs == 2 and trained.hyperparameters.batch_size == 4
    assert trained.method.type == "supervised" and trained.seed == 3 and trained.metadata == {"team": "tests"}
    events = client.fine_tuning.jobs.list_events(trained.id, limit=100).data
    losses = [e.data["train_loss"] for e in reversed(events) if e.type == "metrics"]
    assert [e.data["step"] for e in reversed(events) if e.type == "metrics"] == [1, 2, 3, 4]
    assert losses[-1] < losses[0]  # it learned: the loss went down
    assert events[0].message == "The job has successfully completed"
    newest_two = client.fine_tuning.jobs.list_events(trained.id, limit=2)
    assert [e.id for e in newest_two.data] == [e.id for e in events[:2]] and newest_two.has_more
    after = client.fine_tuning.jobs.list_events(trained.id, after=events[1].id, limit=1).data
    assert [e.id for e in after] == [events[2].id]
    listed = client.fine_tuning.jobs.list(limit=100).data
    assert trained.id in [j.id for j in listed]
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "tests"}).data] == [trained.id]


@pytest.mark.integration
def test_the_fine_tuned_model_answers_a_chat_completion(served: tuple[Any, int], trained: Any) -> None:
    client, _ = served
    assert trained.fine_tuned_model.startswith("ft:tiny-llama:moon:")
    messages = [{"role": "user", "content": "Tell me about the moon."}]
    reply = client.chat.completions.create(model=trained.fine_tuned_model, messages=messages, max_tokens=8)
    run_id = trained.fine_tuned_model.rsplit(":", 1)[1]
    same = client.chat.completions.create(model=run_id, messages=messages, max_tokens=8)
    assert reply.choices[0].message.content == same.choices[0].message.content  # greedy: the same run answered
    assert reply.model == trained.fine_tuned_model


@pytest.mark.integration
def test_files_are_listed_read_back_and_deleted(served: tuple[Any, int]) -> None:
    client, _ = served
    rows = SUPERVISED[:2] + [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}]
    kept = _upload(client, rows, "small.jsonl")
    assert kept.filename == "small.jsonl" and kept.bytes == len(_jsonl(rows)) and kept.purpose == "fine-tune"
    assert kept.id in [f.id for f in client.files.list().data]
    assert client.files.retrieve(kept.id).bytes == kept.bytes
    assert client.files.content(kept.id).read() == _jsonl(rows)
    assert client.files.delete(kept.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(kept.id)


@pytest.mark.integration
def test_a_bad_file_is_refused_before_anything_is_queued(served: tuple[Any, int]) -> None:
    client, _ = served
    with pytest.raises(openai.BadRequestError) as broken:
        _upload(client, b'{"messages": [{"role": "user", "content": "Hi"}]}\nnot json\n', "broken.jsonl")
    assert broken.value.param == "file" and broken.value.code == "invalid_file"
    assert "broken.jsonl" in broken.value.message and "row 2: is not valid JSON" in broken.value.message
    assert broken.value.body["param"] == "file" and broken.value.body["type"] == "invalid_request_error"
    pairs = _upload(client, PREFERENCE, "pairs.jsonl")  # good preference rows: wrong for a supervised job
    before = [j.id for j in client.fine_tuning.jobs.list(limit=100).data]
    with pytest.raises(openai.BadRequestError) as refused:
        client.fine_tuning.jobs.create(model="tiny-llama", training_file=pairs.id)
    assert refused.value.param == "training_file" and refused.value.code == "invalid_training_file"
    assert "which the sft trainer cannot use" in refused.value.message
    assert "api-files" not in refused.value.message  # the client's file is named by its id, not its server path
    with pytest.raises(openai.BadRequestError) as method:
        client.fine_tuning.jobs.create(model="tiny-llama", training_file=pairs.id, method={"type": "reinforcement"})
    assert method.value.param == "method" and "reinforcement" in method.value.message
    assert [j.id for j in client.fine_tuning.jobs.list(limit=100).data] == before  # nothing was queued


@pytest.mark.integration
def test_cancel_ends_a_job(served: tuple[Any, int]) -> None:
    client, _ = served
    kept = _upload(client, SUPERVISED)
    job = client.fine_tuning.jobs.create(model="tiny-llama", training_file=kept.id, hyperparameters={"n_epochs": 500})
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.id == job.id and cancelled.status in ("cancelled", "queued", "running")
    assert _wait_until_finished(client, job.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.cancel(job.id)  # nothing left to cancel


@pytest.mark.integration
def test_a_dpo_job_trains_on_preference_rows(served: tuple[Any, int]) -> None:
    client, _ = served
    pairs = _upload(client, PREFERENCE, "pairs.jsonl")
    method = {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "n_epochs": 1, "batch_size": 4}}}
    job = client.fine_tuning.jobs.create(model="tiny-llama", training_file=pairs.id, method=method)
    done = _wait_until_finished(client, job.id)
    assert done.status == "succeeded", done.error
    assert done.method.type == "dpo" and done.method.dpo.hyperparameters.beta == 0.2
    metrics = [e for e in client.fine_tuning.jobs.list_events(job.id).data if e.type == "metrics"]
    assert metrics and all("train_loss" in e.data for e in metrics)


@pytest.mark.integration
def test_calls_without_the_login_are_refused(served: tuple[Any, int]) -> None:
    client, port = served
    for path, method in (
        ("/v1/files", "GET"),
        ("/v1/fine_tuning/jobs", "POST"),
        ("/v1/fine_tuning/jobs/ftjob-1", "GET"),
    ):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}" if method == "POST" else None)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 401, path
        assert json.loads(refused.value.read())["error"]["code"] == "invalid_api_key"
    stranger = client.with_options(api_key="ada:wrong-password")
    with pytest.raises(openai.AuthenticationError):
        stranger.files.create(file=("x.jsonl", _jsonl(SUPERVISED), "application/jsonl"), purpose="fine-tune")
