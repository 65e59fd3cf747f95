"""`tunedeck export RUN_ID --merged`: the adapter merged into its base, checked, saved, recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from training_helpers import greedy_answer

from jobs.export.merged import CHECK_PROMPTS, ExportError, export_merged
from jobs.train.artifacts import sha256_of

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tag_store):
    """A store on the session's finished runs (conftest `tag_store`)."""
    return tag_store[1]


@pytest.fixture
def runs(tag_store) -> dict[str, int]:
    """A finished LoRA run, a finished prompt-tuning run and a full fine-tune."""
    ids = tag_store[2]
    return {"lora": ids["lora"], "prompt": ids["prompt_tuning"], "full": ids["full"]}


def test_merged_export_answers_like_the_adapter_and_is_recorded(store, runs: dict[str, int]) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = export_merged(store, runs["lora"], "fp32")
    assert result.check.passed and result.check.equal and result.check.token_agreement == 1.0
    assert len(result.check.merged) == len(CHECK_PROMPTS)
    folder = result.folder
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert not (folder / "adapter_config.json").exists()  # a plain model now
    assert json.loads((folder / "export-check.json").read_text())["passed"] is True
    # Recorded with their hashes; the zip is what the dashboard may serve.
    arts = {a.kind: a for a in store.artifacts(runs["lora"])}
    assert arts["export"].sha256 == sha256_of(result.archive) == result.sha256
    assert arts["merged"].sha256 == sha256_of(folder / "model.safetensors")
    # Reloaded with plain transformers, it answers as the unmerged adapter does.
    merged = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    adapter_dir = next(Path(a.path) for a in store.artifacts(runs["lora"]) if a.kind == "adapter")
    base = AutoModelForCausalLM.from_pretrained(
        json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    )
    tuned = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    for prompt in CHECK_PROMPTS[:2]:
        assert greedy_answer(merged, tokenizer, prompt, 32) == greedy_answer(tuned, tokenizer, prompt, 32)


def test_export_zip_is_served_and_its_folder_is_not(store, runs: dict[str, int]) -> None:
    from app.server import blocked_paths, bundle_files

    result = export_merged(store, runs["lora"], "fp32")
    assert str(result.archive.resolve()) in bundle_files(store)
    assert any(Path(p) == result.folder.parent for p in blocked_paths())


@pytest.mark.parametrize("which, words", [("prompt", "virtual tokens"), ("full", "already a whole model")])
def test_runs_with_nothing_to_merge_are_refused_with_the_reason(
    store, runs: dict[str, int], which: str, words: str
) -> None:
    with pytest.raises(ExportError) as err:
        export_merged(store, runs[which], "fp32")
    assert words in str(err.value) and err.value.problems[0].fix
    assert not [a for a in store.artifacts(runs[which]) if a.kind in ("merged", "export")]


def test_cli_export(store, runs: dict[str, int], capsys: pytest.CaptureFixture) -> None:
    from app.cli.main import main

    assert main(["export", str(runs["lora"]), "--merged", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "greedy answers equal: passed" in out and "sha256" in out
    assert main(["export", str(runs["lora"])]) == 2  # no format chosen
    assert "--merged" in capsys.readouterr().err
    assert main(["export", "999", "--merged"]) == 2
