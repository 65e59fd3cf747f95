"""Artifacts belong to their database: two databases sharing one data folder never share a run folder."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
import training_helpers

from jobs.spec.job import JobSpec
from jobs.worker.loop import Worker
from storage.identity import MARKER, RunFolderError
from storage.models import RunStatus
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)


def test_each_database_has_an_identity_written_once(store: Store) -> None:
    again = Store(store.url)
    assert again.database_id == store.database_id and len(store.database_id) == 32
    again.dispose()
    folder = store.run_dir(store.create_run(JobSpec(model="tiny-llama", max_steps=1)))
    assert folder.parent.name == store.database_id
    assert (folder / MARKER).read_text().strip() == store.database_id


def test_a_folder_of_another_database_is_refused(store: Store, data_home: Path) -> None:
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=1))
    folder = data_home / "runs" / store.database_id / f"{run_id:06d}"
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("0" * 32)  # e.g. a restored backup of another database's folders
    (folder / "train.log").write_text("someone else's log\n")
    with pytest.raises(RunFolderError, match="belongs to another database .* nothing was written"):
        store.run_dir(run_id)
    Worker(store, sample=False, poll_interval=0.1).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED and "belongs to another database" in run.error_summary
    assert (folder / "train.log").read_text() == "someone else's log\n"


def test_a_database_with_runs_before_its_identity_keeps_its_flat_folders(data_home: Path) -> None:
    path = data_home / "tunedeck.db"
    first = Store(f"sqlite:///{path}")
    run_id = first.create_run(JobSpec(model="tiny-llama", max_steps=1))
    first.dispose()
    with sqlite3.connect(path) as con:  # as an older tunedeck left it: no identity yet
        con.execute("DELETE FROM meta WHERE key IN ('database_id', 'runs_folder')")
    con.close()
    older = Store(f"sqlite:///{path}")
    assert older.run_dir(run_id) == data_home / "runs" / f"{run_id:06d}"
    older.dispose()


@pytest.mark.integration
@pytest.mark.slow
def test_two_databases_on_one_data_folder_keep_both_runs(
    store: Store, data_home: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: a second TUNEDECK_DATABASE_URL, the same data folder, run 1 in each."""
    other = Store(f"sqlite:///{data_home / 'second.db'}")
    spec = training_helpers.tiny_spec(tiny_model, max_steps=2, max_length=48)
    first_id = store.create_run(spec.replace(run_name="first"))
    second_id = other.create_run(spec.replace(run_name="second", lora_r=4, lora_alpha=8))
    assert first_id == second_id == 1
    for s in (store, other):
        monkeypatch.setenv("TUNEDECK_DATABASE_URL", s.url)  # what a user does between the two
        Worker(s, sample=False, poll_interval=0.1).work(burst=True)
        run = s.get_run(1)
        assert run.status is RunStatus.SUCCEEDED, (run.error_summary, run.error_detail)
    folders = [store.run_dir(1), other.run_dir(1)]
    assert folders[0] != folders[1]
    for s, folder, name in ((store, folders[0], "first"), (other, folders[1], "second")):
        assert f"run 1: {name}" in (folder / "train.log").read_text()
        [bundle] = [a for a in s.artifacts(1) if a.kind == "bundle"]
        assert Path(bundle.path).parent == folder
        assert hashlib.sha256(Path(bundle.path).read_bytes()).hexdigest() == bundle.sha256
        adapter = folder / "bundle" / "adapter_config.json"
        assert ('"r": 8' if name == "first" else '"r": 4') in adapter.read_text()
    other.dispose()
