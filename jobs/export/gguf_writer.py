"""Write a transformers model folder as one GGUF file (llama.cpp's format), f16 or q8_0.

    plan = folder_plan(folder)               # refuses what it cannot describe, before any weight is read
    write_gguf(folder, dest, "q8_0", "My model")

Only what tunedeck's models are made of is described: decoder-only Llama and Qwen2 models with a
byte-level BPE tokenizer (SmolLM2, the tiny test models, Qwen2/2.5). Everything else is refused
with the architecture named and the way out (the merged safetensors export and llama.cpp's own
converter). The `gguf` package (llama.cpp's gguf-py) supplies the writer, the tensor-name tables,
the q8_0 quantizer and the reader of the tokenizer's special tokens, merges and chat template;
this module decides what goes in:

- `general.architecture` and the `<arch>.*` hyper-parameters llama.cpp reads (context length,
  widths, layers, heads, rope base and dimension, RMS-norm epsilon, vocabulary size), the file
  type and the quantization version;
- the tokenizer as llama.cpp stores it: `tokenizer.ggml.model = "gpt2"` (byte-level BPE), the
  pre-tokenizer's name (which split rule runs before the merges), every token with its type
  (normal, control for special added tokens, user-defined for other added ones, unused padding),
  the merges, the special token ids, whether BOS is prepended, and the chat template;
- the weights under GGUF tensor names; a Llama's query and key rows are reordered into the
  interleaved rotary layout llama.cpp uses; one-dimensional tensors (norms, biases) stay f32;
  q8_0 quantizes every matrix whose rows split into 32-value blocks (others stay f16).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("jobs.export.merged")

GGUF_TYPES = ("f16", "q8_0")


@dataclass(frozen=True)
class ArchRule:
    gguf_arch: str  # general.architecture in the file
    permute_qk: bool  # llama.cpp's Llama reorders query/key rows for its rotary layout


# transformers model_type -> how it is written. Others are refused.
ARCHS = {"llama": ArchRule("llama", True), "qwen2": ArchRule("qwen2", False)}
# Split rules that llama.cpp names and transformers rebuilds from the name (byte-level BPE only).
PRE_TOKENIZER_NAMES = ("llama-bpe", "qwen2", "gpt-4o")


@dataclass(frozen=True)
class GgufPlan:
    """What a folder will be written as: decided from config.json and tokenizer.json alone."""

    model_type: str
    rule: ArchRule
    config: dict[str, Any]
    pre_tokenizer: str
    tokenizer_json: dict[str, Any]


class GgufUnsupported(ValueError):
    """The folder holds something this writer does not describe; the message says what and the way out."""


WAY_OUT = (
    "export the merged safetensors (`tunedeck export ID --merged`) and convert that folder with "
    "llama.cpp's own convert_hf_to_gguf.py"
)


def _pre_tokenizer_name(tok: dict[str, Any]) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenization, or GgufUnsupported."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    model, pre = tok.get("model") or {}, tok.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or (tok.get("decoder") or {}).get("type") != "ByteLevel" or tok.get("normalizer"):
        raise GgufUnsupported(
            f"the tokenizer is not a plain byte-level BPE (model {model.get('type')!r}, "
            f"decoder {(tok.get('decoder') or {}).get('type')!r}); only those are written, "
            f"so {WAY_OUT}"
        )
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"  # GPT-2's split rule, built into ByteLevel
    parts = pre.get("pretokenizers") or []
    if (
        pre.get("type") == "Sequence"
        and len(parts) == 2
        and parts[0].get("type") == "Split"
        and parts[1].get("type") == "ByteLevel"
        and not parts[1].get("use_regex", True)
    ):
        pattern = (parts[0].get("pattern") or {}).get("Regex")
        for name in PRE_TOKENIZER_NAMES:
            if GGUF_PRE_TOKENIZER_SPLITS.get(name) == pattern:
                return name
    raise GgufUnsupported(
        f"the tokenizer's pre-tokenizer ({json.dumps(pre)[:120]}) is not one with a GGUF name "
        f"tunedeck knows (gpt-2, {', '.join(PRE_TOKENIZER_NAMES)}); {WAY_OUT}"
    )


def gguf_plan(config: dict[str, Any], tokenizer_json: dict[str, Any]) -> GgufPlan:
    """Check that a model (config.json) and tokenizer (tokenizer.json) can be written as GGUF, or GgufUnsupported."""
    model_type = config.get("model_type", "?")
    if model_type not in ARCHS:
        raise GgufUnsupported(
            f"architecture {model_type!r} ({', '.join(config.get('architectures') or [])}) is not "
            f"one tunedeck writes as GGUF (it writes {', '.join(sorted(ARCHS))}); {WAY_OUT}"
        )
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
        raise GgufUnsupported(
            f"this {model_type} model uses {scaling.get('rope_type', scaling.get('type'))} rope "
            f"scaling, which tunedeck's GGUF writer does not describe; {WAY_OUT}"
        )
    if model_type == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise GgufUnsupported(
            f"this llama model has attention or MLP biases, which transformers' GGUF loader "
            f"would drop (so the round trip cannot be checked); {WAY_OUT}"
        )
    if model_type == "qwen2" and config.get("use_sliding_window"):
        raise GgufUnsupported(
            f"this qwen2 model uses sliding-window attention, which tunedeck's GGUF writer does not describe; {WAY_OUT}"
        )
    return GgufPlan(model_type, ARCHS[model_type], config, _pre_tokenizer_name(tokenizer_json), tokenizer_json)


def tokenizer_json(folder: Path) -> dict[str, Any]:
    """The fast tokenizer's tokenizer.json in `folder`, or GgufUnsupported."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise GgufUnsupported(f"{folder} has no tokenizer.json (a fast tokenizer is needed); {WAY_OUT}")
    return json.loads(path.read_text())


def folder_plan(folder: Path) -> GgufPlan:
    """`gguf_plan` of a model folder."""
    return gguf_plan(json.loads((folder / "config.json").read_text()), tokenizer_json(folder))


def _vocabulary(plan: GgufPlan, n_vocab: int) -> tuple[list[str], list[int]]:
    """Tokens by id with llama.cpp's token types; ids the tokenizer lacks become unused [PADn]."""
    from gguf import TokenType

    by_id: dict[int, tuple[str, int]] = {
        i: (t, TokenType.NORMAL) for t, i in plan.tokenizer_json["model"]["vocab"].items()
    }
    for added in plan.tokenizer_json.get("added_tokens") or []:
        by_id[added["id"]] = (added["content"], TokenType.CONTROL if added.get("special") else TokenType.USER_DEFINED)
    size = max(n_vocab, max(by_id) + 1)
    tokens = [by_id.get(i, (f"[PAD{i}]", TokenType.UNUSED)) for i in range(size)]
    return [t for t, _ in tokens], [int(k) for _, k in tokens]


def _adds_bos(folder: Path) -> bool:
    """Whether the tokenizer puts its BOS token in front of plain text (llama.cpp's add_bos_token)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer("hello")["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def _permute_qk(w: Any, heads: int) -> Any:
    """Rows of each head from halves (transformers' rotary layout) to interleaved pairs (llama.cpp's)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(name: str, array: Any, gguf_type: str) -> tuple[Any, Any]:
    """(data, raw dtype) of one tensor: f32 for vectors, f16 or q8_0 for matrices."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    if array.ndim <= 1 or name.endswith("_norm.weight"):
        return array.astype(np.float32), None
    if gguf_type == "q8_0" and array.shape[-1] % 32 == 0:
        return quants.quantize(array.astype(np.float32), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
    return array.astype(np.float16), None


def write_gguf(folder: Path, dest: Path, gguf_type: str, name: str) -> Path:
    """Write the model in `folder` (config, safetensors, tokenizer) to `dest` as `gguf_type` GGUF."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    if gguf_type not in GGUF_TYPES:
        raise GgufUnsupported(f"GGUF type {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}")
    plan = folder_plan(folder)
    cfg = plan.config
    heads, kv_heads, hidden = (
        cfg["num_attention_heads"],
        cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        cfg["hidden_size"],
    )
    head_dim = cfg.get("head_dim") or hidden // heads
    layers = cfg["num_hidden_layers"]
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == plan.rule.gguf_arch)
    names = gguf.get_tensor_name_map(arch, layers)
    writer = gguf.GGUFWriter(str(dest), plan.rule.gguf_arch)
    writer.add_type("model")
    writer.add_name(name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(
        float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    )
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if gguf_type == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, types = _vocabulary(plan, cfg["vocab_size"])
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(plan.pre_tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens))
    special.add_special_token["bos"] = _adds_bos(folder)
    special.add_to_gguf(writer, quiet=True)

    files = sorted(folder.glob("*.safetensors"))
    tied = cfg.get("tie_word_embeddings", False)
    count = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if tied and key == "lm_head.weight":
                    continue  # the embedding matrix serves as the output layer too
                stem, _, suffix = key.rpartition(".")
                gguf_name = names.get_name(stem)
                if gguf_name is None:
                    raise GgufUnsupported(f"weight {key!r} has no GGUF name for {plan.model_type}; {WAY_OUT}")
                array = handle.get_tensor(key).float().numpy()
                if plan.rule.permute_qk and stem.endswith("self_attn.q_proj"):
                    array = _permute_qk(array, heads)
                elif plan.rule.permute_qk and stem.endswith("self_attn.k_proj"):
                    array = _permute_qk(array, kv_heads)
                full = f"{gguf_name}.{suffix}"
                data, raw = _encode(full, array, gguf_type)
                writer.add_tensor(full, np.ascontiguousarray(data), raw_dtype=raw)
                count += 1
    log.info("GGUF %s: %d tensors, %d tokens, pre-tokenizer %s", gguf_type, count, len(tokens), plan.pre_tokenizer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest
