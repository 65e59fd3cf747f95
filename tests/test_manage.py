"""Runs you can manage: delete with files (nothing else lost), tags and notes, search, disk use, CLI."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from app.cli.main import main
from jobs.queue import run_actions
from jobs.spec.job import JobSpec
from storage import models as m
from storage.models import RunStatus
from storage.run_files import DiskUsage, run_bytes, total_bytes
from storage.store import MemoryPoint, MetricPoint, RunningRunError, Store


def _finished_run(store: Store, name: str, files: dict[str, bytes]) -> int:
    """A succeeded run with metrics, memory samples, an artifact, tags and files in its folder."""
    run_id = store.create_run(JobSpec(run_name=name))
    store.claim_next_on_device("w", "cpu")
    store.add_metrics(run_id, [MetricPoint(s, "loss", 2.0 - s / 100, float(s)) for s in range(50)])
    store.add_memory_samples([MemoryPoint(1e9 + i, "host", run_id, process_rss=1000 + i) for i in range(20)])
    folder = store.run_dir(run_id)
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    store.add_artifact(run_id, "bundle", str(folder / "bundle.zip"), 3, "0" * 64)
    store.change_tags(run_id, add=[f"t-{name}", "shared"])
    store.set_note(run_id, f"note of {name}")
    store.mark_succeeded(run_id, {"train_loss": 1.5})
    return run_id


def _snapshot(store: Store, run_id: int) -> dict:
    """Everything stored about a run, rows and file contents."""
    folder = store.run_dir(run_id)
    files = {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    return {
        "run": store.get_run(run_id),
        "metrics": store.metrics(run_id),
        "series": store.metric_series(run_id, "loss", 16),
        "memory": store.memory_samples(run_id),
        "artifacts": store.artifacts(run_id),
        "files": files,
    }


def test_delete_removes_one_run_and_nothing_else(store: Store, data_home: Path) -> None:
    a = _finished_run(store, "a", {"train.log": b"a log\n", "bundle.zip": b"zip", "output/checkpoint-2/x": b"1" * 5000})
    b = _finished_run(store, "b", {"train.log": b"b log\n", "bundle.zip": b"zip", "output/w.safetensors": b"2" * 9000})
    c = _finished_run(store, "c", {"train.log": b"c log\n", "bundle.zip": b"zip"})
    idle = store.add_memory_samples([MemoryPoint(5e9, "host", None, process_rss=7)])
    upload = data_home / "uploads" / "mine.jsonl"
    upload.parent.mkdir(parents=True, exist_ok=True)
    upload.write_text('{"text": "kept"}\n')
    before = {r: _snapshot(store, r) for r in (a, c)}
    freed = run_bytes(store, b)
    assert freed >= 9000

    report = run_actions.delete(store, b)

    assert report.freed_bytes == freed and f"deleted run {b} (b)" in report.message
    assert store.get_run(b) is None and not (store.run_path(b)).exists()
    assert store.metrics(b) == [] and store.metric_series(b, "loss", 16) == [] and store.memory_samples(b) == []
    assert store.artifacts(b) == [] and "t-b" not in store.tag_counts()
    assert {r: _snapshot(store, r) for r in (a, c)} == before
    assert store.tag_counts() == {"shared": 2, "t-a": 1, "t-c": 1}
    assert idle == 1 and len(store.memory_samples(None)) == 1 + 20 * 2  # idle samples stay
    assert upload.read_text() == '{"text": "kept"}\n'


def test_a_running_run_is_refused_until_cancelled(store: Store) -> None:
    run_id = store.create_run(JobSpec())
    store.run_dir(run_id).joinpath("train.log").write_text("training\n")
    store.claim_next_on_device("w", "cpu")
    with pytest.raises(run_actions.RunCommandError) as exc:
        run_actions.delete(store, run_id)
    (problem,) = exc.value.problems
    assert problem.field == "RUN_ID" and "is running" in problem.problem and "cancel" in problem.fix
    with pytest.raises(RunningRunError):  # the store itself refuses, inside its write transaction
        store.delete_run(run_id)
    assert store.get_run(run_id) is not None and store.run_dir(run_id).joinpath("train.log").exists()
    store.request_cancel(run_id)
    store.mark_cancelled(run_id)
    run_actions.delete(store, run_id)
    assert store.get_run(run_id) is None


def test_deleted_ids_are_never_handed_out_again(store: Store) -> None:
    first, newest = store.create_run(JobSpec()), store.create_run(JobSpec())
    store.delete_run(newest)
    assert store.create_run(JobSpec()) == newest + 1
    store.delete_run(first)
    assert store.create_run(JobSpec()) == newest + 2
    assert store.create_run_unchecked("{}") == newest + 3


def test_tags_notes_and_search(store: Store) -> None:
    a = store.create_run(JobSpec(run_name="Qwen sweep 50%"))
    b = store.create_run(JobSpec(run_name="llama baseline"))
    run = run_actions.tag(store, a, add="lr-sweep, fast", note="  the good one  ")
    assert run.tags == ("fast", "lr-sweep") and run.note == "the good one"
    run_actions.tag(store, b, add=["baseline"])
    assert [r.id for r in store.list_runs(search="qwen")] == [a]  # case-insensitive
    assert [r.id for r in store.list_runs(search="50%")] == [a]  # % is literal, not a wildcard
    assert [r.id for r in store.list_runs(search="%")] == [a]
    assert [r.id for r in store.list_runs(search="GOOD")] == [a]  # the note
    assert [r.id for r in store.list_runs(search="base")] == [b]  # name and tag
    assert [r.id for r in store.list_runs(tag="fast")] == [a]
    assert store.list_runs(tag="las") == []  # a tag filter is exact
    assert [r.id for r in store.list_runs(search=str(b))] == [b]
    run = run_actions.tag(store, a, remove=["fast"], note="")
    assert run.tags == ("lr-sweep",) and run.note is None


def test_bad_tags_and_notes_name_the_field_and_the_fix(store: Store) -> None:
    with pytest.raises(run_actions.RunCommandError) as exc:
        run_actions.tag(store, 99, add="ok, -dash, way-too-long-" + "x" * 70, note="n" * 10_001)
    fields = [p.field for p in exc.value.problems]
    assert fields == ["RUN_ID", "tags", "tags", "note"]
    assert all(p.fix for p in exc.value.problems)
    assert "`-dash` is not a valid tag" in exc.value.problems[1].problem


def test_disk_use_per_run_and_in_total(store: Store, data_home: Path) -> None:
    a = _finished_run(store, "a", {"big.bin": b"x" * 100_000})
    b = store.create_run(JobSpec())
    (store.runs_root / "orphan").mkdir()
    (store.runs_root / "orphan" / "f").write_bytes(b"y" * 50_000)
    usage = DiskUsage(store)
    assert usage.of(store.get_run(a)) >= 100_000 and usage.of(store.get_run(b)) == 0
    assert total_bytes(store) >= 150_000
    (store.run_dir(a) / "more.bin").write_bytes(b"z" * 100_000)
    assert usage.of(store.get_run(a)) < 200_000  # a finished run is measured once
    assert DiskUsage(store).of(store.get_run(a)) >= 200_000


def test_schema_5_database_gains_notes_and_tags(data_home: Path) -> None:
    path = data_home / "v5.db"
    Store(f"sqlite:///{path}").dispose()
    with sqlite3.connect(path) as con:  # as schema 5 left it: no note column, no run_tags table
        con.execute("DROP TABLE run_tags")
        con.execute("ALTER TABLE runs DROP COLUMN note")
        con.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
        con.execute(
            "INSERT INTO runs (name, spec_json, status, created_at, queue_order, cancel_requested, current_step)"
            " VALUES ('old', ?, 'succeeded', 1.0, 1.0, 0, 0)",
            (JobSpec().to_json(),),
        )
    con.close()
    s = Store(f"sqlite:///{path}")
    assert s.schema_version == m.SCHEMA_VERSION >= 6
    (run,) = s.list_runs()
    assert run.name == "old" and run.tags == () and run.note is None
    s.change_tags(run.id, add=["kept"])
    s.set_note(run.id, "after the upgrade")
    assert s.get_run(run.id).tags == ("kept",) and s.get_run(run.id).note == "after the upgrade"
    s.dispose()


# ---------------------------------------------------------------------- the CLI
def test_cli_tag_runs_json_and_rm(store: Store, capsys) -> None:
    a = _finished_run(store, "alpha", {"big.bin": b"x" * 20_000})
    b = _finished_run(store, "beta", {"f": b"y"})
    assert main(["tag", str(a), "keep", "paper", "--note", "best so far"]) == 0
    assert "tags: keep, paper, shared, t-alpha" in capsys.readouterr().out
    assert main(["tag", str(a), "--remove", "paper"]) == 0
    capsys.readouterr()
    assert main(["runs", "--json", "--tag", "keep"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == a and row["tags"] == ["keep", "shared", "t-alpha"] and row["note"] == "best so far"
    assert row["disk_bytes"] >= 20_000 and row["status"] == "succeeded" and row["last_loss"] == pytest.approx(1.51)
    assert main(["runs", "--search", "ALPHA"]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "beta" not in out and "DISK" in out and "all 2 run(s) use" in out
    assert main(["rm", str(b), "999"]) == 2  # one bad id: nothing is deleted
    err = capsys.readouterr().err
    assert "RUN_ID: run 999 does not exist" in err and store.get_run(b) is not None
    assert main(["rm", str(b)]) == 2  # no terminal to confirm on (pytest's stdin)
    assert "--yes" in capsys.readouterr().err and store.get_run(b) is not None
    assert main(["rm", str(b), "--yes"]) == 0
    assert f"deleted run {b} (beta)" in capsys.readouterr().out
    assert store.get_run(b) is None and store.get_run(a) is not None


def test_cli_rm_refuses_a_running_run(store: Store, capsys) -> None:
    run_id = store.create_run(JobSpec())
    store.claim_next_on_device("w", "cpu")
    assert main(["rm", str(run_id), "--yes"]) == 2
    assert f"tunedeck cancel {run_id}" in capsys.readouterr().err
    assert store.get_run(run_id).status is RunStatus.RUNNING


def test_a_worker_flushing_a_deleted_run_s_last_samples_does_not_fail(store: Store) -> None:
    """The worker flushes a finished run's last samples a moment after it is marked finished."""
    from jobs.devices.sampler import Sampler

    class Probe:
        def sample(self, run_id: int | None, child_pid: int | None) -> list[MemoryPoint]:
            return [MemoryPoint(1e9, "host", run_id, used_bytes=123, process_rss=123)]

    kept = _finished_run(store, "kept", {})
    run_id = store.create_run(JobSpec())
    sampler = Sampler(store, Probe(), batch_size=100)  # not started: driven by hand
    sampler.set_run(run_id, None)
    sampler.sample_once()  # buffered, not yet written
    store.delete_run(run_id)
    sampler.set_run(None)  # flushes the buffer of the deleted run: dropped, no foreign-key error
    store.add_metrics(run_id, [MetricPoint(1, "loss", 1.0, 1.0)])
    store.add_metrics(kept, [MetricPoint(99, "loss", 0.5, 1.0)])
    assert store.memory_samples(run_id) == [] and store.metrics(run_id) == []
    assert store.last_metric(kept, "loss").step == 99
