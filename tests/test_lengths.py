"""Length-aware memory prediction: the rows' measured token lengths, the worst micro-batch they form, the
cache, and the refusal at submit that follows the data's figure instead of every row at max_length."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import training_helpers

from jobs.data.tokens.lengths import RowLengths, worst_case_batch
from jobs.data.tokens.measurement import measure, sequences
from jobs.devices.facts import DeviceFacts
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec


class WordTokenizer:
    """One token per whitespace-separated word, plus one for special tokens: lengths a test can count."""

    eos_token = "<eos>"
    chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"

    def __call__(self, texts: list[str], add_special_tokens: bool = True, **_: Any) -> dict[str, Any]:
        count = [len(t.replace(self.eos_token, " " + self.eos_token).split()) for t in texts]
        return {"input_ids": [[0] * (n + (1 if add_special_tokens else 0)) for n in count]}

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool = False, add_generation_prompt: bool = False
    ) -> str:
        return " ".join(m["content"] for m in messages) + (" A:" if add_generation_prompt else "")


def words(n: int) -> str:
    return " ".join(["w"] * n)


def test_each_trainer_measures_the_sequences_it_builds() -> None:
    tok = WordTokenizer()
    sft = measure([{"text": words(10)}, {"text": words(3)}], tok, Trainer.SFT)
    assert sft.lengths.tolist() == [[12], [5]]  # + EOS appended by trl + the special token
    pairs = [{"prompt": words(4), "chosen": " " + words(6), "rejected": " " + words(1)}]
    dpo = measure(pairs, tok, Trainer.DPO)
    assert dpo.lengths.tolist() == [[12, 7]]  # prompt+chosen, prompt+rejected, each + EOS + special
    chat = [{"messages": [{"role": "user", "content": words(2)}, {"role": "assistant", "content": words(5)}]}]
    assert measure(chat, tok, Trainer.SFT).lengths.tolist() == [[7]]  # rendered; the template holds the specials
    # Each row's prompt too, as trl tokenizes it alone: no EOS; a chat's turns before its first answer, with
    # the generation prompt (" A:" here).
    assert dpo.prompt_lengths().tolist() == [5] and sft.prompt_lengths().tolist() == [0, 0]
    assert measure(chat, tok, Trainer.SFT).prompt_lengths().tolist() == [3]
    convo = [{"prompt": [{"role": "user", "content": words(3)}], "completion": [{"role": "assistant", "content": "a"}]}]
    assert measure(convo, tok, Trainer.SFT).prompt_lengths().tolist() == [4]
    assert sequences({"prompt": "p", "completion": "c", "label": True}, Trainer.KTO) == ["pc"]
    assert sequences({"prompt": "p"}, Trainer.GRPO) == ["p"]


def test_a_generating_trainers_prompt_is_measured_as_it_generates_from_it() -> None:
    """GRPO renders a chat prompt with the generation prompt (the assistant's header its completion follows) and
    tokenizes a text prompt without EOS: its rows are that long, the header included (it was left out: a
    templated prompt came out 6 tokens short on SmolLM2's template)."""
    tok = WordTokenizer()
    chat = [{"prompt": [{"role": "user", "content": words(3)}]}]
    assert measure(chat, tok, Trainer.GRPO).lengths.tolist() == [[4]]  # 3 words + " A:"
    assert measure([{"prompt": words(3)}], tok, Trainer.GRPO).lengths.tolist() == [[4]]  # + the special, no EOS


def test_the_worst_micro_batch_pads_the_longest_rows_and_truncates_at_max_length() -> None:
    lengths = RowLengths.of([[30], [50], [700], [10]])
    spec = JobSpec(per_device_train_batch_size=2, max_length=512)
    batch = lengths.worst_batch(spec)
    assert (batch.sequences, batch.length) == (2, 512)  # 700 cut at max_length, padded batch of two
    stats = lengths.stats(512)
    assert (stats.longest, stats.truncated, stats.longest_untruncated, stats.rows) == (512, 1, 700, 4)
    short = RowLengths.of([[30], [50], [40]])
    assert short.worst_batch(spec).tokens == 2 * 50
    flat = short.worst_batch(spec.replace(padding_free=True, trainer=Trainer.DPO))
    assert (flat.sequences, flat.length) == (1, 90)  # the two longest rows, no padding
    packed = short.worst_batch(spec.replace(packing=True, max_length=64))
    assert packed.tokens == min(2 * 64, 120)  # blocks of max_length, never more tokens than the data has
    pairs = RowLengths.of([[20, 90], [80, 10]])
    assert pairs.worst_batch(JobSpec(trainer=Trainer.DPO, per_device_train_batch_size=2)).tokens == 4 * 90
    assert worst_case_batch(spec).tokens == 2 * 512


def test_lengths_are_cached_per_data_and_tokenizer(data_home: Path, tiny_model: Path, tmp_path: Path) -> None:
    from jobs.checks.memory import measured_lengths
    from jobs.models.tokenizer import local_tokenizer

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": words(n)}) + "\n" for n in (5, 40, 12)))
    spec = training_helpers.tiny_spec(tiny_model, dataset=str(data), max_train_samples=None)
    loads: Counter = Counter()

    def tokenizer() -> Any:
        loads["tokenizer"] += 1
        return local_tokenizer(spec.model)

    def lengths(spec: JobSpec) -> Any:
        return measured_lengths(spec, tokenizer)

    first = lengths(spec)
    again = lengths(spec.replace(max_length=16, per_device_train_batch_size=1, lora_r=4))
    assert first is not None and again is not None and loads["tokenizer"] == 1  # the second read the cache
    assert first.lengths.tolist() == again.lengths.tolist() and first.rows == 3
    # Each row's origin (source, line number) is kept with its lengths and comes back from the cache.
    assert first.origins is not None and again.origins is not None
    assert first.origins.tolist() == again.origins.tolist() == [[0, 1], [0, 2], [0, 3]]
    assert first.stats(16).truncated >= 1
    data.write_text("".join(json.dumps({"text": words(n)}) + "\n" for n in (5, 6)))
    changed = lengths(spec)
    assert changed is not None and changed.rows == 2 and loads["tokenizer"] == 2  # new content: measured again


def _rows(path: Path, n_words: int, n_rows: int = 24) -> str:
    path.write_text("".join(json.dumps({"text": words(n_words)}) + "\n" for _ in range(n_rows)))
    return str(path)


def test_short_rows_under_a_long_max_length_fit_and_long_rows_are_still_refused(
    data_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    from jobs.checks.pipeline import check

    spec = training_helpers.tiny_spec(
        tiny_model, dataset=_rows(tmp_path / "short.jsonl", 300), max_length=4096, max_train_samples=None
    )
    free = check(spec, device=DeviceFacts(kind="cpu", name="cpu", total_bytes=1024**4))
    p = free.prediction
    assert p is not None and p.from_data and p.lengths is not None and 250 <= p.lengths.longest < 1000
    assert p.worst_case_bytes is not None and p.total_bytes < p.worst_case_bytes / 3
    # A host between the two figures: the data's figure fits, the max_length bound would not.
    gpu = DeviceFacts(kind="cpu", name="cpu", total_bytes=int(p.worst_case_bytes * 0.6))
    assert p.total_bytes < 0.9 * gpu.total_bytes
    fits = check(spec, device=gpu)
    assert not [x for x in fits.problems if x.field == "memory"], fits.problems
    assert fits.prediction is not None and fits.prediction.verdict.value == "fits"
    long = spec.replace(dataset=_rows(tmp_path / "long.jsonl", 5000))
    refused = check(long, device=gpu)
    memory = [x for x in refused.problems if x.field == "memory"]
    assert memory and "Will not fit" in memory[0].problem
    assert refused.prediction is not None and refused.prediction.lengths is not None
    assert refused.prediction.lengths.truncated == 24  # every row cut at max_length: the bound is reached


def test_plan_json_has_both_figures_and_the_length_statistics(
    data_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    from jobs.checks.pipeline import check

    spec = training_helpers.tiny_spec(tiny_model, dataset=_rows(tmp_path / "r.jsonl", 50), max_length=1024)
    out = check(spec).prediction.to_dict()  # type: ignore[union-attr]
    assert out["total_bytes"] == out["data_bytes"] < out["worst_case_bytes"]
    assert out["lengths"]["rows"] == 16 and out["lengths"]["max_length"] == 1024
    assert set(out["phases"]) == {"load", "forward", "backward", "optimizer"}
    assert out["phases"]["load"] < out["phases"]["forward"] <= out["total_bytes"]


@pytest.mark.parametrize("trainer", [Trainer.DPO, Trainer.KTO, Trainer.ORPO])
def test_preference_rows_are_measured_for_their_trainer(data_home: Path, tiny_model: Path, trainer: Trainer) -> None:
    from jobs.checks.memory import measured_lengths

    sample = {
        Trainer.DPO: "sample:preference-format",
        Trainer.KTO: "sample:kto-format",
        Trainer.ORPO: "sample:preference-format",
    }
    spec = training_helpers.tiny_spec(tiny_model, trainer=trainer.value, dataset=sample[trainer])
    lengths = measured_lengths(spec)
    assert lengths is not None and lengths.rows > 0
    assert lengths.lengths.shape[1] == (1 if trainer is Trainer.KTO else 2)


def test_the_form_shows_this_datas_figure_and_the_bound(data_home: Path, tiny_model: Path) -> None:
    from app.ui import form as ui_form

    spec = training_helpers.tiny_spec(tiny_model, max_length=2048)
    text, bar = ui_form.memory_views(*ui_form.form_values(spec))
    assert "This data: **" in text and "Any data up to max_length 2048:" in text and "longest row" in text
    assert 'id="memory-bound"' in bar and "any data up to max_length 2048" in bar
