"""The run page's export panel: `tunedeck export` as a child process, its output streamed, its files listed."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import tiny_spec

from app.ui import export as ui_export
from jobs.checks.access import AccessPolicy
from storage.models import RunStatus

BACKENDS = ("sqlite",)  # the panel only reads the store; the store's backends are tested elsewhere


def test_the_command_follows_the_choices() -> None:
    assert ui_export.command(3, True, "fp32", []) == ["export", "3", "--merged", "--dtype", "fp32"]
    assert ui_export.command(3, False, "bf16", ["q8_0", "f16"]) == ["export", "3", "--gguf", "f16", "q8_0"]
    assert ui_export.command(3, True, "bf16", ["f16"]) == [
        "export",
        "3",
        "--merged",
        "--dtype",
        "bf16",
        "--gguf",
        "f16",
    ]


def test_refusals_say_why_and_what_to_do(store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.checks.access import REMOTE_CODE_ENV, loading_problem

    queued = store.create_run(tiny_spec(tiny_model))
    assert "Pick a run" in ui_export.refusal(store, None, True, [], None)
    assert "No run 999" in ui_export.refusal(store, 999, True, [], None)
    assert f"Run {queued} is queued" in ui_export.refusal(store, queued, True, [], None)
    ((text, _),) = list(ui_export.export(store, None, queued, True, "bf16", []))
    assert "only a finished run" in text
    monkeypatch.delenv(REMOTE_CODE_ENV, raising=False)
    shared = AccessPolicy.for_server(login=True)
    problem = loading_problem(tiny_spec(tiny_model, trust_remote_code=True), 7, shared, "export it")
    assert (
        problem is not None
        and "trust_remote_code" in problem.problem
        and "export it from the command line" in problem.fix
    )
    assert loading_problem(tiny_spec(tiny_model), 7, shared, "export it") is None


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.sqlite_only  # the training child's behaviour; its SQL is tested on both databases
def test_export_from_the_panel_streams_progress_and_lists_the_checked_files(store, tiny_model: Path) -> None:
    from jobs.worker.loop import Worker

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=4))
    Worker(store, poll_interval=0.1).work(burst=True)
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED
    assert "Nothing chosen" in ui_export.refusal(store, run_id, False, [], AccessPolicy.open())
    steps = list(ui_export.export(store, AccessPolicy.open(), run_id, True, "fp32", ["f16"]))
    logs = [text for text, _ in steps]
    assert len(logs) > 3 and logs[0].startswith("$ tunedeck export")  # line by line, not all at the end
    assert "export finished" in logs[-1], logs[-1]
    listed = ui_export.export_files(store, run_id)
    assert sorted(Path(p).suffix for p in listed) == [".gguf", ".zip"]
    assert all(Path(p).is_file() for p in listed)
