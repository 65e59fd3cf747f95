"""Thinking data (issue 43, part 3): rows with `<think>...</think>` in an answer or a turn's `reasoning_content` /
`thinking` field. The audit counts them; `thinking: train | answer_only | strip` chooses what is trained, and the
token view shows it; `enable_thinking` reaches templates that take it; a template that drops the reasoning while
`thinking` is unset is a warning before queueing. The default example has none of these findings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from jobs.spec.enums import Thinking
from jobs.spec.job import JobSpec

THINK_PC = [
    {"prompt": "What is 2+2?", "completion": "<think>two plus two makes four</think> Four."},
    {"prompt": "Name a colour.", "completion": " Blue."},
    {"prompt": "Capital of France?", "completion": "<think>the French capital city</think> Paris."},
]
REASONING_CHAT = [
    {
        "messages": [
            {"role": "user", "content": "What is 3+3?"},
            {"role": "assistant", "content": "Six.", "reasoning_content": "three and three are six"},
        ]
    },
    {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi."}]},
]
# A DeepSeek-R1-style template: each assistant turn keeps only what follows its last </think>.
DROPPING = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}{{- message['content'].split('</think>')[-1] + '<|im_end|>\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# A Qwen3-style switch: the template writes what enable_thinking says.
SWITCH = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if enable_thinking is defined and enable_thinking is false %}{{- 'no thinking' }}{%- endif %}"
)


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def with_template(tiny_model: Path, tmp_path: Path, template: str) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


def view(spec: JobSpec, model: Path) -> list[Any]:
    from jobs.data.loading import load_data
    from jobs.data.tokens.viewed_rows import training_views
    from jobs.models.tokenizer import local_tokenizer

    tok = local_tokenizer(str(model))
    assert tok is not None
    return [
        (
            tok.decode([t.id for t in v.sequences[0].tokens if t.trained]),
            tok.decode([t.id for t in v.sequences[0].tokens]),
        )
        for v in training_views(spec, load_data(spec), tok, first=3).views
    ]


def test_the_audit_counts_the_rows_that_carry_reasoning(tmp_path: Path) -> None:
    from jobs.data.audit.report import audit

    spec = JobSpec(dataset=str(jsonl(tmp_path / "pc.jsonl", THINK_PC)))
    (found,) = [f for f in audit(spec).findings if f.code == "thinking-rows"]
    assert found.count == 2 and [n for _, _, n in found.rows] == [1, 3]
    assert "2 of 3 training rows carry reasoning" in found.problem and "thinking: train, answer_only" in found.fix
    chat = JobSpec(dataset=str(jsonl(tmp_path / "chat.jsonl", REASONING_CHAT)), thinking=Thinking("strip"))
    (found,) = [f for f in audit(chat).findings if f.code == "thinking-rows"]  # a reasoning field counts too
    assert found.count == 1 and "removed before training (thinking: strip)" in found.problem and not found.fix


def test_each_choice_trains_what_it_says(tiny_model: Path, tmp_path: Path) -> None:
    data = str(jsonl(tmp_path / "pc.jsonl", THINK_PC))
    trained_all, _ = view(JobSpec(model=str(tiny_model), dataset=data, max_length=64), tiny_model)[0]
    assert "two plus two makes four" in trained_all and "Four." in trained_all
    for choice in ("train", "answer_only", "strip"):
        trained, whole = view(
            JobSpec(model=str(tiny_model), dataset=data, max_length=64, thinking=Thinking(choice)), tiny_model
        )[0]
        assert "Four." in trained
        assert ("two plus two" in trained) == (choice == "train"), choice
        assert ("two plus two" in whole) == (choice != "strip"), choice  # answer_only: in view, masked


def test_a_reasoning_field_is_trained_not_dropped(tiny_model: Path, tmp_path: Path) -> None:
    data = str(jsonl(tmp_path / "chat.jsonl", REASONING_CHAT))
    trained, _ = view(JobSpec(model=str(tiny_model), dataset=data, max_length=64), tiny_model)[0]
    assert "<think>\nthree and three are six\n</think>" in trained and "Six." in trained
    stripped, _ = view(
        JobSpec(model=str(tiny_model), dataset=data, max_length=64, thinking=Thinking("strip")), tiny_model
    )[0]
    assert "three and three" not in stripped and "Six." in stripped


def test_answer_only_on_conversations_is_refused_by_field(tiny_model: Path, tmp_path: Path) -> None:
    from jobs.data.loading import load_data
    from jobs.data.sources import DataError

    spec = JobSpec(
        model=str(tiny_model),
        dataset=str(jsonl(tmp_path / "c.jsonl", REASONING_CHAT)),
        thinking=Thinking("answer_only"),
    )
    with pytest.raises(DataError) as refused:
        load_data(spec)
    assert refused.value.problems[0].field == "thinking" and "thinking: strip" in refused.value.problems[0].fix


def test_enable_thinking_reaches_the_template(tiny_model: Path, tmp_path: Path) -> None:
    model = with_template(tiny_model, tmp_path, SWITCH)
    data = str(jsonl(tmp_path / "chat.jsonl", REASONING_CHAT))
    _, off = view(JobSpec(model=str(model), dataset=data, max_length=96, thinking=Thinking("strip")), model)[0]
    _, on = view(JobSpec(model=str(model), dataset=data, max_length=96, thinking=Thinking("train")), model)[0]
    _, unset = view(JobSpec(model=str(model), dataset=data, max_length=96), model)[0]
    assert "no thinking" in off and "no thinking" not in on and "no thinking" not in unset


def test_a_template_that_drops_the_reasoning_is_a_warning_while_thinking_is_unset(
    tiny_model: Path, tmp_path: Path
) -> None:
    from jobs.checks.masks import mask_findings
    from jobs.models.tokenizer import LocalTokenizer

    model = with_template(tiny_model, tmp_path, DROPPING)
    data = str(jsonl(tmp_path / "chat.jsonl", REASONING_CHAT))
    spec = JobSpec(model=str(model), dataset=data, max_length=96)
    problems, warnings = mask_findings(spec, LocalTokenizer(str(model)))
    (warning,) = [w for w in warnings if "carry reasoning" in w]
    assert not problems and "row 1 of" in warning and "thinking: strip" in warning
    chosen = JobSpec(model=str(model), dataset=data, max_length=96, thinking=Thinking("strip"))
    assert not [w for w in mask_findings(chosen, LocalTokenizer(str(model)))[1] if "carry reasoning" in w]
    kept = JobSpec(model=str(tiny_model), dataset=data, max_length=96)  # the tiny model's template keeps it
    assert not [w for w in mask_findings(kept, LocalTokenizer(str(tiny_model)))[1] if "carry reasoning" in w]


@pytest.mark.integration
def test_a_real_trainer_trains_on_thinking_rows_with_enable_thinking(tiny_model: Path, tmp_path: Path) -> None:
    """The rows as loaded (reasoning folded, `chat_template_kwargs` per row) go through a real SFTTrainer step."""
    from jobs.config.mapping import training_config
    from jobs.data.loading import load_data
    from jobs.devices.facts import CPU
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model

    data = str(jsonl(tmp_path / "chat.jsonl", REASONING_CHAT))
    spec = JobSpec(model=str(tiny_model), dataset=data, max_length=64, max_steps=1, per_device_train_batch_size=2,
                   thinking=Thinking("train"))  # fmt: skip
    model, tokenizer = load_model(spec, CPU)
    args = training_config(spec, CPU, str(tmp_path / "out"))
    trainer = build_trainer(spec, model, tokenizer, args, load_data(spec).train, None, None, [])
    first = trainer.train_dataset[0]
    assert "three and three are six" in tokenizer.decode(first["input_ids"])
    assert trainer.train().global_step == 1
