"""llama.cpp itself, through its Python binding: its K-quants, and every GGUF read back by it.

    problem = llama_cpp_problem()                     # None, or why K-quants cannot be made here
    quantize(f16_file, dest, "q4_k_m")                # llama.cpp's own quantizer (llama_model_quantize)
    types = tensor_types(dest)                        # {"Q4_K": 9, "Q6_K": 2, "Q8_0": 7, "F32": 5}
    read = llama_read_back(dest, tokenizer, prompts, answers)   # LlamaReadBack: what llama.cpp answered

The binding (`llama-cpp-python`) has no wheel on PyPI: pip builds llama.cpp from its source (`./dev.sh gguf`
builds only the library it loads, in minutes), so it is optional. Without it f16 and q8_0 files are
still written (by `jobs.export.gguf_writer`) and checked through transformers' GGUF loader; K-quants are
refused before they are queued, naming that fix.

K-quants work on rows of 256 values: llama.cpp writes a tensor whose rows are shorter in a fallback
type of its choosing (q5_0, q8_0, ...), so `tensor_types` is recorded with each file: a small model's
"Q4_K_M" may hold few or no 4-bit tensors, and its card says so.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# tunedeck's name -> llama.cpp's file type (LLAMA_FTYPE_MOSTLY_<name>)
K_QUANTS = {"q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K"}
IQ_QUANTS = {"iq4_xs": "IQ4_XS"}  # always made with an importance matrix (`jobs.export.imatrix`)
QUANTS = {**K_QUANTS, **IQ_QUANTS}  # every type llama.cpp's quantizer makes from an f16 file
EXPORT_TYPES = ("f16", "q8_0", *QUANTS)  # what `--gguf` takes: tunedeck's own writer's two, then llama.cpp's
LLAMA_CPP_FIX = (
    "install llama.cpp's Python binding where the worker runs: `./dev.sh gguf` builds llama-cpp-python from "
    "source (no GPU needed; minutes), or pick f16 or q8_0, which need no llama.cpp"
)


def llama_cpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_problem(gguf_type: str) -> str | None:
    """Why `gguf_type` cannot be written here (None: it can)."""
    if gguf_type in QUANTS and not llama_cpp_installed():
        return f"GGUF {gguf_type} is made by llama.cpp's quantizer, and llama-cpp-python is not installed here"
    return None


def quantize(source: Path, dest: Path, gguf_type: str, threads: int = 0) -> None:
    """Write `dest` as llama.cpp's `gguf_type` quantization of the f16/f32 GGUF file `source`."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{K_QUANTS[gguf_type]}")
    params.nthread = threads  # 0: llama.cpp picks
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if code != 0 or not dest.is_file():
        raise RuntimeError(f"llama.cpp's quantizer returned {code} for {gguf_type} (its log above says why)")


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of the GGUF file hold each storage type, most first."""
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors)
    return dict(counts.most_common())


@dataclass
class LlamaReadBack:
    """The GGUF file as llama.cpp reads it, beside the source model's tokenizer and answers."""

    version: str
    tokenizer_mismatches: list[str]  # texts whose ids llama.cpp's tokenizer gives differently
    forced_agreement: float  # fed the source's answers: share of positions where llama.cpp picks the same token
    answers: list[list[int]] | None = None  # llama.cpp's own greedy answers (asked with `new_tokens`)
    max_logit_diff: float | None = None  # against `reference` logits of the same positions (when given)


def llama_read_back(
    path: Path,
    tokenizer: Any,
    texts: list[str],
    prompts: list[list[int]],
    answers: list[list[int]],
    new_tokens: int = 0,
    reference: list[Any] | None = None,
) -> LlamaReadBack:
    """Load `path` in llama.cpp; tokenize `texts` with it; feed each prompt + the source's answer and count the
    positions where its next token is the answer's (`prompts`: token ids as the source model was fed them); with
    `new_tokens`, also answer each prompt greedily; with `reference` (per prompt, the source's logits at the answer's
    positions), the largest difference from llama.cpp's."""
    import llama_cpp
    import numpy as np

    longest = max((len(p) + len(a) for p, a in zip(prompts, answers)), default=1)
    longest = max(longest, max((len(p) for p in prompts), default=0) + new_tokens)
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=max(64, longest + 8), verbose=False, seed=0)
    greedy: list[list[int]] = []
    diff = 0.0
    try:
        mismatches = [
            t
            for t in texts
            if llm.tokenize(t.encode(), add_bos=False, special=True)
            != tokenizer(t, add_special_tokens=False)["input_ids"]
        ]
        agree = total = 0
        for i, (prompt, answer) in enumerate(zip(prompts, answers)):
            if new_tokens:
                greedy.append(_greedy(llm, prompt, new_tokens))
            if not answer:
                continue
            llm.reset()
            llm.eval(prompt + answer)
            start = len(prompt) - 1
            scores = np.asarray(llm.scores[start : start + len(answer)])
            agree += int((scores.argmax(-1) == np.asarray(answer)).sum())
            total += len(answer)
            if reference is not None:
                ref = np.asarray(reference[i])
                n, w = min(len(ref), len(scores)), min(ref.shape[-1], scores.shape[-1])
                diff = max(diff, float(np.abs(ref[:n, :w] - scores[:n, :w]).max()))
    finally:
        llm.close()
    return LlamaReadBack(
        llama_cpp.__version__,
        mismatches,
        agree / total if total else 1.0,
        greedy if new_tokens else None,
        diff if reference is not None else None,
    )


def _greedy(llm: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """llama.cpp's greedy answer to `prompt` (token ids), stopping at its end-of-generation token."""
    import numpy as np

    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    for _ in range(new_tokens):
        token = int(np.asarray(llm.scores[llm.n_tokens - 1]).argmax())
        out.append(token)  # like transformers' generate: the end-of-sequence token ends the answer, included
        if token == llm.token_eos():
            break
        llm.eval([token])
    return out
