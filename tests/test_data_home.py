"""Where the data lives: one per-user folder unless TUNEDECK_HOME names another; an earlier version's ./data
is found, offered a move, and moved without losing a run or a file (storage.settings, storage.data_home)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.cli.main import main
from jobs.spec.job import JobSpec
from storage.data_home import MigrateError, legacy_data_dir, migrate_data
from storage.settings import data_dir, database_url, user_data_dir


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TUNEDECK_HOME unset; the platform's user data folder (via XDG_DATA_HOME) and the cwd are temporary."""
    monkeypatch.delenv("TUNEDECK_HOME", raising=False)
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    cwd = tmp_path / "project"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path / "xdg" / "tunedeck"


def old_data_folder(folder: Path) -> int:
    """An earlier version's data folder: a database with one run whose log and artifact lie inside it."""
    from storage.store import Store

    store = Store(f"sqlite:///{folder / 'tunedeck.db'}")
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=5, run_name="old"))
    log = folder / "runs" / "000001" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 1\n")
    store.set_child(run_id, None, log_path=str(log))
    store.add_artifact(run_id, "adapter", str(folder / "runs" / "000001" / "adapter.zip"), 3, "abc")
    store.dispose()
    return run_id


def test_the_default_is_the_user_data_folder_wherever_the_command_is_typed(
    user_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert data_dir() == user_home.resolve() == user_data_dir()
    monkeypatch.chdir(user_home.parent.parent)  # another folder: the same data
    assert data_dir() == user_home.resolve()
    assert database_url() == f"sqlite:///{user_home.resolve() / 'tunedeck.db'}"


@pytest.mark.parametrize("blank", ["", "   "])
def test_an_empty_tunedeck_home_counts_as_unset(user_home: Path, monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    monkeypatch.setenv("TUNEDECK_HOME", blank)
    assert data_dir() == user_home.resolve()
    assert not (Path.cwd() / "runs").exists() and not (Path.cwd() / "cache").exists()


def test_tunedeck_home_names_another_folder(user_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "elsewhere"))
    assert data_dir() == (tmp_path / "elsewhere").resolve()
    assert not user_home.exists()


def test_an_old_data_folder_is_found_and_the_hint_names_both_commands(
    user_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = Path.cwd() / "data"
    old.mkdir()
    assert legacy_data_dir() is None  # a folder named data without a database is not ours
    old_data_folder(old)
    assert legacy_data_dir() == old.resolve()

    assert main(["runs", "--json"]) == 0
    err = capsys.readouterr().err
    assert f"found the data folder of an earlier version at {old.resolve()}" in err
    assert "tunedeck migrate-data" in err and f"export TUNEDECK_HOME={old.resolve()}" in err


def test_migrate_data_moves_every_run_and_file_and_rewrites_the_paths(
    user_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = Path.cwd() / "data"
    old.mkdir()
    run_id = old_data_folder(old)
    main(["runs", "--json"])  # typed before the move: creates a fresh, run-less user folder
    assert (user_home / "tunedeck.db").is_file()

    assert main(["migrate-data"]) == 0
    out = capsys.readouterr().out
    assert f"-> {user_home.resolve()}" in out and "2 stored path(s) rewritten" in out
    assert "no runs) was kept as" in out  # the fresh folder was set aside, not deleted
    assert old.is_symlink() and legacy_data_dir() is None

    from storage.store import Store

    store = Store()
    try:
        run = store.get_run(run_id)
        assert run is not None and run.name == "old"
        assert run.log_path == str(user_home.resolve() / "runs" / "000001" / "train.log")
        assert Path(run.log_path).read_text() == "step 1\n"
        assert [a.path for a in store.artifacts(run_id)] == [
            str(user_home.resolve() / "runs" / "000001" / "adapter.zip")
        ]
    finally:
        store.dispose()
    capsys.readouterr()
    main(["runs", "--json"])
    assert "earlier version" not in capsys.readouterr().err  # moved: no more hint


def test_migrate_data_never_overwrites_a_folder_with_runs(user_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = Path.cwd() / "data"
    old.mkdir()
    old_data_folder(old)
    user_home.mkdir(parents=True)
    old_data_folder(user_home)
    with pytest.raises(MigrateError, match="already holds runs"):
        migrate_data(old)
    assert main(["migrate-data"]) == 2
    assert "already holds runs" in capsys.readouterr().err
    assert (old / "tunedeck.db").is_file() and not old.is_symlink()
    with sqlite3.connect(old / "tunedeck.db") as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
