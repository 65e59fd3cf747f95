"""Issue 48: every path a restricted user (a dashboard with a login) names lies under the data folders:
images in rows and in zips, `model:` folders, hub-shaped names; the answer is the same whether the file
exists or not (`storage.data_folders`, `AccessPolicy.reading`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from jobs.checks.access import AccessPolicy
from jobs.checks.pipeline import check
from jobs.spec.job import JobSpec
from storage.data_folders import reading_only_under, under_folders
from storage.settings import uploads_dir
from tests.path_helpers import draw, image_rows, rows_text, zipped

OUTSIDE_WORDS = "outside this shared server's data folders"


@pytest.fixture
def login(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> AccessPolicy:
    monkeypatch.delenv("TUNEDECK_DATA_DIRS", raising=False)
    return AccessPolicy.for_server(login=True)


@pytest.fixture
def outside(tmp_path: Path) -> dict[str, Path]:
    """An outside folder with a picture, a file that is no picture, and a name that does not exist."""
    folder = tmp_path / "elsewhere"
    (folder / "notes.txt").parent.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("a secret, not an image")
    return {"image": draw(folder / "secret.png"), "text": folder / "notes.txt", "missing": folder / "nothing.png"}


def spell(how: str, target: Path) -> str:
    """An image reference in a row of a file in the uploads folder naming `target`."""
    if how == "file-url":
        return target.as_uri()
    if how == "relative":
        return os.path.relpath(target, uploads_dir())
    if how == "absolute":
        return str(target)
    link = uploads_dir() / "pics" / f"link-{target.name}"  # a link inside, pointing out (dangling when missing)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return f"pics/{link.name}"


def preview_of(image: str, policy: AccessPolicy) -> tuple[str, Any]:
    from app.ui.data import preview_dataset

    data = image_rows(uploads_dir() / "rows.jsonl", image)  # one name: the texts compare whole
    return preview_dataset(str(data), "sft", policy=policy)


@pytest.mark.parametrize("how", ["file-url", "relative", "absolute", "symlink"])
def test_an_image_outside_the_data_folders_reads_the_same_whether_it_exists_or_not(
    login: AccessPolicy, outside: dict[str, Path], how: str
) -> None:
    """Before: the preview showed the outside picture as a thumbnail, a non-image gave "not a readable image"
    and a missing one "does not exist"."""
    texts, problems = {}, {}
    for kind, target in outside.items():
        text, rows = preview_of(spell(how, target), login)
        assert OUTSIDE_WORDS in text and "upload the images with the data" in text, (kind, text)
        assert rows.empty and "<img" not in text, kind
        texts[kind] = text
        # The launch check says the same, before anything is opened.
        found = check(JobSpec(dataset=str(uploads_dir() / "rows.jsonl")), policy=login).problems
        problems[kind] = [(p.field, p.problem, p.fix) for p in found]
    assert texts["image"] == texts["text"] == texts["missing"]
    assert problems["image"] == problems["text"] == problems["missing"]
    assert OUTSIDE_WORDS in problems["image"][0][1]


def test_an_image_inside_the_data_folders_still_shows(login: AccessPolicy, outside: dict[str, Path]) -> None:
    draw(uploads_dir() / "pics" / "red.png")
    text, rows = preview_of("pics/red.png", login)
    assert text.startswith("Detected format") and '<img src="data:image/png' in rows.iloc[0]["images"]
    text, rows = preview_of(str(outside["image"]), AccessPolicy.for_server(login=False))  # no login: every path
    assert text.startswith("Detected format") and "<img" in rows.iloc[0]["images"]


def test_a_link_inside_pointing_inside_is_read(login: AccessPolicy) -> None:
    real = draw(uploads_dir() / "store" / "red.png")
    (uploads_dir() / "pics").mkdir(parents=True, exist_ok=True)
    (uploads_dir() / "pics" / "alias.png").symlink_to(real)
    text, _ = preview_of("pics/alias.png", login)
    assert text.startswith("Detected format"), text


def test_images_a_zip_names_outside_itself_read_the_same_whether_they_exist_or_not(
    login: AccessPolicy, outside: dict[str, Path]
) -> None:
    from app.ui.data import preview_dataset

    picture = draw(uploads_dir().parent / "scratch" / "red.png").read_bytes()
    texts = {}
    for kind, target in outside.items():
        for name, image in (("abs", str(target)), ("up", "../../../../../../../../.." + str(target))):
            archive = zipped(uploads_dir() / f"{kind}-{name}.zip", rows_text(image), {"data/pics/red.png": picture})
            text, rows = preview_dataset(str(archive), "sft", policy=login)
            assert OUTSIDE_WORDS in text and rows.empty, text
            texts[(kind, name)] = text.replace(archive.name, "ZIP")
    assert len(set(texts.values())) == 1  # existing, non-image and missing read alike, however spelled
    good = zipped(uploads_dir() / "good.zip", rows_text("pics/red.png"), {"data/pics/red.png": picture})
    text, rows = preview_dataset(str(good), "sft", policy=login)
    assert text.startswith("Detected format") and "<img" in rows.iloc[0]["images"], text


def test_a_model_folder_outside_reads_the_same_whether_it_exists_or_not(
    login: AccessPolicy, outside: dict[str, Path], tmp_path: Path
) -> None:
    """Before: `model:` with an outside folder said "not a model folder: no config.json" when it existed and
    "does not exist" when it did not."""
    from app.ui.data import preview_with_lengths

    existing = tmp_path / "models" / "private"
    existing.mkdir(parents=True)
    (existing / "config.json").write_text(json.dumps({"model_type": "llava"}))
    draw(uploads_dir() / "pics" / "red.png")
    data = str(image_rows(uploads_dir() / "rows.jsonl", "pics/red.png"))
    seen = {}
    for kind, ref in (("folder", existing), ("file", outside["text"]), ("missing", tmp_path / "models" / "gone")):
        for spelled in (
            str(ref),
            os.path.relpath(ref, Path.cwd()),
            f"{uploads_dir()}/../../../{ref.relative_to(tmp_path)}",
        ):
            problems = check(JobSpec(model=spelled, dataset=data), policy=login).problems
            assert [p.field for p in problems] == ["model"], problems
            seen[(kind, spelled)] = problems[0].problem.replace(spelled, "REF") + problems[0].fix
            text, _ = preview_with_lengths(data, "sft", spelled, 512, policy=login)
            assert "vision-language" not in text and OUTSIDE_WORDS in text
    assert len(set(seen.values())) == 1 and OUTSIDE_WORDS in next(iter(seen.values()))
    inside = uploads_dir() / "models" / "mine"
    assert login.model_problem(str(inside)) is None and login.model_problem("org/name") is None
    assert login.model_problem("tiny-llama") is None
    assert AccessPolicy.for_server(login=False).model_problem(str(existing)) is None


def test_a_hub_shaped_name_is_never_read_as_a_folder_outside(
    login: AccessPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`org/name` that happens to be a folder under the server's working directory: read as a hub id for a
    restricted user, so an existing folder and a missing one give the same answer."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "etc" / "found").mkdir(parents=True)
    (tmp_path / "etc" / "found" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    answers = {
        name: [
            (p.field, p.problem.replace(name, "REF"), p.fix.replace(name, "REF"))
            for p in check(JobSpec(model=name), policy=login).problems
        ]
        for name in ("etc/found", "etc/gone")
    }
    assert answers["etc/found"] == answers["etc/gone"], answers
    assert not any("safetensors" in p for _, p, _ in answers["etc/found"])


def test_under_folders_resolves_dots_and_links_without_asking_if_the_file_exists(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)
    assert under_folders(root / "a" / "missing.png", [root])
    assert not under_folders(root / "a" / ".." / ".." / "x.png", [root])
    assert not under_folders(root / "out" / "x.png", [root])
    with reading_only_under([root]):
        from storage.data_folders import readable

        assert readable(root / "a" / "b.png") and not readable(tmp_path / "b.png")
    assert readable(tmp_path / "b.png")


def test_a_hub_shaped_data_name_reads_the_same_whether_a_file_of_that_name_exists_or_not(
    login: AccessPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `team/notes` that was a file under the server's working directory was refused as outside the
    data folders, and a missing one was looked up on the hub."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "notes").write_text("a secret")
    answers = {
        name: [(p.field, p.problem.replace(name, "REF"), p.fix.replace(name, "REF")) for p in found]
        for name in ("team/notes", "team/gone")
        for found in [check(JobSpec(dataset=name), policy=login).problems]
    }
    assert answers["team/notes"] == answers["team/gone"], answers


def test_the_form_memory_panel_never_reads_a_model_folder_outside(login: AccessPolicy, tmp_path: Path) -> None:
    """The launch form's memory panel predicts from the model's config.json: for a restricted user an outside
    folder gives the same panel whether it exists or not (unguarded, the two differ)."""
    from app.ui import form as ui_form
    from app.ui import memory as ui_memory
    from app.ui.data import policed_specs

    existing = tmp_path / "models" / "private"
    existing.mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    config |= {"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512}
    (existing / "config.json").write_text(json.dumps(config))
    missing = tmp_path / "models" / "gone"

    def panel(read: Any, ref: Path) -> str:
        return ui_memory.memory_views(read, ui_form.NAMES, *ui_form.form_values(JobSpec(model=str(ref))))[0]

    open_panels = {ref: panel(ui_form.spec_from_form, ref) for ref in (existing, missing)}
    assert open_panels[existing] != open_panels[missing]  # what an open dashboard shows: the file is read
    guarded = policed_specs(ui_form.spec_from_form, login)
    assert panel(guarded, existing) == panel(guarded, missing)
