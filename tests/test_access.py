"""A shared dashboard (login on) reads data only from its data folders and runs no remote code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.checks.access import AccessPolicy
from jobs.checks.pipeline import check
from jobs.queue.submit import submit
from jobs.spec.job import JobSpec, SpecError
from storage.settings import uploads_dir

ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def write_rows(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(ROW) for _ in range(4)) + "\n")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return write_rows(tmp_path / "elsewhere" / "secret.jsonl")


def test_without_a_login_every_path_stays_open(data_home: Path, outside: Path) -> None:
    policy = AccessPolicy.for_server(login=False)
    assert policy == AccessPolicy.dashboard() and not policy.restricted
    assert policy.problems(JobSpec(dataset=str(outside))) == []


@pytest.mark.parametrize("login", [False, True])
def test_no_dashboard_runs_remote_code_or_a_reward_function_unless_the_server_allows_it(
    data_home: Path, monkeypatch: pytest.MonkeyPatch, login: bool
) -> None:
    """Issue 32: a page in the same browser can reach a local dashboard, so its users bring no code by
    default; `serve --allow-remote-code` / `--allow-reward-function` (their variables) let them; the
    command line keeps both."""
    from jobs.checks.access import REMOTE_CODE_ENV, REWARD_FUNCTION_ENV

    monkeypatch.delenv(REMOTE_CODE_ENV, raising=False)
    monkeypatch.delenv(REWARD_FUNCTION_ENV, raising=False)
    spec = JobSpec(model="tiny-llama", trust_remote_code=True)
    (problem,) = AccessPolicy.for_server(login=login).problems(spec)
    assert problem.field == "trust_remote_code" and "--allow-remote-code" in problem.fix
    assert AccessPolicy.open().problems(spec) == []
    monkeypatch.setenv(REMOTE_CODE_ENV, "1")
    assert AccessPolicy.for_server(login=login).problems(spec) == []
    assert not AccessPolicy.for_server(login=login).allow_reward_function
    monkeypatch.setenv(REWARD_FUNCTION_ENV, "1")
    assert AccessPolicy.for_server(login=login).allow_reward_function


def test_with_a_login_paths_outside_the_data_folders_are_refused_before_reading(
    data_home: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = AccessPolicy.for_server(login=True)
    read = []
    monkeypatch.setattr("jobs.data.inspection.check_dataset", lambda *a, **k: read.append(a))
    for ref in (
        str(outside),
        f"{uploads_dir()}/../../elsewhere/secret.jsonl",
        "/etc/passwd",
        str(outside.parent / "missing.jsonl"),
        "~/notes.csv",
    ):
        problems = check(JobSpec(dataset=ref), policy=policy).problems
        mine = [p for p in problems if p.field == "dataset"]
        assert len(mine) == 1 and "data folders" in mine[0].problem and "TUNEDECK_DATA_DIRS" in mine[0].fix, ref
    # The same message whether or not the file exists, and no file was opened.
    assert read == []


def test_with_a_login_uploads_samples_and_hub_names_are_allowed(data_home: Path) -> None:
    policy = AccessPolicy.for_server(login=True)
    uploaded = write_rows(uploads_dir() / "mine.jsonl")
    shared = write_rows(data_home / "datasets" / "team.jsonl")
    for ref in (str(uploaded), str(shared), "sample:chat-format", "org/some-dataset"):
        assert policy.data_problem(ref, "dataset") is None, ref
    assert check(JobSpec(dataset=str(uploaded), eval_dataset=str(shared)), policy=policy).problems == []


def test_a_symlink_out_of_a_data_folder_is_refused(data_home: Path, outside: Path) -> None:
    link = uploads_dir() / "link.jsonl"
    link.symlink_to(outside)
    assert AccessPolicy.for_server(login=True).data_problem(str(link), "eval_dataset").field == "eval_dataset"


def test_data_dirs_setting_replaces_the_defaults(
    data_home: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEDECK_DATA_DIRS", str(outside.parent))
    policy = AccessPolicy.for_server(login=True)
    assert policy.data_problem(str(outside), "dataset") is None
    assert policy.data_problem(str(write_rows(uploads_dir() / "x.jsonl")), "dataset") is not None


def test_remote_code_needs_the_server_setting_when_shared(
    data_home: Path, monkeypatch: pytest.MonkeyPatch, store
) -> None:
    spec = JobSpec(model="tiny-llama", trust_remote_code=True, max_steps=1)
    with pytest.raises(SpecError) as err:
        submit(store, spec, AccessPolicy.for_server(login=True))
    assert [p.field for p in err.value.problems] == ["trust_remote_code"]
    assert "TUNEDECK_ALLOW_REMOTE_CODE=1" in err.value.problems[0].fix
    assert store.count_runs() == 0
    monkeypatch.setenv("TUNEDECK_ALLOW_REMOTE_CODE", "1")
    assert AccessPolicy.for_server(login=True).problems(spec) == []


def test_the_form_its_preview_and_the_api_apply_the_policy(data_home: Path, outside: Path, store) -> None:
    from app import api
    from app.ui import data as ui_data
    from app.ui import form as ui_form

    policy = AccessPolicy.for_server(login=True)
    text, rows = ui_data.preview_dataset(str(outside), "sft", policy=policy)
    assert "data folders" in text and rows.empty
    assert "secret" not in text.replace(str(outside), "")  # nothing of the file itself is shown
    text, _ = ui_data.preview_dataset(str(outside), "sft")  # without a login: today's behaviour
    assert "Detected format" in text
    spec = JobSpec(model="tiny-llama", dataset=str(outside), max_steps=1)
    values = ui_form.form_values(spec)
    errors, run_id = ui_form.launch(store, *values, policy=policy)
    assert run_id is None and "data folders" in errors
    out = api.submit_yaml(store, spec.to_yaml(), policy)
    assert out["run_id"] is None and [p["field"] for p in out["problems"]] == ["dataset"]
    assert store.count_runs() == 0
