"""Before/after samples: the base model's and the result's greedy answers to a few held-out prompts,
taken by every run (jobs.train.before_after), kept across a resume, put in the bundle and on the run page."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import datasets
import pytest
from training_helpers import tiny_spec

from jobs.spec.job import JobSpec
from jobs.train import before_after
from jobs.train.before_after import BUILT_IN_PROMPTS, Prompt, pick_prompts, record_before, status_line
from jobs.train.callbacks import STOP_REQUESTED
from storage.models import RunStatus


@pytest.fixture(autouse=True)
def _clear_stop_flag():
    STOP_REQUESTED.clear()
    yield
    STOP_REQUESTED.clear()


FIXED = "Over and out."


@pytest.fixture
def fixed_answer_data(tmp_path: Path) -> tuple[Path, Path]:
    """Chat rows that all answer the same words (train), and held-out questions (eval)."""

    def write(name: str, topics: list[str]) -> Path:
        path = tmp_path / name
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": f"Tell me about {t}."},
                            {"role": "assistant", "content": FIXED},
                        ]
                    }
                )
                + "\n"
                for t in topics
            )
        )
        return path

    return (
        write("train.jsonl", [f"thing {i}" for i in range(32)]),
        write("eval.jsonl", ["volcanoes", "the moon", "rivers", "volcanoes"]),
    )


def _samples_artifact(store: Any, run_id: int) -> dict[str, Any]:
    found = [a for a in store.artifacts(run_id) if a.kind == "samples"]
    assert len(found) == 1, store.artifacts(run_id)
    return json.loads(Path(found[0].path).read_text())


@pytest.mark.integration
def test_a_run_answers_held_out_prompts_before_and_after(
    store: Any, tiny_model: Path, fixed_answer_data: tuple[Path, Path]
) -> None:
    from app.ui.run import RunPageData
    from jobs.train.child import run

    train, eval_ = fixed_answer_data
    spec = tiny_spec(
        tiny_model, dataset=str(train), eval_dataset=str(eval_), max_steps=16, sample_count=3, sample_new_tokens=6
    )
    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED, record.error_summary
    data = _samples_artifact(store, run_id)
    # the held-out rows' questions, each once, in file order; never a training row
    assert [p["text"] for p in data["prompts"]] == [
        "Tell me about volcanoes.",
        "Tell me about the moon.",
        "Tell me about rivers.",
    ]
    assert data["source"] == "the first prompts of the held-out (eval) rows"
    assert len(data["before"]) == len(data["after"]) == 3 and data["errors"] == []
    assert data["before"] != data["after"]  # it learned the fixed answer; the base did not know it
    assert data["max_new_tokens"] == 6 and data["decoding"] == "greedy"
    bundle = next(Path(a.path) for a in store.artifacts(run_id) if a.kind == "bundle")
    with zipfile.ZipFile(bundle) as zf:
        assert json.loads(zf.read("samples.json")) == data
        card = zf.read("README.md").decode()
    assert "## Before / after" in card and "| prompt | base | fine-tuned |" in card
    page = RunPageData(store).refresh(run_id, None)
    section = next(v for v in page if isinstance(v, str) and v.startswith("### Before / after"))
    assert "| prompt | base | this run |" in section and "Tell me about volcanoes." in section
    assert "no before/after samples" not in section.lower()


@pytest.mark.integration
def test_a_resumed_run_keeps_its_first_before_answers(store: Any, tiny_model: Path) -> None:
    from test_faults import AtStep

    from jobs.queue.run_actions import resume
    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=6, sample_count=2, sample_new_tokens=4))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store, callbacks=[AtStep(2, lambda *a: STOP_REQUESTED.set())]) == 0
    STOP_REQUESTED.clear()
    assert store.get_run(run_id).status is RunStatus.CANCELLED
    path = store.run_dir(run_id) / "samples.json"
    first = json.loads(path.read_text())
    assert len(first["before"]) == 2 and first["after"] is None
    assert not [a for a in store.artifacts(run_id) if a.kind == "samples"]  # recorded when the run ends
    # A marker no model would write: the resumed run must keep these answers, not take new ones.
    path.write_text(json.dumps({**first, "before": ["kept 1", "kept 2"]}))
    resume(store, run_id)
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED
    data = _samples_artifact(store, run_id)
    assert data["before"] == ["kept 1", "kept 2"] and len(data["after"]) == 2
    assert data["prompts"] == first["prompts"]


@pytest.mark.integration
def test_a_failure_while_sampling_never_fails_the_run(
    store: Any, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from app.ui.run_text import samples_markdown
    from jobs.train.child import run

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("generation broke")

    monkeypatch.setattr(before_after, "greedy_texts", broken)
    run_id = store.create_run(tiny_spec(tiny_model, max_steps=3, sample_count=2))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED, record.error_summary
    data = _samples_artifact(store, run_id)
    assert data["before"] is None and data["after"] is None
    assert data["errors"] == ["before: RuntimeError: generation broke", "after: RuntimeError: generation broke"]
    assert "generation broke" in samples_markdown(store, record)
    assert "the base model's answers failed; training goes on" in caplog.text


@pytest.mark.integration
def test_a_dpo_run_answers_like_sft(store: Any, tiny_model: Path) -> None:
    from jobs.train.child import run

    run_id = store.create_run(
        tiny_spec(
            tiny_model,
            trainer="dpo",
            dataset="sample:preference-format",
            max_steps=2,
            per_device_train_batch_size=2,
            sample_count=2,
            sample_new_tokens=4,
        )
    )
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    data = _samples_artifact(store, run_id)
    assert len(data["before"]) == len(data["after"]) == 2 and data["skipped"] is None
    from jobs.data.sources import SAMPLES_DIR

    first_eval = json.loads((SAMPLES_DIR / "preference-format.eval.jsonl").read_text().splitlines()[0])
    assert data["prompts"][0]["text"] == first_eval["prompt"]


def test_a_reward_model_is_skipped_with_its_reason(tmp_path: Path) -> None:
    spec = JobSpec.from_dict({"trainer": "reward", "dataset": "sample:preference-format"})
    record_before(tmp_path, spec, None, None, None)  # no model needed: it is never asked
    data = json.loads((tmp_path / "samples.json").read_text())
    assert data["before"] is None and "reward model" in data["skipped"]
    assert "reward model" in status_line(data, True)


def test_prompts_come_from_the_spec_then_held_out_rows_then_built_in() -> None:
    chat = datasets.Dataset.from_list(
        [
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi?"},
                    {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "Why?"},
                    {"role": "assistant", "content": "Because."},
                ]
            }
        ]
    )
    prompts, _ = pick_prompts(JobSpec(), chat)
    assert prompts == [
        Prompt("Why?", (("system", "Be brief."), ("user", "Hi?"), ("assistant", "Hello."), ("user", "Why?")))
    ]
    plain = datasets.Dataset.from_list(
        [
            {"prompt": "2+2=", "completion": "4"},
            {"prompt": "2+2=", "completion": "5"},
            {"prompt": "3+3=", "completion": "6"},
        ]
    )
    assert pick_prompts(JobSpec(), plain)[0] == [Prompt("2+2=", None), Prompt("3+3=", None)]  # continued as text
    preference = datasets.Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": "Pick one"}],
                "chosen": [{"role": "assistant", "content": "A"}],
                "rejected": [{"role": "assistant", "content": "B"}],
            }
        ]
    )
    assert pick_prompts(JobSpec(), preference)[0] == [Prompt("Pick one", (("user", "Pick one"),))]
    text = datasets.Dataset.from_list([{"text": "plain text"}])
    prompts, source = pick_prompts(JobSpec(sample_count=2), text)
    assert [p.text for p in prompts] == list(BUILT_IN_PROMPTS[:2]) and "built-in" in source
    typed = JobSpec.from_yaml("sample_prompts:\n  - First?\n  - ' Second? '\nsample_count: 5\n")
    assert typed.sample_prompts == "First?\nSecond?" and typed.sample_prompt_list == ["First?", "Second?"]
    assert [p.text for p in pick_prompts(typed, chat)[0]] == ["First?", "Second?"]
    assert JobSpec.from_yaml(typed.to_yaml()) == typed


def test_the_run_page_says_when_a_run_has_no_samples(store: Any) -> None:
    from app.ui.run_text import samples_markdown

    run_id = store.create_run(JobSpec())
    store.claim_next_on_device("test", "0")
    store.mark_failed(run_id, "broke", "trace", exit_code=1)
    text = samples_markdown(store, store.get_run(run_id))
    assert text.startswith("### Before / after") and "has no before/after samples" in text


def test_answers_cannot_break_the_table() -> None:
    data = {
        "prompts": [{"text": "a|b", "messages": None}],
        "before": ["x\n| y |"],
        "after": ["<b>*z*</b>"],
        "max_new_tokens": 4,
        "source": "test",
    }
    table = before_after.table_markdown(data)
    row = table.splitlines()[-1]
    assert row.count("|") == 4 and "<b>" not in row and "<br>" in row
