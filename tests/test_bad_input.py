"""Bad input end to end: a clear problem (field, problem, fix), nothing queued, nothing stored
changed, never a traceback, never a crashed worker.

Property-based (hypothesis): random spec dicts through JobSpec.from_dict, jobs.checks.pipeline.check and
`tunedeck submit`; random bytes / JSON lines / CSV through jobs.data.inspection.check_dataset. Then the
named cases from the issue, each through `jobs.queue.submit.submit` with the runs counted before and
after. Unit-level data/model checks live in test_data.py and test_models.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_settings import examples

from jobs.errors import Problem, ProblemError
from jobs.spec.enums import Trainer
from jobs.spec.field_info import field_infos
from jobs.spec.job import JobSpec, SpecError
from storage.models import RunStatus

KNOWN = [f.name for f in field_infos()]
SETTINGS = settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        ["lora", "qlora", "sft", "dpo", "bf16", "fp16", "1e-4", "-1", "", "  ", "sample:chat-format", "tiny-llama"]
    ),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=5), scalars, max_size=2))
keys = st.one_of(st.sampled_from(KNOWN), st.text(max_size=12), st.sampled_from(["lora_rank", "lr", "epochs"]))
spec_dicts = st.dictionaries(keys, values, max_size=8)


def _problems_ok(problems: list[Problem]) -> None:
    assert problems
    for p in problems:
        assert isinstance(p, Problem) and isinstance(p.field, str) and p.problem and p.fix  # field: the key as given


@SETTINGS
@given(spec_dicts)
def test_random_spec_dicts_only_raise_spec_error(data: dict) -> None:
    try:
        spec = JobSpec.from_dict(data)
    except SpecError as exc:
        _problems_ok(exc.problems)
    else:
        assert JobSpec.from_json(spec.to_json()) == spec


@SETTINGS
@given(st.one_of(values, st.lists(values, max_size=3), st.text(max_size=30)))
def test_non_mapping_specs(data: object) -> None:
    with pytest.raises(SpecError) as exc:
        JobSpec.from_dict(data) if not isinstance(data, dict) else JobSpec.from_dict({"model": data, "lr": 1})
    _problems_ok(exc.value.problems)


valid_ish = st.fixed_dictionaries(
    {
        "model": st.sampled_from(
            ["tiny-llama", "nobody/no-such-model-xyz", "/no/such/folder", "./rel", "weird name!!"]
        ),
        "dataset": st.sampled_from(
            [
                "sample:chat-format",
                "sample:preference-format",
                "sample:nope",
                "/no/file.jsonl",
                "org/ds-not-cached",
                "",
                "data.txt",
            ]
        ),
        "trainer": st.sampled_from(["sft", "dpo"]),
    },
    optional={
        k: values
        for k in (
            "method",
            "precision",
            "max_length",
            "learning_rate",
            "lora_r",
            "packing",
            "per_device_train_batch_size",
            "optim",
            "eval_dataset",
            "max_steps",
        )
    },
)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(valid_ish)
def test_submit_check_never_raises(data: dict) -> None:
    from jobs.checks.pipeline import check

    try:
        spec = JobSpec.from_dict(data)
    except SpecError as exc:
        _problems_ok(exc.problems)
        return
    problems = check(spec).problems  # model, data and device checks: problems, never an exception
    for p in problems:
        assert isinstance(p, Problem) and isinstance(p.field, str) and p.problem and p.fix  # field: the key as given


@pytest.fixture
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    return home


def test_cli_submit_random_yaml(cli_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`tunedeck submit` on random YAML: exit 0 (queued) or 2 with problems; a run only when 0."""
    from app.cli.main import main
    from storage.store import Store

    counts = {"ok": 0, "bad": 0}

    @settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(spec_dicts.map(lambda d: yaml.safe_dump(d, allow_unicode=True)), st.text(max_size=60)))
    def run(text: str) -> None:
        path = tmp_path / "spec.yaml"
        path.write_text(text, encoding="utf-8")
        store = Store()
        before = store.count_runs()
        store.dispose()
        code = main(["submit", str(path)])
        err = capsys.readouterr().err
        assert "Traceback" not in err
        store = Store()
        after = store.count_runs()
        store.dispose()
        assert code in (0, 2), err
        assert after == before + (1 if code == 0 else 0)
        if code == 2:
            assert "problem(s)" in err and "Fix:" in err
        counts["ok" if code == 0 else "bad"] += 1

    run()
    assert counts["bad"] > 0


# ---------------------------------------------------------------------- random dataset files
def _check_file(tmp_path: Path, name: str, content: bytes, trainer: Trainer) -> None:
    from jobs.data.inspection import DatasetInfo, check_dataset
    from jobs.data.sources import DataError

    path = tmp_path / name
    path.write_bytes(content)
    try:
        info = check_dataset(str(path), trainer)
    except DataError as exc:
        _problems_ok(exc.problems)
        assert all(p.field == "dataset" for p in exc.problems)
    else:
        assert isinstance(info, DatasetInfo) and info.n_rows > 0


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["messages", "role", "content", "text", "prompt", "completion", "chosen", "rejected", "x"]),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=8,
)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.binary(max_size=200), st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]), st.sampled_from(list(Trainer))
)
def test_random_bytes_only_data_error(tmp_path: Path, content: bytes, suffix: str, trainer: Trainer) -> None:
    _check_file(tmp_path, "random" + suffix, content, trainer)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.one_of(json_values.map(json.dumps), st.text(max_size=20)), min_size=0, max_size=6),
    st.sampled_from(list(Trainer)),
)
def test_random_json_lines_only_data_error(tmp_path: Path, lines: list[str], trainer: Trainer) -> None:
    _check_file(tmp_path, "random.jsonl", "\n".join(lines).encode("utf-8"), trainer)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8), min_size=1, max_size=4),
        min_size=0,
        max_size=5,
    ),
    st.sampled_from(list(Trainer)),
)
def test_random_csv_only_data_error(tmp_path: Path, rows: list[list[str]], trainer: Trainer) -> None:
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    _check_file(tmp_path, "random.csv", buf.getvalue().encode("utf-8"), trainer)


# ---------------------------------------------------------------------- the worker and odd stored specs
ODD_SPECS = [
    "not json at all {",
    json.dumps([1, 2, 3]),
    json.dumps({"model": "tiny-llama", "lora_rank": 8}),  # a key from another version
    json.dumps({"model": "tiny-llama", "method": "prefix-tuning-v9"}),  # an enum value this version lacks
    json.dumps({"model": "tiny-llama", "learning_rate": "fast"}),
    json.dumps({"model": "tiny-llama", "max_length": -5}),
]


def test_worker_fails_odd_stored_specs_and_goes_on(store) -> None:
    from jobs.worker.loop import Worker

    odd = [store.create_run_unchecked(text, name=f"odd {i}") for i, text in enumerate(ODD_SPECS)]
    older = store.create_run_unchecked(json.dumps({"model": "tiny-llama", "max_steps": 1}), name="older, keys missing")
    good = store.create_run(JobSpec(model="tiny-llama", max_steps=1))
    ran: list[int] = []

    def child(run_id: int) -> list[str]:
        ran.append(run_id)
        return [sys.executable, "-c", "pass"]

    done = Worker(store, child_argv=child, sample=False, poll_interval=0.1).work(burst=True)
    assert ran == [older, good] and done == 2
    for run_id in odd:
        run = store.get_run(run_id)
        assert run.status is RunStatus.FAILED
        assert "stored job spec" in (run.error_summary or "")
    # The dashboard and CLI still list and show them.
    assert {r.id for r in store.list_runs()} >= set(odd)
    from app.cli.show import show_text

    assert "odd 2" in show_text(store, store.get_run(odd[2]))


@pytest.mark.parametrize(
    ("stored", "field"),
    [
        ({"model": "tiny-llama", "max_steps": 1, "lora_rank": 8}, "lora_rank"),  # unknown here: lora_r
        ({"model": "tiny-llama", "max_steps": 1, "learning_rate": "fast"}, "learning_rate"),  # a bad value
    ],
)
def test_training_child_fails_a_stored_spec_it_cannot_read_naming_the_field(store, stored: dict, field: str) -> None:
    """The child parses strictly: the lenient display reader would drop `field` and train defaults instead."""
    from app.cli.show import show_text
    from jobs.spec.stored import spec_of
    from jobs.train.child import run

    run_id = store.create_run_unchecked(json.dumps(stored), name="edited by hand")
    assert spec_of(store.get_run(run_id)).model == "tiny-llama"  # the display reader copes with it
    assert run(run_id, store) == 1
    failed = store.get_run(run_id)
    assert failed.status is RunStatus.FAILED and failed.exit_code == 1
    assert failed.error_summary.startswith("the stored job spec is not valid")
    assert f"{field}:" in failed.error_summary
    assert not failed.resolved_config and not (store.run_dir(run_id) / "output").exists()  # nothing was trained
    assert f"{field}:" in show_text(store, failed)  # what `tunedeck show` prints


# ---------------------------------------------------------------------- named cases, end to end
def _refused(store, raw: dict, field: str, words: str, *, at: str = "submit") -> None:
    """`raw` is refused with a problem on `field` whose text mentions `words`; nothing is stored.

    `at` names where the refusal must come from: "parse" (`JobSpec.from_dict` cannot build the
    spec) or "submit" (the spec parses and `submit()` itself refuses it), so each case exercises
    the stage it is about.
    """
    from jobs.queue.submit import submit

    assert words, "name the words the problem must contain"
    before = store.count_runs()
    if at == "parse":
        with pytest.raises(SpecError) as exc:
            JobSpec.from_dict(raw)
    else:
        spec = JobSpec.from_dict(raw)  # must parse: the refusal under test is submit's
        with pytest.raises(ProblemError) as exc:
            submit(store, spec)
    _problems_ok(exc.value.problems)
    hits = [p for p in exc.value.problems if p.field == field and words.lower() in f"{p.problem} {p.fix}".lower()]
    assert hits, exc.value.problems
    assert store.count_runs() == before
    assert store.queued() == []


def _jsonl(path: Path, rows: list) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def test_spec_values(store) -> None:
    _refused(store, {"model": "tiny-llama", "learning_rate": -1}, "learning_rate", "out of range", at="parse")
    _refused(store, {"model": "tiny-llama", "lora_r": "eight"}, "lora_r", "whole number", at="parse")
    _refused(store, {"model": "tiny-llama", "lr": 1e-4}, "lr", "unknown field", at="parse")
    _refused(
        store,
        {
            "model": "tiny-llama",
            "method": "qlora",
            "precision": "fp32",
            "optim": "adamw_torch",
            "trainer": "dpo",
            "dataset": "sample:chat-format",
        },
        "dataset",
        "needs prompt/chosen/rejected",
    )


def test_datasets(store, tmp_path: Path, tiny_model: Path) -> None:
    base = {"model": str(tiny_model)}
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _refused(store, {**base, "dataset": str(empty)}, "dataset", "empty")
    _refused(
        store, {**base, "dataset": _jsonl(tmp_path / "broken.jsonl", [CHAT, '{"messages": [', CHAT])}, "dataset", "2"
    )
    _refused(
        store,
        {**base, "dataset": _jsonl(tmp_path / "cols.jsonl", [{"question": "a", "answer": "b"}])},
        "dataset",
        "column",
    )
    _refused(
        store,
        {**base, "dataset": _jsonl(tmp_path / "mixed.jsonl", [CHAT, {"text": "plain"}])},
        "dataset",
        "mixed formats",
    )
    _refused(
        store,
        {**base, "trainer": "dpo", "dataset": _jsonl(tmp_path / "sft.jsonl", [CHAT])},
        "dataset",
        "needs prompt/chosen/rejected",
    )
    _refused(store, {**base, "eval_dataset": str(tmp_path / "missing.jsonl")}, "eval_dataset", "does not exist")


def test_chat_data_needs_a_chat_template(store, tmp_path: Path, tiny_model: Path) -> None:
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    (folder / "chat_template.json").unlink(missing_ok=True)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    _refused(store, {"model": str(folder), "dataset": "sample:chat-format"}, "model", "chat template")
    # The same model with text data is fine, and the original model with chat data too.
    from jobs.checks.pipeline import check

    text = _jsonl(tmp_path / "text.jsonl", [{"text": "hello world"}] * 3)
    assert [p for p in check(JobSpec(model=str(folder), dataset=text)).problems if "chat template" in p.problem] == []
    assert [p for p in check(JobSpec(model=str(tiny_model))).problems if "chat template" in p.problem] == []


def test_models(store, tmp_path: Path, tiny_model: Path) -> None:
    import time

    start = time.monotonic()
    _refused(store, {"model": "nobody/does-not-exist-tunedeck"}, "model", "not in the local hugging face cache")
    assert time.monotonic() - start < 10  # offline: no long hang
    not_model = tmp_path / "not-a-model"
    not_model.mkdir()
    (not_model / "notes.txt").write_text("hi")
    _refused(store, {"model": str(not_model)}, "model", "config.json")
    custom = tmp_path / "custom-code"
    shutil.copytree(tiny_model, custom)
    cfg = json.loads((custom / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomModel"}
    (custom / "config.json").write_text(json.dumps(cfg))
    _refused(store, {"model": str(custom)}, "trust_remote_code", "ships its own python code")
    from jobs.checks.pipeline import check

    spec = JobSpec(model=str(custom), trust_remote_code=True)
    assert not [p for p in check(spec).problems if p.field == "trust_remote_code"]


def test_long_rows_warn_with_counts(tiny_model: Path, tmp_path: Path) -> None:
    """Rows over max_length: a warning with counts (shown in the data preview), not a refusal."""
    from app.ui.data import length_warning_text

    ds = _jsonl(tmp_path / "long.jsonl", [{"text": "word " * 400}] * 3 + [{"text": "short"}])
    text = length_warning_text(ds, "sft", str(tiny_model), 32)
    assert "3 of 4 rows" in text and "max_length 32" in text
    assert length_warning_text(ds, "sft", str(tiny_model), 100_000) == ""


def test_data_preview_shows_the_long_row_warning(tiny_model: Path, tmp_path: Path) -> None:
    """The form's data preview (what the launch page shows) carries the truncation count."""
    from app.ui.data import preview_with_lengths

    ds = _jsonl(tmp_path / "long.jsonl", [{"text": "word " * 400}] * 3 + [{"text": "short"}])
    text, rows = preview_with_lengths(ds, "sft", str(tiny_model), 32)
    assert text.startswith("Detected format: **text**") and "3 of 4 rows" in text
    assert len(rows) == 4
