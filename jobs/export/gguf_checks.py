"""What a GGUF file's check records, and the agreement each type must reach (shared by both writers' checks).

GgufCheck(...)            # the file loaded back vs the model it was written from, saved as <file>.check.json
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# f16 of a converted tiny random model: 100% on llama and qwen3 (tests/test_gguf_families.py);
F16_FORCED_AGREEMENT = 0.95
# a family llama.cpp reads differently falls far below: Mistral with a 32-token sliding window 82%, Gemma 3 with
# query_pre_attn_scalar 256 over a head width of 16: 48%


K_FORCED_AGREEMENT = 0.75  # K-quants (4 to 6 bits), measured on SmolLM2-135M as shipped (bench/gguf_quants.py),
# transformers / llama.cpp: q4_k_m 86.4% / 86.4%, q5_k_m 83.8% / 83.1%, q6_k 98.1% / 95.5% (q8_0: 98.7% / 97.4%)
Q8_0_FORCED_AGREEMENT = 0.9  # measured on SmolLM2-135M: 98.7% as shipped, 96.8% after a 2-step LoRA run (their
# free-running answers: 73% and 70% of positions); a misplaced tensor or a wrong rotary layout gives far less
TOKENIZER_TEXTS = (
    "Tell me about volcanoes.",
    "Prices: 12345 or 3.14, maybe 1,000,000?",
    "  two  spaces,\ttabs\nand\n\nnew lines  ",
    "café, naïve, Straße, 東京, emoji 🙂",
    "<|im_start|>user\nHi<|im_end|>\n",
)


@dataclass
class GgufCheck:
    """The GGUF file loaded back vs the model it was written from."""

    gguf_type: str
    rule: str
    prompts: list[str]
    source_answers: list[str]
    gguf_answers: list[str]
    token_agreement: float  # free-running: share of answer positions holding the same token
    forced_agreement: (
        float  # fed the source's answers: share of positions where the GGUF model picks the same next token
    )
    max_logit_diff: float
    tokenizer_texts: list[str]
    tokenizer_mismatches: list[str]  # texts (and the chat prompts) whose ids differ
    chat_template_equal: bool
    passed: bool
    tensor_types: dict[str, int]  # storage type -> tensors of the file (llama.cpp falls back on short rows)
    llama_cpp: dict[str, Any] | None = None  # the file read back by llama.cpp itself (None: not installed here)
    imatrix: dict[str, Any] | None = None  # what its importance matrix was made of (`jobs.export.imatrix`), if any
    mmproj: dict[str, Any] | None = (
        None  # a vision-language model's projector file, read back (`jobs.export.projector`)
    )


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The file's chat template and special token ids, as llama.cpp reads them."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    out: dict[str, Any] = {}
    for key in ("tokenizer.chat_template", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        field = fields.get(key)
        if field is not None:
            out[key] = field.contents()
    return out


def check_with_llama_cpp(source: Path, gguf_path: Path, gguf_type: str) -> Any:
    """A converted file against the model folder it was written from, read by llama.cpp (a `GgufCheck`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.export.llamacpp import QUANTS, llama_read_back, tensor_types
    from jobs.export.merged import CHECK_NEW_TOKENS, CHECK_PROMPTS, token_agreement
    from jobs.train.before_after import encode, greedy

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    ids_a, _ = greedy(model, tokenizer, CHECK_PROMPTS, CHECK_NEW_TOKENS)
    prompts = [encode(tokenizer, p)["input_ids"][0].tolist() for p in CHECK_PROMPTS]
    reference = []  # the source's logits where llama.cpp is asked the same: each answer's positions
    for prompt, answer in zip(prompts, ids_a):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + answer])).logits[0]
        reference.append(logits[len(prompt) - 1 : len(prompt) - 1 + len(answer)].numpy())
    del model
    llama = llama_read_back(gguf_path, tokenizer, list(TOKENIZER_TEXTS), prompts, ids_a, CHECK_NEW_TOKENS, reference)
    meta = gguf_metadata(gguf_path)
    mismatches = [f"llama.cpp: {t}" for t in llama.tokenizer_mismatches]
    chat_same = (tokenizer.chat_template or None) == meta.get("tokenizer.chat_template")
    eos = tokenizer.eos_token_id
    if eos is not None and eos not in (
        meta.get("tokenizer.ggml.eos_token_id"),
        meta.get("tokenizer.ggml.eot_token_id"),
    ):
        mismatches.append(
            f"end-of-sequence token: the run's {eos}, the file's {meta.get('tokenizer.ggml.eos_token_id')}"
        )
    least = (
        K_FORCED_AGREEMENT
        if gguf_type in QUANTS
        else {"f16": F16_FORCED_AGREEMENT}.get(gguf_type, Q8_0_FORCED_AGREEMENT)
    )
    rule = (
        f"read by llama.cpp: next-token agreement on the source's answers >= {least:.0%}; tokenizer ids, chat "
        "template and end-of-sequence token identical (written by llama.cpp's convert_hf_to_gguf.py)"
    )
    answers_b = llama.answers or []
    decode = tokenizer.decode
    passed = llama.forced_agreement >= least and not mismatches and chat_same
    return GgufCheck(
        gguf_type,
        rule,
        list(CHECK_PROMPTS),
        [str(decode(a, skip_special_tokens=True)).strip() for a in ids_a],
        [str(decode(b, skip_special_tokens=True)).strip() for b in answers_b],
        token_agreement(ids_a, answers_b),
        llama.forced_agreement,
        llama.max_logit_diff or 0.0,
        list(TOKENIZER_TEXTS),
        mismatches,
        chat_same,
        passed,
        tensor_types(gguf_path),
        asdict(llama),
    )
