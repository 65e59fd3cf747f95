"""Tool-calling rows against the model's chat template, before queueing.

Tool-calling rows (`jobs.data.tool_turns`) train only through a template that renders the `tools`
schemas, the assistant's `tool_calls` and the tool turns' results. A probe conversation (one schema,
one call, its result) is rendered with the model's template; what of it does not show in the text is
what the template ignores, and the rows would train without it: they are refused, naming how many.
Where the template renders tools, the rows the data check kept aside (the first with tool calls, the
first with parallel calls) are rendered too: a template may refuse some (Llama 3.1's: "This model only
supports single tool-calls at once!"), which would otherwise only fail when training starts. trl's
orpo and cpo trainers do not hand `tools` to the template at all.

    problem = tools_refusal(spec, "dataset", info, tokenizer)     # tokenizer(): the local one, or None
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobs.data.row_numbers import rows_text
from jobs.data.tool_turns import ToolRows, parse_tools
from jobs.errors import Problem
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo  # imports `datasets` (seconds): for the types only

PROBE_TOOL = "tunedeck_probe_lookup"
PROBE_ARGUMENT, PROBE_RESULT = "probe-argument-4711", "probe-result-0815"
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": PROBE_TOOL,
            "description": "Looks a key up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]
PROBE_CALL = [
    {"role": "user", "content": "Look it up."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": PROBE_TOOL, "arguments": {"key": PROBE_ARGUMENT}}}],
    },
    {"role": "tool", "name": PROBE_TOOL, "content": PROBE_RESULT},
    {"role": "assistant", "content": "Found it."},
]


def ignored_tool_parts(tokenizer: Any) -> list[str]:
    """What of a tool-calling conversation the tokenizer's chat template leaves out of the text: `tools` (the
    schemas), `tool_calls` (the calls and their arguments), `tool` turns (the results); [] when it renders all."""
    from jinja2 import TemplateError

    if not getattr(tokenizer, "chat_template", None):
        return ["`tools`", "`tool_calls`", "`tool` turns"]
    try:
        called = tokenizer.apply_chat_template(PROBE_CALL, tools=PROBE_TOOLS, tokenize=False)
        listed = tokenizer.apply_chat_template([PROBE_CALL[0], PROBE_CALL[-1]], tools=PROBE_TOOLS, tokenize=False)
    except TemplateError:  # the template refuses a tool turn or a call (its raise_exception)
        return ["`tools`", "`tool_calls`", "`tool` turns"]
    except TypeError as exc:  # e.g. DeepSeek-V3's adds `arguments` to text: it takes them as JSON text only
        return [f"`tool_calls` whose `arguments` are objects (rendering fails: {str(exc)[:80]})"]
    missing = [("`tools`", PROBE_TOOL in listed), ("`tool_calls`", PROBE_ARGUMENT in called)]
    missing.append(("`tool` turns", PROBE_RESULT in called))
    return [part for part, shown in missing if not shown]


def tools_refusal(spec: JobSpec, field: str, info: DatasetInfo, tokenizer: Callable[[], Any]) -> Problem | None:
    """A problem when `info`'s tool-calling rows would train without their tools: the trainer does not pass
    them, or the model's template (`tokenizer()`: None when its files are not here) ignores them."""
    found = info.tools
    if not found.count or record_for(spec.trainer).generates:
        return None  # grpo takes its tools from the trainer; a row's `tools` goes to the reward functions
    rows = rows_text(found.numbers, found.count)
    if not record_for(spec.trainer).renders_tools:
        return Problem(
            field,
            f"has tool-calling rows, but trl's {Trainer(spec.trainer).value} trainer renders rows without `tools`: "
            f"{rows} would train without their tool schemas",
            "use trainer: dpo (or kto, reward), which pass `tools` to the chat template, or drop the `tools` column",
        )
    loaded = tokenizer()
    if loaded is None or not getattr(loaded, "chat_template", None):
        return None  # files not on this machine: nothing to render with; no template: the chat check says so
    ignored = ignored_tool_parts(loaded)
    if not ignored:
        return refused_rows(spec.model, field, found, loaded)
    return Problem(
        field,
        f"the chat template of {spec.model} ignores {' and '.join(ignored)}: {rows} would train without "
        "their tool calls",
        "use a model whose chat template supports tools (Qwen2.5/Qwen3, Llama 3.1+, Mistral instruct), or give the "
        "model a chat_template that renders `tools` and `tool_calls` (tokenizer_config.json or chat_template.jinja), "
        "or drop the tool turns and the `tools` column",
    )


def refused_rows(model: str, field: str, found: ToolRows, tokenizer: Any) -> Problem | None:
    """A problem naming the kept tool rows the model's template refuses to render; None when it renders them."""
    from jinja2 import TemplateError

    refused: list[int] = []
    reason = ""
    for number, conversation, tools in found.samples:
        try:
            tokenizer.apply_chat_template(conversation, tools=parse_tools(tools)[0], tokenize=False)
        except TemplateError as exc:  # the template's raise_exception; anything else is a bug and surfaces
            refused.append(number)
            reason = reason or str(exc).strip().splitlines()[0][:200]
    if not refused:
        return None
    return Problem(
        field,
        f"{rows_text(refused)} {'have' if len(refused) > 1 else 'has'} tool calls that {model}'s chat template refuses ({reason})",
        "split parallel calls into one call per assistant turn (each followed by its tool turn), drop those rows, "
        "or pick a model whose chat template accepts them",
    )
