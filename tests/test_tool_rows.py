"""Tool-calling rows: LLaMA-Factory's ShareGPT tool demo and OpenAI-format chats train through a chat template that
renders tools, and are refused, naming the template, for one that does not.

The data: the first 25 rows of LLaMA-Factory's `glaive_toolcall_en_demo.json` (tests/fixtures/llamafactory/) and
six OpenAI-format chats (tests/fixtures/tool_calls/). The model: the tiny offline Llama, once with its own template
(which renders role and content only) and once with a Qwen-like template that renders `tools`, `tool_calls` and
`tool` turns (`TOOLS_TEMPLATE`, written here).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from jobs.checks.pipeline import check
from jobs.checks.tool_template import ignored_tool_parts, tools_refusal
from jobs.data.formats import detect_conversion
from jobs.data.inspection import DatasetInfo, check_dataset
from jobs.data.loading import load_data
from jobs.data.row_formats import RowFormat
from jobs.data.tokens.measurement import measure
from jobs.data.tool_turns import ToolRows, call_message, chat_message, parse_tools
from jobs.devices.facts import CPU
from jobs.devices.probe import cpu_facts
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec

FIXTURES = Path(__file__).parent / "fixtures"
GLAIVE = FIXTURES / "llamafactory" / "glaive_toolcall_en_demo.json"
OPENAI = FIXTURES / "tool_calls" / "openai_tool_calls.jsonl"

# A Qwen-like ChatML template: the tool schemas in the system turn, calls as <tool_call> JSON, results as
# <tool_response>; every literal is a Jinja string so the whitespace control cannot eat a newline.
TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] or '' }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{{- '<tool_call>{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{- call['function']['arguments'] | tojson }}{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + message['content'] + '</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tools_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with `TOOLS_TEMPLATE` as its chat template."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-tools") / "tiny-llama-tools"
    shutil.copytree(tiny_model, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TOOLS_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


# ---------------------------------------------------------------------- conversion
def test_the_glaive_demo_converts_whole() -> None:
    """On main all 25 rows were refused ("unknown speaker function_call" in 11, the whole set with them)."""
    info = check_dataset(str(GLAIVE), Trainer.SFT)
    assert (info.n_rows, info.format, info.source_format) == (25, RowFormat.MESSAGES, "sharegpt")
    assert "`tools` column" in (info.conversion or "")
    raw = json.loads(GLAIVE.read_text())
    with_calls = [i for i, r in enumerate(raw, 1) if any(t["from"] == "function_call" for t in r["conversations"])]
    with_tools = [i for i, r in enumerate(raw, 1) if json.loads(r["tools"])]
    assert len(with_calls) == 11 and set(with_calls) <= set(with_tools)
    assert info.tools.count == len(with_tools) and info.tools.numbers == with_tools[:5]


def test_a_glaive_row_becomes_template_messages() -> None:
    raw = json.loads(GLAIVE.read_text())
    conversion = detect_conversion(raw[0].keys(), raw[:20], Trainer.SFT)
    assert conversion is not None and "tools" in conversion.reads
    row, problems = conversion.convert(raw[3])  # human, function_call, observation, gpt (three times)
    assert problems == [] and row is not None
    roles = [m["role"] for m in row["messages"]]
    assert roles[:4] == ["user", "assistant", "tool", "assistant"]
    call = row["messages"][1]
    assert call["content"] == ""
    assert call["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "calculate_area", "arguments": {"shape": "rectangle", "dimensions": [5, 3]}},
        }
    ]
    assert row["messages"][2] == {"role": "tool", "content": '{"area": 15}'}
    tools = json.loads(row["tools"])
    assert [t["type"] for t in tools] == ["function", "function"]
    assert tools[0]["function"]["name"] == "calculate_area" and "parameters" in tools[0]["function"]
    plain, _ = conversion.convert(raw[1])  # "tools": "[]": no tools column on the row
    assert plain is not None and "tools" not in plain


def test_openai_rows_convert() -> None:
    """On main: "`messages` has a turn without `content`" (the calls' null content)."""
    info = check_dataset(str(OPENAI), Trainer.SFT)
    assert (info.n_rows, info.format, info.source_format, info.tools.count) == (6, RowFormat.MESSAGES, "chat", 6)
    messages = info.preview[0]["messages"]
    assert messages[2]["content"] == ""  # null next to the calls
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "celsius"}  # was JSON
    assert "id" not in messages[2]["tool_calls"][0] and messages[3] == {
        "role": "tool",
        "content": '{"temperature": 21, "sky": "sunny"}',
        "name": "get_weather",
    }
    assert len(info.preview[2]["messages"][1]["tool_calls"]) == 2  # parallel calls
    assert json.loads(info.preview[0]["tools"])[1]["function"]["name"] == "convert_currency"


@pytest.mark.parametrize(
    "value,problem",
    [
        ("not json", "`conversations` has a `function_call` turn whose value is not JSON"),
        ('{"arguments": {}}', "`conversations` has a tool call without a `name`"),
        (
            '{"name": "f", "arguments": "[1"}',
            "`conversations` has a call of `f` whose `arguments` are not a JSON object",
        ),
        ("[]", "`conversations` has an empty list of tool calls"),
    ],
)
def test_bad_calls_name_the_problem(value: str, problem: str) -> None:
    message, problems = call_message(value, "conversations")
    assert message is None and problems[0][0] == problem and problems[0][1]


def test_calls_and_tools_in_their_shapes() -> None:
    message, _ = call_message('[{"name": "a", "arguments": {"x": 1}}, {"name": "b"}]', "c")
    assert message is not None and [c["function"]["arguments"] for c in message["tool_calls"]] == [{"x": 1}, {}]
    flat, _ = chat_message({"role": "assistant", "tool_calls": [{"name": "a", "arguments": "{}"}]}, "messages")
    assert flat == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "a", "arguments": {}}}],
    }
    assert parse_tools("") == (None, []) and parse_tools("[]") == (None, []) and parse_tools(None) == (None, [])
    wrapped = [{"type": "function", "function": {"name": "a"}}]
    assert parse_tools('[{"name": "a"}]') == (wrapped, []) and parse_tools(wrapped) == (wrapped, [])
    assert parse_tools("{oops")[1][0][0] == "`tools` is not a list of tool schemas (or its JSON text)"
    assert parse_tools([{"description": "x"}])[1][0][0] == "`tools` has a tool schema without a `name`"


def test_a_bad_row_is_refused_by_number(tmp_path: Path) -> None:
    from jobs.data.sources import DataError

    rows = json.loads(GLAIVE.read_text())[:3]
    rows[1]["conversations"][1] = {"from": "function_call", "value": "{broken"}
    rows[2]["tools"] = "{broken"
    (tmp_path / "bad.json").write_text(json.dumps(rows))
    with pytest.raises(DataError) as raised:
        check_dataset(str(tmp_path / "bad.json"), Trainer.SFT)
    text = "\n".join(str(p) for p in raised.value.problems)
    assert "row 2: `conversations` has a `function_call` turn whose value is not JSON" in text
    assert "row 3: `tools` is not a list of tool schemas" in text


def test_preference_and_kto_rows_keep_their_tools() -> None:
    conversation = [
        {"from": "human", "value": "Area of a 2 by 3 rectangle?"},
        {"from": "function_call", "value": '{"name": "area", "arguments": {"w": 2, "h": 3}}'},
        {"from": "observation", "value": "6"},
    ]
    row = {
        "conversations": conversation,
        "chosen": {"from": "gpt", "value": "It is 6."},
        "rejected": "It is 5.",
        "tools": '[{"name": "area"}]',
    }
    conversion = detect_conversion(row.keys(), [row], Trainer.DPO)
    assert conversion is not None
    converted, problems = conversion.convert(row)
    assert problems == [] and converted is not None
    assert converted["prompt"][1]["tool_calls"][0]["function"]["name"] == "area"
    assert json.loads(converted["tools"]) == [{"type": "function", "function": {"name": "area"}}]
    kto = {
        "messages": [*conversation, {"from": "gpt", "value": "It is 6."}],
        "label": True,
        "tools": [{"name": "area"}],
    }
    converted, problems = detect_conversion(kto.keys(), [kto], Trainer.KTO).convert(kto)  # type: ignore[union-attr]
    assert (
        problems == []
        and converted is not None
        and converted["completion"] == [{"role": "assistant", "content": "It is 6."}]
    )
    assert "tools" in converted


# ---------------------------------------------------------------------- rendering
def test_training_rows_render_schema_call_and_result(tools_model: Path) -> None:
    """The rows load_data hands trl render, through trl's own call, with the schema, the call and the result."""
    from trl.data_utils import apply_chat_template

    loaded = load_data(JobSpec(model=str(tools_model), dataset=str(GLAIVE)))
    row = loaded.train[3]
    assert isinstance(row["tools"], str)  # JSON text: trl json-loads it itself
    text = apply_chat_template({"messages": row["messages"]}, _tokenizer(tools_model), tools=json.loads(row["tools"]))[
        "text"
    ]
    assert '"name": "calculate_area"' in text and "Calculate the area of a given shape" in text  # the schema
    assert '<tool_call>{"name": "calculate_area", "arguments": {"shape": "rectangle", "dimensions": [5, 3]}}' in text
    assert '<tool_response>{"area": 15}</tool_response>' in text
    assert "None" not in text  # Arrow's empty tool_calls/name keys are dropped before rendering


def test_measured_lengths_include_the_tools(tools_model: Path) -> None:
    loaded = load_data(JobSpec(model=str(tools_model), dataset=str(OPENAI)))
    tokenizer = _tokenizer(tools_model)
    with_tools = measure(loaded.train, tokenizer, Trainer.SFT).lengths[:, 0]
    without = measure(loaded.train.remove_columns("tools"), tokenizer, Trainer.SFT).lengths[:, 0]
    assert all(a > b for a, b in zip(with_tools, without)), (with_tools, without)
    first = loaded.train[0]
    rendered = tokenizer.apply_chat_template(first["messages"], tools=json.loads(first["tools"]), tokenize=False)
    assert int(with_tools[0]) == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------- the template check
def test_the_plain_template_is_found_to_ignore_tools(tiny_model: Path, tools_model: Path) -> None:
    assert ignored_tool_parts(_tokenizer(tiny_model)) == ["`tools`", "`tool_calls`"]
    assert ignored_tool_parts(_tokenizer(tools_model)) == []


@pytest.mark.parametrize("data", [GLAIVE, OPENAI])
def test_tool_rows_are_refused_for_a_template_without_tools(data: Path, tiny_model: Path) -> None:
    checked = check(JobSpec(model=str(tiny_model), dataset=str(data), max_length=1024), device=cpu_facts())
    refused = [p for p in checked.problems if "ignores" in p.problem]
    assert len(refused) == 1, checked.problems
    n = 12 if data == GLAIVE else 6
    assert refused[0].field == "dataset"
    named = re.search(r"ignores `tools` and `tool_calls`: rows ([\d, ]+) \(and (\d+) more\) would", refused[0].problem)
    assert named is not None, refused[0].problem
    assert len(named.group(1).split(", ")) + int(named.group(2)) == n  # the first five named, the rest counted
    assert "would train without their tool calls" in refused[0].problem
    assert "supports tools" in refused[0].fix and "drop the tool turns" in refused[0].fix


@pytest.mark.parametrize("data", [GLAIVE, OPENAI])
def test_tool_rows_pass_the_check_on_a_tools_template(data: Path, tools_model: Path) -> None:
    checked = check(JobSpec(model=str(tools_model), dataset=str(data), max_length=2048), device=cpu_facts())
    assert not [p for p in checked.problems if p.field == "dataset"], checked.problems


def test_orpo_is_refused_for_tool_rows() -> None:
    info = DatasetInfo("x.json", RowFormat.PREFERENCE, 3, [], tools=ToolRows(2, [1, 3]))
    problem = tools_refusal(JobSpec.from_dict({"trainer": "orpo"}), "dataset", info, lambda: None)
    assert (
        problem is not None
        and "renders rows without `tools`: rows 1, 3 would train without their tool schemas" in problem.problem
    )
    assert (
        tools_refusal(JobSpec.from_dict({"trainer": "dpo"}), "dataset", info, lambda: None) is None
    )  # no tokenizer: unknown


# ---------------------------------------------------------------------- training
@pytest.mark.integration
def test_tool_rows_train_on_a_tools_template(tools_model: Path, tmp_path: Path) -> None:
    from training_helpers import tiny_spec

    from jobs.train.training import train_spec

    spec = tiny_spec(tools_model, dataset=str(OPENAI), max_steps=2, max_length=1024, per_device_train_batch_size=2)
    assert not check(spec, device=cpu_facts()).problems
    result = train_spec(spec, tmp_path / "out", device=CPU)
    seen = [e["loss"] for e in result.log_history if "loss" in e]
    assert len(seen) == 2 and all(math.isfinite(x) for x in seen), seen
    # trl rendered the rows with their tools: the 4 rows it trained on hold more tokens than any 4 without them
    train = load_data(spec).train
    tokenizer = _tokenizer(tools_model)
    with_tools = sorted(measure(train, tokenizer, Trainer.SFT).lengths[:, 0])
    without = sorted(measure(train.remove_columns("tools"), tokenizer, Trainer.SFT).lengths[:, 0])
    tokens = [e["num_tokens"] for e in result.log_history if "num_tokens" in e][-1]
    assert sum(with_tools[:4]) <= tokens and tokens > sum(without[-4:]), (tokens, with_tools, without)


@pytest.mark.integration
def test_preference_rows_with_tools_train_with_dpo(tools_model: Path, tmp_path: Path) -> None:
    """The DPO demo's shape with a tool call and its result in the context, and a `tools` column."""
    from training_helpers import tiny_spec

    from jobs.train.training import train_spec

    tools = json.dumps([{"name": "area", "description": "Area of a rectangle", "parameters": {"type": "object"}}])
    rows = [
        {
            "conversations": [
                {"from": "human", "value": f"Area of a {w} by {h} rectangle?"},
                {"from": "function_call", "value": json.dumps({"name": "area", "arguments": {"w": w, "h": h}})},
                {"from": "observation", "value": str(w * h)},
            ],
            "chosen": {"from": "gpt", "value": f"It is {w * h}."},
            "rejected": {"from": "gpt", "value": f"It is {w * h + 1}."},
            "tools": tools,
        }
        for w, h in ((2, 3), (4, 5), (6, 7), (8, 9))
    ]
    (tmp_path / "pref.json").write_text(json.dumps(rows))
    spec = tiny_spec(
        tools_model,
        trainer="dpo",
        dataset=str(tmp_path / "pref.json"),
        max_steps=2,
        max_length=512,
        per_device_train_batch_size=2,
    )
    assert not check(spec, device=cpu_facts()).problems
    result = train_spec(spec, tmp_path / "out", device=CPU)
    seen = [e["loss"] for e in result.log_history if "loss" in e]
    assert len(seen) == 2 and all(math.isfinite(x) for x in seen), seen


TRL_TEMPLATES = Path(__import__("trl").__file__).parent / "chat_templates"


@pytest.mark.parametrize(
    "name,ignored",
    [
        ("qwen2_5.jinja", []),
        ("qwen3.jinja", []),
        ("llama3_1.jinja", []),
        ("llama3.jinja", ["`tools`", "`tool_calls`"]),
        ("gemma3.jinja", ["`tools`", "`tool_calls`", "`tool` turns"]),
    ],
)
def test_the_probe_reads_real_templates(name: str, ignored: list[str], tiny_model: Path) -> None:
    """The chat templates of well-known models, as trl ships them: the probe tells which render tools."""
    if not (TRL_TEMPLATES / name).is_file():
        pytest.skip(f"this trl ships no {name}")
    tokenizer = _tokenizer(tiny_model)
    tokenizer.chat_template = (TRL_TEMPLATES / name).read_text()
    assert ignored_tool_parts(tokenizer) == ignored


def test_a_template_that_fails_on_object_arguments_is_named(tiny_model: Path) -> None:
    tokenizer = _tokenizer(tiny_model)
    tokenizer.chat_template = (
        "{%- for m in messages %}{%- for c in m['tool_calls'] or [] %}{{- c['function']['arguments'] + '' }}"
        "{%- endfor %}{{- m['content'] }}{%- endfor %}"
    )
    (found,) = ignored_tool_parts(tokenizer)
    assert found.startswith("`tool_calls` whose `arguments` are objects (rendering fails:")


def test_rows_a_tools_template_refuses_are_named(tiny_model: Path) -> None:
    """Llama 3.1's template renders tools but refuses parallel calls: row 3 calls two tools in one turn."""
    if not (TRL_TEMPLATES / "llama3_1.jinja").is_file():
        pytest.skip("this trl ships no llama3_1.jinja")
    tokenizer = _tokenizer(tiny_model)
    tokenizer.chat_template = (TRL_TEMPLATES / "llama3_1.jinja").read_text()
    info = check_dataset(str(OPENAI), Trainer.SFT)
    assert [n for n, _, _ in info.tools.samples] == [1, 2, 3, 5, 6]
    problem = tools_refusal(JobSpec(model="llama-3.1"), "dataset", info, lambda: tokenizer)
    assert problem is not None and problem.problem == (
        "row 3 has tool calls that llama-3.1's chat template refuses (This model only supports single tool-calls at once!)"
    )
    assert "one call per assistant turn" in problem.fix
