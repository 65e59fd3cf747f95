"""The forgetting meter (`jobs.train.forgetting`): the shipped general text, its figures and line, the training
doctor's `forgetting` rule; a real tiny run trained to forget shows the rise and gets the finding."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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


def full_logits_loss(model: Any, tokenizer: Any, texts: list[str]) -> float:
    """The meter's figure as it was computed before issue #49: full [batch, seq, vocab] logits, 32 rows a batch."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = sorted((tokenizer(t, add_special_tokens=False)["input_ids"][: meter.MAX_TOKENS] for t in texts), key=len)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(encoded), 32):
            ids = [x for x in encoded[start : start + 32] if len(x) >= 2]
            width = max(map(len, ids))
            input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
            logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
            total += float(nll[mask[:, 1:].bool()].sum())
            count += int(mask[:, 1:].sum())
    return total / count


@pytest.fixture
def tiny_lm(tiny_model: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model)


def largest_head_output(model: Any) -> list[int]:
    """The largest number of logits the LM head returned at once, kept up to date by a hook."""
    largest = [0]
    model.get_output_embeddings().register_forward_hook(
        lambda _m, _a, out: largest.__setitem__(0, max(largest[0], out.numel()))
    )
    return largest


def test_the_meter_reads_the_same_loss_through_a_bounded_slice_of_logits(
    tiny_lm: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #49: the meter held a 32-row batch's full logits (32 x 96 x vocab: ~320 MiB on SmolLM2, uncounted
    by the memory prediction); now the head gets at most LOGIT_BUDGET logits at once, whatever the batch, with
    the same mean token loss."""
    model, tokenizer = tiny_lm
    texts = meter.general_texts(tokenizer)
    expected = full_logits_loss(model, tokenizer, texts)
    budget = 16 * model.config.vocab_size  # 16 tokens' logits: far below a 32-row batch's
    monkeypatch.setattr(meter, "LOGIT_BUDGET", budget, raising=False)
    largest = largest_head_output(model)
    assert meter.mean_loss(model, tokenizer, texts) == pytest.approx(expected, rel=1e-5)
    assert 0 < largest[0] <= budget


def test_logits_the_forward_changes_are_soft_capped_as_the_config_says_or_read_in_small_batches(
    tiny_lm: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward that soft-caps its head's output as its config says (Gemma 2/3's final_logit_softcapping) is
    read through the head in chunks, capped the same; one that changes it otherwise (here doubled) is read
    through its own logits, a row or a few at a time: the same figure either way, the logits still bounded."""
    import torch

    model, tokenizer = tiny_lm
    texts = meter.general_texts(tokenizer)
    monkeypatch.setattr(meter, "LOGIT_BUDGET", 16 * model.config.vocab_size, raising=False)
    largest = largest_head_output(model)
    forward_reads: list[int] = []
    read_whole = getattr(meter, "_forward_losses", None)

    def counted(*args: Any) -> Any:
        forward_reads.append(1)
        return read_whole(*args)  # type: ignore[misc]

    if read_whole is not None:
        monkeypatch.setattr(meter, "_forward_losses", counted)

    def soft_capped(_m: Any, _a: Any, out: Any) -> None:
        out.logits.copy_(torch.tanh(out.logits / 0.05) * 0.05)  # a cap low enough to change every figure

    capping = model.register_forward_hook(soft_capped)
    model.config.final_logit_softcapping = 0.05
    expected = full_logits_loss(model, tokenizer, texts)
    largest[0] = 0
    assert meter.mean_loss(model, tokenizer, texts) == pytest.approx(expected, rel=1e-5)
    assert 0 < largest[0] <= 16 * model.config.vocab_size and not forward_reads  # through the head, capped

    capping.remove()
    model.config.final_logit_softcapping = None

    def doubled(_m: Any, _a: Any, out: Any) -> None:
        out.logits.mul_(2)

    model.register_forward_hook(doubled)
    expected = full_logits_loss(model, tokenizer, texts)
    largest[0] = 0
    assert meter.mean_loss(model, tokenizer, texts) == pytest.approx(expected, rel=1e-5)
    assert 0 < largest[0] <= meter.MAX_TOKENS * model.config.vocab_size and forward_reads  # one row's at most
