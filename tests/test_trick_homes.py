"""Each memory trick has one home: its module in `jobs/spec/tricks/`, listed in the registry (issue 42 item 2).

A trick's field names appear in app/, jobs/ and storage/ only in its home and in the readers allowed below:
the spec's declaration of the field (`jobs/spec/sections/`), the importers of other tools' configs (which
name the other tool's key of the same name) and the few places named with their reason. Everything else
asks the home or the registry (`jobs.spec.tricks.registry`). A new reader fails here: ask the trick's module
instead, or add the reader with its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.spec.tricks import registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "jobs", "storage")
HOMES = ROOT / "jobs" / "spec" / "tricks"
IMPORTERS = {f"jobs/spec/imports/{tool}.py" for tool in ("trl", "axolotl", "llamafactory")}
SPEC = {"jobs/spec/sections/memory.py"}  # where the fields are declared
# field -> its home, and the other files allowed to name it (with why).
ALLOWED: dict[str, tuple[str, set[str]]] = {
    "gradient_checkpointing": (
        "checkpointing.py",
        SPEC
        | IMPORTERS
        | {
            "jobs/spec/job.py",  # the spec's own check: prefix tuning refuses it when the spec is parsed
            "jobs/spec/tricks/offloading.py",  # the CPU's alternative, in its refusal (an import would lengthen chains)
        },
    ),
    "use_liger_kernel": ("liger.py", SPEC | {"jobs/spec/imports/trl.py"}),  # trl's key of the same name
    "torch_compile": ("compile.py", SPEC),
    # Not yet moved behind their homes (the CPU allocator's environment, the predictor's architecture-dependent
    # part): a ratchet, so no new reader appears.
    "activation_offloading": (
        "offloading.py",
        SPEC | {"jobs/spec/enums.py", "jobs/memory/trick_effects.py"},
    ),
    "cpu_return_freed_memory": (
        "cpu_allocator.py",
        SPEC | {"jobs/memory/trick_effects.py", "jobs/worker/processes.py"},
    ),
    "neftune_noise_alpha": ("neftune.py", {"jobs/spec/sections/training.py"} | IMPORTERS),
    "loraplus_lr_ratio": (
        "loraplus.py",
        {"jobs/spec/sections/method.py", "jobs/spec/imports/llamafactory.py", "jobs/train/loraplus.py"},
    ),
}


def files_naming(name: str) -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if name in path.read_text()
    }


@pytest.mark.parametrize("field", sorted(ALLOWED))
def test_a_tricks_field_is_named_only_in_its_home_and_its_allowed_readers(field: str) -> None:
    home, readers = ALLOWED[field]
    assert (HOMES / home).is_file(), home
    outside = files_naming(field) - readers - {f"jobs/spec/tricks/{home}"}
    assert not outside, f"{field} is named in {sorted(outside)}: ask jobs/spec/tricks/{home} (or the registry) instead"


def test_the_issue_bounds_hold() -> None:
    """Issue 42's "Done when": checkpointing in at most 8 files, Liger in at most 3, at most one tricks.py."""
    assert len(files_naming("gradient_checkpointing")) <= 8, sorted(files_naming("gradient_checkpointing"))
    assert len(files_naming("use_liger_kernel")) <= 3, sorted(files_naming("use_liger_kernel"))
    named_tricks = [p for package in PACKAGES for p in (ROOT / package).rglob("tricks.py")]
    assert len(named_tricks) <= 1, named_tricks


def test_every_trick_module_is_in_the_registry_once() -> None:
    """A trick module that the registry does not list is a trick nobody reads; one listed twice counts twice."""
    import importlib

    modules = sorted(p.stem for p in HOMES.glob("*.py") if p.stem not in ("__init__", "record", "registry"))
    records = [importlib.import_module(f"jobs.spec.tricks.{m}").TRICK for m in modules]
    assert sorted(id(r) for r in records) == sorted(id(r) for r in registry.TRICKS)
    assert all(r.summary and r.fields for r in registry.TRICKS)


def test_every_tricks_field_is_a_spec_field() -> None:
    from jobs.spec.field_info import field_infos

    names = {f.name for f in field_infos()}
    assert {f for t in registry.TRICKS for f in t.fields} <= names
    assert {s.field for s in registry.SPEEDS} <= names


def test_the_docs_table_of_tricks_is_the_registrys() -> None:
    """docs/memory.md's table of tricks is rendered from each trick's record (`registry.docs_table`): a trick added
    to the registry, or a figure changed in its module, fails here until the page shows it."""
    page = (ROOT / "docs" / "memory.md").read_text().splitlines()
    start = page.index("| trick | field | memory | speed | source |")
    end = next(i for i in range(start, len(page)) if not page[i].startswith("|"))
    shown = "\n".join(page[start:end])
    assert shown == registry.docs_table(), "paste registry.docs_table() over the table in docs/memory.md"
    covered = {t.name for t in registry.TRICKS if t.docs}
    assert covered == {t.name for t in registry.TRICKS} - {"adapters"}  # the adapters have their own page
