"""Template pitfalls before queueing (issue 43, part 2; `jobs.checks.template_fit` through the masks step): another
family's chat template, a template that drops the system prompt or earlier turns, each a warning naming the rows
and the spec field of the fix; and the pad token equal to the stop token, which trl 1.16's collator does not mask
(so no finding). The default examples have none of them (tests/test_mask_checks.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from jobs.spec.job import JobSpec

CHAT = [
    {
        "messages": [
            {"role": "system", "content": "Always answer like a pirate."},
            {"role": "user", "content": "Where is the treasure hidden?"},
            {"role": "assistant", "content": "Under the old oak tree, matey."},
            {"role": "user", "content": "And the map?"},
            {"role": "assistant", "content": "In the captain's cabin."},
        ]
    },
    {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi."}]},
]
TURN = "'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'"
NO_SYSTEM = "{%- for m in messages %}{%- if m['role'] != 'system' %}{{- " + TURN + " }}{%- endif %}{%- endfor %}"
LAST_EXCHANGE = "{%- for m in messages[-2:] %}{{- " + TURN + " }}{%- endfor %}"
GEMMA = (
    "{{- bos_token }}{%- for m in messages %}{{- '<start_of_turn>' + m['role'] + '\\n' + m['content'] + "
    "'<end_of_turn>\\n' }}{%- endfor %}"
)


def model_with(tiny_model: Path, tmp_path: Path, template: str | None) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def warnings_for(model: Path, tmp_path: Path, rows: list[dict[str, Any]] = CHAT) -> list[str]:
    from jobs.checks.masks import mask_findings
    from jobs.models.tokenizer import LocalTokenizer

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems, warnings = mask_findings(
        JobSpec(model=str(model), dataset=str(data), max_length=128), LocalTokenizer(str(model))
    )
    assert not problems
    return warnings


def test_another_family_s_template_is_named_with_the_model_fix(tiny_model: Path, tmp_path: Path) -> None:
    (warning,) = [
        w for w in warnings_for(model_with(tiny_model, tmp_path, GEMMA), tmp_path) if "another model family" in w
    ]
    assert "'<end_of_turn>', '<start_of_turn>'" in warning and "Fix: set model:" in warning


def test_a_template_that_drops_the_system_prompt_names_the_rows(tiny_model: Path, tmp_path: Path) -> None:
    found = warnings_for(model_with(tiny_model, tmp_path, NO_SYSTEM), tmp_path)
    (warning,) = [w for w in found if "lose the system prompt" in w]
    assert "row 1 of" in warning and "row 2" not in warning and "set model:" in warning
    assert not [w for w in found if "earlier turns" in w]


def test_a_template_that_keeps_only_the_last_exchange_names_the_rows(tiny_model: Path, tmp_path: Path) -> None:
    found = warnings_for(model_with(tiny_model, tmp_path, LAST_EXCHANGE), tmp_path)
    (warning,) = [w for w in found if "lose the system prompt" in w or "lose earlier turns" in w]
    assert "row 1 of" in warning and "row 2" not in warning


def test_the_model_s_own_template_has_no_template_finding(tiny_model: Path, tmp_path: Path) -> None:
    found = warnings_for(model_with(tiny_model, tmp_path, None), tmp_path)
    assert not [w for w in found if "another model family" in w or "lose " in w], found


def test_a_pad_token_equal_to_the_stop_token_keeps_the_stop_token_trained(tiny_model: Path, tmp_path: Path) -> None:
    """trl 1.16's collator pads labels with -100 by length, never by token id: with pad == EOS the EOS that ends
    each answer keeps its label, in a batch where the shorter row is padded with that same id."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from jobs.models.tokenizer import local_tokenizer

    tok = local_tokenizer(str(tiny_model))
    assert tok is not None
    eos = tok.eos_token_id
    batch = DataCollatorForLanguageModeling(pad_token_id=eos)([{"input_ids": [5, 6, 7, eos]}, {"input_ids": [5, eos]}])
    assert batch["input_ids"][1].tolist() == [5, eos, eos, eos]  # padded with the stop token's id
    assert batch["labels"][0].tolist()[-1] == eos and batch["labels"][1].tolist() == [5, eos, -100, -100]
    assert not [w for w in warnings_for(model_with(tiny_model, tmp_path, None), tmp_path) if "pad" in w]
