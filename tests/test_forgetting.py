"""The forgetting meter (`jobs.train.forgetting`): the shipped general text, its figures and line, the training
doctor's `forgetting` rule; a real tiny run trained to forget shows the rise and gets the finding."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from jobs.doctor.findings import RunContext, Severity
from jobs.doctor.rulebook import examine
from jobs.doctor.rules import FORGET_RISE, forgetting
from jobs.spec.doctor_codes import RuleCode
from jobs.train import forgetting as meter
from storage.records import MetricPoint


def test_the_general_text_is_a_few_hundred_sentences_and_a_few_prompts() -> None:
    sentences, prompts = meter.general_sentences(), meter.general_prompts()
    assert 250 <= len(sentences) <= 400 and len(set(sentences)) == len(sentences)
    texts = meter.general_texts(type("Plain", (), {"chat_template": None})())
    assert len(texts) == meter.GENERAL_SAMPLE + len(prompts) and len(set(texts)) == len(texts)
    assert 5 <= len(prompts) <= 20 and all(p and a for p, a in prompts)


def test_the_line_reads_general_perplexity_beside_the_eval_loss() -> None:
    m = meter.Forgetting(2.0, 2.0 + math.log(1.04), 1.0, 0.69)
    assert m.text() == "general perplexity +4% while eval loss fell 31%"
    assert meter.Forgetting(2.0, 1.9).text() == "general perplexity -10%"
    rows = [MetricPoint(0, meter.GENERAL, 2.0, 0.0), MetricPoint(30, meter.GENERAL, 2.5, 1.0)]
    assert meter.from_rows(rows[:1], []) is None  # the base only: not yet after training
    assert meter.from_rows(rows, []) == meter.Forgetting(2.0, 2.5)
    assert "## Forgetting" in meter.card_section(meter.from_rows(rows, []))


def curves(after: float) -> dict[str, list[tuple[int, float]]]:
    return {"general_loss": [(0, 2.0), (30, after)], "task_loss": [(0, 3.0), (30, 1.5)]}


def test_the_rule_fires_past_its_threshold_at_the_last_step_and_not_below() -> None:
    below = 2.0 + math.log(1 + FORGET_RISE) - 0.001
    assert forgetting(curves(below), RunContext(), -1) is None
    found = forgetting(curves(2.0 + math.log(1.5)), RunContext(learning_rate=2e-4), -1)
    assert found is not None and found.code is RuleCode.FORGETTING and found.step == 30
    assert found.severity is Severity.INFO and "rose 50%" in found.diagnosis and "fell 50%" in found.diagnosis
    assert found.spec_change == {"learning_rate": 1e-4}
    by_epochs = forgetting(curves(2.0 + math.log(1.5)), RunContext(num_train_epochs=6), -1)
    assert by_epochs is not None and by_epochs.spec_change == {"num_train_epochs": 3.0}
    assert forgetting(curves(3.0), RunContext(), 30) is None  # judged once, when the "after" row is new
    assert [f.code for f in examine(curves(3.0), RunContext())] == [RuleCode.FORGETTING]


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_a_run_trained_to_forget_shows_the_rise_and_gets_the_finding(store, tiny_model: Path) -> None:
    """Full fine-tuning of the tiny model on 4 chat rows, many epochs: it recites them and reads ordinary text
    worse than its base did (the base, random, reads every text about equally badly)."""
    import training_helpers

    from app.ui.run_text import samples_markdown
    from jobs.doctor.watch import Doctor
    from jobs.train.child import run

    spec = training_helpers.tiny_spec(
        tiny_model, max_steps=30, learning_rate=3e-3, max_train_samples=4, method="full", eval_split=4
    )
    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    figures = meter.read(store, run_id)
    assert figures is not None and figures.general_change > FORGET_RISE
    assert [p.step for p in store.metrics(run_id, [meter.GENERAL])] == [0, 30]
    found = [f for f in Doctor(store, run_id, spec, interval_s=0.0).check(final=True) if f.code is RuleCode.FORGETTING]
    assert len(found) == 1 and found[0].step == 30
    assert figures.text() in samples_markdown(store, store.get_run(run_id))
    card = store.run_dir(run_id) / "output" / "README.md"
    bundle_cards = list(store.run_dir(run_id).rglob("README.md"))
    assert any(
        "## Forgetting" in p.read_text() and figures.text() in p.read_text()
        for p in [card, *bundle_cards]
        if p.exists()
    )
