"""An Ollama `Modelfile` for an exported GGUF: the run's chat template as Ollama's TEMPLATE, stop tokens, sampling.

    text = modelfile(tokenizer, "run-3-q8_0.gguf", generation={"temperature": 0.0})
    # ollama create my-model -f run-3-q8_0.Modelfile

Ollama's templates are Go templates, the run's chat template is Jinja; there is no general translation.
Instead the run's own template is rendered (with the run's tokenizer) on a conversation of marker texts,
one message longer each time, and cut at the markers into what comes before and after a system, a user
and an assistant message, and what opens the answer. A system prompt the template puts in by itself
when there is none (SmolLM2's does) becomes the Modelfile's SYSTEM. The pieces are checked: joined, they
must give the run's template's own text for a four-message conversation; a template that does not split
that way (one that renders earlier messages differently as the conversation grows) gets no TEMPLATE and
the card says so (Ollama then uses the file's embedded template where it knows it). Stop tokens: what
closes an assistant message, and the tokenizer's end-of-sequence token. Pure: a tokenizer in, text out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MARK = "\u2063{}\u2063"  # invisible separators around each marker text, so no template text contains one


@dataclass(frozen=True)
class Pieces:
    """What the chat template writes around each role's content, and what opens the answer."""

    system: tuple[str, str]
    user: tuple[str, str]
    assistant: tuple[str, str]
    generation: str
    default_system: str | None

    def render(self, messages: list[dict[str, str]]) -> str:
        """The conversation as these pieces write it, with the answer opened (what the Go template does)."""
        out = []
        for m in messages:
            before, after = getattr(self, m["role"])
            out.append(before + m["content"] + after)
        return "".join(out) + self.generation


def _render(tokenizer: Any, messages: list[dict[str, str]], generation: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def _strip_bos(tokenizer: Any, texts: list[str]) -> list[str]:
    """The renders without a leading BOS (llama.cpp adds it itself), unless the template uses that token as a
    turn marker too (ChatML models whose BOS is <|im_start|>): then it stays part of every turn."""
    bos = tokenizer.bos_token or ""
    if not bos or not all(t.startswith(bos) for t in texts) or any(t.count(bos) > 1 for t in texts):
        return texts
    return [t[len(bos) :] for t in texts]


def _split(block: str, mark: str) -> tuple[str, str] | None:
    before, found, after = block.partition(mark)
    return (before, after) if found else None


def template_pieces(tokenizer: Any) -> Pieces | None:
    """The run's chat template cut into per-role pieces, or None when it does not cut that way."""
    s, u, a, u2 = (MARK.format(x) for x in ("system", "user", "assistant", "again"))
    convo = [{"role": "system", "content": s}, {"role": "user", "content": u}, {"role": "assistant", "content": a}]
    try:
        rendered = [_render(tokenizer, convo[: i + 1]) for i in range(3)] + [
            _render(tokenizer, convo[:2], generation=True),
            _render(tokenizer, [{"role": "user", "content": u}]),
            _render(tokenizer, [*convo, {"role": "user", "content": u2}], generation=True),
        ]
    except Exception:  # noqa: BLE001 - a template that refuses a system role (or anything): no TEMPLATE
        return None
    *texts, generation_text, alone, full = _strip_bos(tokenizer, rendered)
    if not (texts[1].startswith(texts[0]) and texts[2].startswith(texts[1]) and generation_text.startswith(texts[1])):
        return None
    system, user = _split(texts[0], s), _split(texts[1][len(texts[0]) :], u)
    assistant = _split(texts[2][len(texts[1]) :], a)
    if system is None or user is None or assistant is None:
        return None
    default = None
    if alone != user[0] + u + user[1]:  # the template put a system message in by itself
        head = alone[: alone.find(user[0] + u)] if user[0] + u in alone else ""
        if head.startswith(system[0]) and head.endswith(system[1]) and head:
            default = head[len(system[0]) : len(head) - len(system[1])]
        else:
            return None
    pieces = Pieces(system, user, assistant, generation_text[len(texts[1]) :], default)
    expected = pieces.render([*convo, {"role": "user", "content": u2}])
    return pieces if expected == full else None


def _go(text: str) -> str:
    """Literal text inside a Go template: `{{` would open an action."""
    return text.replace("{{", '{{ "{{" }}')


def ollama_template(pieces: Pieces) -> str:
    """Ollama's TEMPLATE (a Go template over .Messages) writing what the pieces write; no `{{-` after text, which
    would trim the template's own newlines."""
    rows = []
    for role in ("system", "user", "assistant"):
        before, after = getattr(pieces, role)
        keyword = "if" if role == "system" else "else if"
        rows.append(f'{{{{ {keyword} eq .Role "{role}" }}}}{_go(before)}{{{{ .Content }}}}{_go(after)}')
    body = "".join(rows)
    return f"{{{{- range .Messages }}}}{body}{{{{ end }}}}{{{{ end }}}}{_go(pieces.generation)}"


def stop_tokens(tokenizer: Any, pieces: Pieces | None) -> list[str]:
    """What ends an answer: the text closing an assistant message (stripped) and the end-of-sequence token."""
    out = []
    if pieces is not None and pieces.assistant[1].strip():
        out.append(pieces.assistant[1].strip())
    if tokenizer.eos_token and tokenizer.eos_token not in out:
        out.append(tokenizer.eos_token)
    return out


def _quoted(text: str) -> str:
    return '"""' + text.replace('"""', '\\"\\"\\"') + '"""'


def modelfile(
    tokenizer: Any, gguf_name: str, generation: dict[str, Any] | None = None, projector: str | None = None
) -> tuple[str, bool]:
    """(the Modelfile's text, whether it carries the chat template as TEMPLATE).

    `generation`: sampling defaults (temperature, top_p, top_k, repeat_penalty); default greedy, like tunedeck's Chat.
    `projector`: a vision-language model's mmproj file, a second FROM (Ollama reads a `clip` GGUF as a projector)."""
    pieces = template_pieces(tokenizer) if getattr(tokenizer, "chat_template", None) else None
    lines = [f"FROM ./{gguf_name}", *([f"FROM ./{projector}"] if projector else [])]
    if pieces is not None:
        lines.append(f"TEMPLATE {_quoted(ollama_template(pieces))}")
        if pieces.default_system:
            lines.append(f"SYSTEM {_quoted(pieces.default_system)}")
    for stop in stop_tokens(tokenizer, pieces):
        lines.append(f"PARAMETER stop {_quoted(stop)}")
    for name, value in {"temperature": 0.0, "top_p": 1.0, **(generation or {})}.items():
        lines.append(f"PARAMETER {name} {value:g}")
    return "\n".join(lines) + "\n", pieces is not None
