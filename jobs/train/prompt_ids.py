"""A sample prompt (`Prompt`: the text shown and the chat turns the model sees) and its token ids, the way the
before/after samples, the export's checks and a judge's questions encode them: chat turns through the chat template
with the generation prompt, else the raw text.

    ids = encode(tokenizer, "Why is the sky blue?")["input_ids"]      # a typed text is one user turn
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One prompt: the text shown, and the chat turns the model sees (None: `text` is continued as is); a
    vision-language run's held-out image row keeps its pictures (`jobs.train.sample_images`)."""

    text: str
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) turns ending before the answer
    images: tuple[str, ...] = ()  # PNGs in the run's samples/ folder, one per `<image>` in the turns, in order

    @classmethod
    def typed(cls, text: str) -> Prompt:
        return cls(text, (("user", text),))

    def chat(self) -> list[dict[str, str]] | None:
        return [{"role": r, "content": c} for r, c in self.messages] if self.messages is not None else None


def as_prompt(value: Any) -> Prompt:
    return value if isinstance(value, Prompt) else Prompt.typed(str(value))


def encode(tokenizer: Any, prompt: Prompt | str) -> dict[str, Any]:
    """Token ids of a prompt: chat turns through the chat template (with the generation prompt), else raw text."""
    prompt = as_prompt(prompt)
    chat = prompt.chat()
    if chat is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    text = "\n".join(c for _, c in prompt.messages) if prompt.messages else prompt.text
    return tokenizer(text, return_tensors="pt")
