"""The torch-free shapes of the common dense families (`jobs.memory.dense_shape`) are the meta-device build's.

Each covered family, with the config switches its code reads and with its config class's defaults (no head_dim,
no tie_word_embeddings in the config), gives the same `Arch` as building the model on the meta device, and the
same prediction for the zoo's configs; anything unusual falls back to the build; and `tunedeck plan` on a config
never seen before imports neither torch nor transformers (`bench/prediction_speed.py` times it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobs.devices.facts import DeviceFacts
from jobs.memory.dense_shape import FAMILIES, dense_arch
from jobs.models.zoo import BASE
from jobs.models.zoo import FAMILIES as ZOO
from jobs.spec.job import JobSpec

TINY = {**BASE, "vocab_size": 512}
SWITCHES: tuple[dict[str, Any], ...] = (
    {},  # the config class's defaults: head_dim, tie_word_embeddings, biases
    {"tie_word_embeddings": True},
    {"tie_word_embeddings": False},
    {"attention_bias": True},
    {"mlp_bias": True},
    {"head_dim": 24},
    {"num_key_value_heads": 4},
    {"num_key_value_heads": 1, "intermediate_size": 96},
    {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 96},  # head_dim's default: 12 or its own
    {"torch_dtype": "float32"},
    {"dtype": "bfloat16", "pad_token_id": 0},
)
GIB = 1024**3
DEVICES = (
    DeviceFacts(kind="cuda", name="24 GiB GPU", total_bytes=24 * GIB, compute_capability="8.9", bf16=True, fp16=True),
    DeviceFacts(kind="cpu", name="cpu", total_bytes=32 * GIB),
)


def built(config: dict[str, Any]) -> Any:
    """The Arch of the model built on the meta device: the path every other family takes."""
    from jobs.memory.parts import arch_from_config
    from jobs.memory.shape import transformers_config

    return arch_from_config(transformers_config(config))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_is_the_meta_device_build(family: str) -> None:
    for switches in SWITCHES:
        config = {"model_type": family, **TINY, **switches}
        fast, meta = dense_arch(config), built(config)
        assert fast is not None, (family, switches)
        assert fast.total_params == meta.total_params, (family, switches)  # the exact parameter count
        assert fast == meta, (family, switches)  # every field: parameter shapes, linears, tied head, dtype bytes
        assert fast.shape.linears == meta.shape.linears and fast.shape == meta.shape, (family, switches)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_config_json_as_save_pretrained_writes_it_takes_the_fast_path(family: str) -> None:
    from transformers import AutoConfig

    extra = ZOO[family].config if family in ZOO else {}
    config = AutoConfig.for_model(family, **{**TINY, **extra})
    for only_changes in (True, False):  # save_pretrained writes the changes from the defaults
        written = json.loads(config.to_json_string(use_diff=only_changes))
        fast = dense_arch(written)
        assert fast is not None and fast == built(written), (family, only_changes)


def test_a_real_size_config_counts_every_parameter() -> None:
    llama2_7b = dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        tie_word_embeddings=False,
        torch_dtype="float16",
    )
    qwen25_7b = dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    fast = dense_arch(llama2_7b)
    assert fast is not None and fast.total_params == 6_738_415_616  # Llama-2-7B's published count
    for config in (llama2_7b, qwen25_7b):
        assert dense_arch(config) == built(config)


COVERED_ZOO = sorted(set(ZOO) & set(FAMILIES))
METHODS = (
    {},
    {"method": "qlora"},
    {"method": "full"},
    {"method": "dora", "lora_target_modules": "all-linear"},
    {"gradient_checkpointing": True, "max_length": 2048, "per_device_train_batch_size": 4},
)


@pytest.mark.parametrize("family", COVERED_ZOO)
def test_the_zoo_families_it_covers_get_the_same_prediction(family: str) -> None:
    from jobs.memory.predict import predict

    config = {"model_type": family, **TINY, **ZOO[family].config}
    fast, meta = dense_arch(config), built(config)
    assert fast is not None
    for fields in METHODS:
        spec = JobSpec.from_dict(fields)
        for device in DEVICES:
            assert predict(spec, fast, device) == predict(spec, meta, device), (family, fields, device.kind)


def test_the_zoo_covers_most_of_the_families() -> None:
    assert len(COVERED_ZOO) >= 7, COVERED_ZOO  # llama, mistral, qwen2, qwen3, gemma2, gemma3_text, olmo2, granite


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "phi3", **TINY},  # not a covered family: fused qkv_proj
        {"model_type": "llama", **{k: v for k, v in TINY.items() if k != "intermediate_size"}},  # the default
        {"model_type": "mistral", **{k: v for k, v in TINY.items() if k != "num_key_value_heads"}},  # 8, not heads
        {"model_type": "llama", **TINY, "num_key_value_heads": 3},  # 4 heads do not share 3 kv heads
        {"model_type": "llama", **TINY, "hidden_size": 66},  # 66 / 4 heads: no whole head_dim
        {"model_type": "llama", **TINY, "pad_token_id": 512},  # outside the vocabulary: the build refuses it
        {"model_type": "llama", **TINY, "head_dim": None},
        {"model_type": "llama", **TINY, "num_hidden_layers": "2"},
        {"model_type": "qwen3", **TINY, "tie_word_embeddings": "yes"},
    ],
)
def test_anything_unusual_is_left_to_the_meta_device_build(config: dict[str, Any]) -> None:
    assert dense_arch(config) is None


def test_the_model_types_read_without_transformers_are_ones_it_knows() -> None:
    from jobs.models.library import _generated_model_types, known_model_types, knows_model_type

    generated = _generated_model_types()
    assert set(FAMILIES) <= generated and generated <= known_model_types()
    assert knows_model_type("llama") and not knows_model_type("no_such_family_xyz")


def test_plan_of_a_config_never_seen_imports_neither_torch_nor_transformers(data_home: Path, tmp_path: Path) -> None:
    """A fresh home (no kept architecture, no kept model types) and a Qwen2-shaped config.json folder: the plan
    is printed and nothing heavy was imported (the 2 s target of `tunedeck plan`)."""
    folder = tmp_path / "qwen2-shaped"
    folder.mkdir()
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **TINY, "vocab_size": 704}
    (folder / "config.json").write_text(json.dumps(config))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {folder}\ndataset: sample:chat-format\n")
    code = (
        "import sys\nfrom app.cli.main import main\n"
        f"code = main(['plan', {str(spec)!r}])\n"
        "heavy = ('torch', 'transformers', 'datasets', 'trl', 'sqlalchemy', 'huggingface_hub')\n"
        "print('HEAVY', sorted(m for m in heavy if m in sys.modules))\n"
        "sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "parameters train" in done.stdout and "model architecture from" in done.stdout, done.stdout
    assert "HEAVY []" in done.stdout, done.stdout
    assert not (data_home / "cache" / "arch").exists()  # computed, not built and kept
