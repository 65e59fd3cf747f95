"""The Ollama Modelfile of a GGUF export: the run's Jinja chat template cut into Ollama's TEMPLATE pieces."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from jobs.export.modelfile import modelfile, ollama_template, template_pieces

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Tell me about the moon."},
]
# SmolLM2's kind of template: a system prompt of its own when the conversation has none
DEFAULT_SYSTEM = (
    "{%- if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_the_pieces_write_what_the_runs_template_writes(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    pieces = template_pieces(tokenizer)
    assert pieces is not None and pieces.default_system is None
    expected = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert pieces.render(CONVERSATION) == expected
    assert pieces.user == ("<|im_start|>user\n", "<|im_end|>\n") and pieces.generation == "<|im_start|>assistant\n"
    text, templated = modelfile(tokenizer, "run-1-q8_0.gguf", {"temperature": 0.7})
    assert templated and text.startswith("FROM ./run-1-q8_0.gguf\n")
    assert f'TEMPLATE """{ollama_template(pieces)}"""' in text and "{{-" not in ollama_template(pieces)[20:]
    assert 'PARAMETER stop """<|im_end|>"""' in text and "PARAMETER temperature 0.7" in text


def test_a_system_prompt_the_template_adds_becomes_system(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    tokenizer.chat_template = DEFAULT_SYSTEM
    pieces = template_pieces(tokenizer)
    assert pieces is not None and pieces.default_system == "You are a helpful assistant."
    assert 'SYSTEM """You are a helpful assistant."""' in modelfile(tokenizer, "x.gguf")[0]


def test_a_template_that_does_not_cut_into_pieces_gets_no_template(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    # the last user message is written differently from the earlier ones: no per-role pieces write this
    tokenizer.chat_template = (
        "{%- for m in messages %}{%- if loop.last %}[LAST]{% endif %}{{ m['role'] }}: {{ m['content'] }}\n"
        "{%- endfor %}{%- if add_generation_prompt %}assistant:{%- endif %}"
    )
    assert template_pieces(tokenizer) is None
    text, templated = modelfile(tokenizer, "x.gguf")
    assert not templated and "TEMPLATE" not in text and "PARAMETER stop" in text


def test_a_vision_language_models_modelfile_names_its_projector_in_a_second_from(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    text, templated = modelfile(tokenizer, "run-1-q4_k_m.gguf", projector="run-1-mmproj-f16.gguf")
    assert templated and text.splitlines()[:3] == [
        "FROM ./run-1-q4_k_m.gguf",
        "FROM ./run-1-mmproj-f16.gguf",
        text.splitlines()[2],
    ]
    assert text.splitlines()[2].startswith("TEMPLATE ") and text.count("FROM ") == 2
    assert modelfile(tokenizer, "run-1-q4_k_m.gguf")[0].count("FROM ") == 1  # a text model: one file
