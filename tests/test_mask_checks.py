"""The masks step of the checks (jobs.checks.masks): answers that never teach the stop token, and rows with no
token in the loss, named by row with their fix before queueing; the default examples give no such finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from jobs.checks.pipeline import check
from jobs.spec.job import JobSpec

GENERATION = "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
STOP_OUTSIDE = "{% generation %}{{- message['content'] }}{% endgeneration %}{{- '<|im_end|>' }}"
# Marks nothing of an assistant turn whose content is "skip" (a template that hides some turns from the mask).
SKIPS = (
    "{% if message['content'] != 'skip' %}"
    + GENERATION
    + "{% else %}{{- message['content'] + '<|im_end|>' }}{% endif %}"
)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))  # a fresh findings cache per test
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)


def model_with_template(tiny_model: Path, tmp_path: Path, assistant_part: str) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    template = folder / "chat_template.jinja"
    text = template.read_text()
    assert GENERATION in text
    template.write_text(text.replace(GENERATION, assistant_part))
    return folder


def chats(tmp_path: Path, answers: list[str]) -> str:
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": a}]}
            for i, a in enumerate(answers)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def findings(checked: Any) -> list[str]:
    return [str(p) for p in checked.problems] + [w for w in checked.warnings if "rows" in w or "row " in w]


def test_answers_without_the_stop_token_are_named(tiny_model: Path, tmp_path: Path) -> None:
    model = model_with_template(tiny_model, tmp_path, STOP_OUTSIDE)
    data = chats(tmp_path, ["Yes.", "No.", "Maybe."])
    checked = check(JobSpec(model=str(model), dataset=data, max_length=64, assistant_only_loss=True))
    assert not checked.problems
    (warning,) = [w for w in checked.warnings if "generation stops at" in w]
    assert "rows 1, 2, 3 of" in warning and "'<|im_end|>'" in warning and "rambles on" in warning
    assert "outside the chat template's `{% generation %}` block" in warning  # the fix
    plain = check(JobSpec(model=str(tiny_model), dataset=data, max_length=64, assistant_only_loss=True))
    assert not [w for w in plain.warnings if "generation stops at" in w]  # the model's own template: no finding


@pytest.mark.parametrize(
    ("answers", "rows"), [(["skip", "skip"], "rows 1, 2 of"), (["Fine.", "skip", "Good."], "row 2 of")]
)
def test_rows_with_nothing_trained_are_refused(tiny_model: Path, tmp_path: Path, answers, rows) -> None:
    model = model_with_template(tiny_model, tmp_path, SKIPS)
    data = chats(tmp_path, answers)
    checked = check(JobSpec(model=str(model), dataset=data, max_length=64, assistant_only_loss=True))
    (problem,) = [p for p in checked.problems if p.field == "assistant_only_loss"]
    assert rows in problem.problem and "trains on nothing" in problem.problem
    assert "`{% generation %}`" in problem.fix
    again = check(JobSpec(model=str(model), dataset=data, max_length=64, assistant_only_loss=True))
    assert [str(p) for p in again.problems] == [str(p) for p in checked.problems]  # read back from the cache


def test_the_quick_example_has_no_mask_finding(tiny_model: Path) -> None:
    from app.cli.usage import load_spec

    spec = load_spec(str(Path(__file__).resolve().parent.parent / "examples" / "tiny-llama-quick.yaml"))
    spec = JobSpec.from_dict({**spec.to_dict(), "model": str(tiny_model)})
    assert findings(check(spec)) == []


def test_the_default_example_has_no_mask_finding(smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli.usage import load_spec
    from jobs.checks.masks import mask_findings
    from jobs.models.embedded import ensure_smollm2
    from jobs.models.tokenizer import LocalTokenizer

    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    ensure_smollm2()
    spec = load_spec(str(Path(__file__).resolve().parent.parent / "examples" / "smollm2-tag-format.yaml"))
    tokenizer = LocalTokenizer(spec.model)
    assert tokenizer() is not None  # the step really ran on the tokens
    assert mask_findings(spec, tokenizer) == ([], [])
    checked = check(spec)
    assert checked.problems == []
    assert not [w for w in checked.warnings if "generation stops at" in w or "no token in the loss" in w]
