"""The token view and the data audit on the dashboard's API (issue 43): `/tokens` and `/audit`, called through
`app.api.Endpoints` as the server calls them (the live server with its login: tests/test_api.py). They show what
`tunedeck data show` and `tunedeck data audit` show, and read no file the server keeps from its users."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pytest

from app.api import Endpoints
from jobs.checks.access import AccessPolicy

ROWS = [
    {"prompt": "What is the capital of France?", "completion": " Paris is the capital."},
    {"prompt": "Name a colour.", "completion": " Blue, like the sky on a clear summer day over the sea."},
    {"prompt": "Two plus two?", "completion": " Four."},
    {"prompt": "What is the capital of France?", "completion": " Paris is the capital."},  # row 1 again
]


def spec_yaml(model: Path, data: Path, max_length: int = 24) -> str:
    return f"model: {model}\ndataset: {data}\nmax_length: {max_length}\nmax_steps: 1\n"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_tokens_of_a_row_by_number_as_the_cli_shows_them(store, tiny_model: Path, data: Path) -> None:
    from app.cli.usage import load_spec
    from jobs.data.loading import load_data
    from jobs.data.tokens.viewed_rows import training_views
    from jobs.models.tokenizer import local_tokenizer

    api = Endpoints(store)
    out = api.tokens(spec_yaml(model=tiny_model, data=data), row=2)
    assert out["total"] == 4 and out["max_length"] == 24 and [r["row"] for r in out["rows"]] == [2]
    (row,) = out["rows"]
    tokens = row["sequences"][0]["tokens"]
    assert row["cut"] > 0 and sum(t["cut"] for t in tokens) == row["cut"]  # the long answer is cut at 24
    assert row["kept"] == 24 and row["trained"] == sum(t["trained"] for t in tokens) > 0
    assert not any(t["trained"] for t in tokens if "colour" in t["text"])  # the prompt is masked

    spec_file = data.parent / "spec.yaml"
    spec_file.write_text(spec_yaml(tiny_model, data))
    spec = load_spec(str(spec_file), [])
    (view,) = training_views(spec, load_data(spec), local_tokenizer(str(tiny_model)), numbers=[2]).views
    assert [(t.id, t.trained, t.cut) for t in view.sequences[0].tokens] == [
        (t["id"], t["trained"], t["cut"]) for t in tokens
    ]
    first = api.tokens(spec_yaml(tiny_model, data), row=0)  # 0: the first rows
    assert [r["row"] for r in first["rows"]] == [1, 2, 3]


def test_audit_names_the_rows_and_the_fix(store, tiny_model: Path, data: Path) -> None:
    out = Endpoints(store).audit(spec_yaml(tiny_model, data))
    assert out["train_rows"] == 4
    (dup,) = [f for f in out["findings"] if f["code"] == "duplicate-rows"]
    assert dup["rows"] == [{"field": "dataset", "source": str(data), "row": 4}] and "dedupe: true" in dup["fix"]
    histogram = out["histogram"]
    assert histogram["unit"] == "characters" and sum(b["rows"] for b in histogram["bins"]) == 4


def test_bad_input_names_the_parameter_and_the_fix(store, tiny_model: Path, data: Path) -> None:
    api = Endpoints(store)
    with pytest.raises(gr.Error, match=r"row: row 9 of .* is not among the 4 training rows"):
        api.tokens(spec_yaml(tiny_model, data), row=9)
    with pytest.raises(gr.Error, match=r"row: `-1` is not a row number"):
        api.tokens(spec_yaml(tiny_model, data), row=-1)
    with pytest.raises(gr.Error, match=r"learning_rat"):
        api.audit(spec_yaml(tiny_model, data) + "learning_rat: 1\n")
    with pytest.raises(gr.Error, match=r"model: the tokenizer of .*no-such-model is not on this server"):
        api.tokens(spec_yaml(data.parent / "no-such-model", data))


def test_a_shared_server_reads_none_of_the_files_it_keeps_from_users(store, tiny_model: Path, data: Path) -> None:
    """Behind a login, a data file or model folder outside the data folders is refused before it is read: the
    answer names the field, never a row of the file."""
    api = Endpoints(store, AccessPolicy(restricted=True, data_dirs=(data.parent / "shared",)))
    for call in (
        lambda: api.tokens(spec_yaml(tiny_model, data), row=1),
        lambda: api.audit(spec_yaml(tiny_model, data)),
    ):
        with pytest.raises(gr.Error) as refused:
            call()
        assert "dataset: this shared server reads data files only from its data folders" in str(refused.value)
        assert "model: " in str(refused.value) and "Paris" not in str(refused.value)


def test_the_form_panels_show_the_same_tokens_and_findings(tiny_model: Path, data: Path) -> None:
    """The launch form's panels (app.ui.data_panels) render the API's records: one span per token, classed by
    trained/masked/special/cut, the ✂ before the cut; findings with their rows and fixes; problems by field."""
    from app.ui.data_panels import audit_html, token_spans, tokens_html
    from app.ui.form_spec import form_values
    from jobs.checks.shown_data import tokens_record
    from jobs.spec.job import JobSpec

    spec = JobSpec(model=str(tiny_model), dataset=str(data), max_length=24)
    shown = tokens_html(2, *form_values(spec))
    assert "row 2 of" in shown and "row 1 of" not in shown and shown.count('class="tok-cut-mark"') == 1
    record = tokens_record(spec, [2])
    assert shown.count('class="tok-trained') == record["rows"][0]["trained"]
    assert shown.count('class="tok-cut') == record["rows"][0]["cut"] + 1  # the cut tokens and the ✂ mark
    audit = audit_html(*form_values(spec))
    assert "<b>duplicate-rows</b>" in audit and "(rows 4)" in audit and "dedupe: true" in audit
    assert "audit-bar" in audit
    refused = tokens_html(0, *form_values(spec), policy=AccessPolicy(restricted=True, data_dirs=()))
    assert "<b>dataset</b>" in refused and "tok-" not in refused
    assert "<b>row</b>" in tokens_html(-3, *form_values(spec))
    image = [{"id": 9, "text": "<image>", "special": True, "trained": False, "cut": False}] * 64
    assert token_spans(image).count("<span") == 1 and "[image × 64]" in token_spans(image)
