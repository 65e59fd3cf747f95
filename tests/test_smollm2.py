"""A real run of the embedded default model (SmolLM2-135M-Instruct) through the worker.

Slow-ish (~1-2 min on 2 CPU cores, plus a one-time download and conversion of the model):
it is the proof that the default the README promises really trains.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from jobs.spec.job import JobSpec
from storage.models import RunStatus

pytestmark = [pytest.mark.smollm2, pytest.mark.integration, pytest.mark.slow]


def test_default_model_trains_through_the_worker(store, smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    import torch
    from peft import PeftModel

    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import resolve_model
    from jobs.queue.submit import submit
    from jobs.worker.loop import Worker

    spec = JobSpec.from_dict(
        {
            "run_name": "smollm2-smoke",
            "model": "smollm2-135m-instruct",
            "dataset": "sample:chat-format",
            "method": "lora",
            "lora_r": 8,
            "lora_alpha": 16,
            "learning_rate": 1e-3,
            "lr_scheduler_type": "constant",
            "per_device_train_batch_size": 2,
            "max_length": 48,
            "max_steps": 3,
            "max_train_samples": 16,
            "eval_dataset": "sample:chat-format:eval",
        }
    )
    run_id = submit(store, spec)
    Worker(store, poll_interval=0.2).work(burst=True)

    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, (run.error_summary, run.error_detail)
    assert run.current_step == 3 and run.total_steps == 3
    losses = [p.value for p in store.metrics(run_id, ["loss"])]
    assert len(losses) == 3 and all(v == v for v in losses)
    assert "eval_loss" in run.final_metrics
    assert run.peak_memory_bytes and run.peak_memory_bytes > 300 * 2**20  # a 135M-param model in fp32 at least

    bundle = [a for a in store.artifacts(run_id) if a.kind == "bundle"]
    assert len(bundle) == 1
    with zipfile.ZipFile(bundle[0].path) as zf:
        names = set(zf.namelist())
        assert {"adapter_model.safetensors", "adapter_config.json", "spec.yaml", "README.md"} <= {
            Path(n).name for n in names
        }
        adapter_dir = Path(bundle[0].path).parent / "reloaded"
        zf.extractall(adapter_dir)
    adapter_cfg = next(adapter_dir.rglob("adapter_config.json")).parent

    base, tok = load_model_and_tokenizer(resolve_model("smollm2-135m-instruct"))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Tell me about volcanoes."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        before = base(ids).logits
        tuned = PeftModel.from_pretrained(base, str(adapter_cfg))
        after = tuned(ids).logits
    assert not torch.allclose(before, after, atol=1e-4), "the trained adapter did not change the model's output"

    # The card's snippet runs as written with plain transformers + peft, the hub id resolved to a
    # local copy (a hub cache holding tunedeck's converted folder under the upstream name).
    import json

    from training_helpers import greedy_answer, run_card_snippet

    from jobs.train.artifacts import LOAD_PROMPT

    assert (
        json.loads((adapter_cfg / "adapter_config.json").read_text())["base_model_name_or_path"]
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert "dequantized from the Q4_1 GGUF" in (adapter_cfg / "README.md").read_text()
    hub = Path(bundle[0].path).parent / "hub-cache"
    snapshot = hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / "local"
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("local")
    for f in Path(resolve_model("smollm2-135m-instruct").path).iterdir():
        (snapshot / f.name).symlink_to(f)
    printed = run_card_snippet(adapter_cfg, env={"HF_HUB_CACHE": str(hub)})
    tuned.eval()
    assert printed and printed == greedy_answer(tuned, tok, LOAD_PROMPT)
