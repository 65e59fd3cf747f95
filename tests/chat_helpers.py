"""A finished tiny run that visibly learned a format, shared by the chat tests (engine, CLI, browser)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training_helpers import claim_run, tiny_spec

TAUGHT = "[tag]"  # every answer of the sample:chat-format data set starts with it
PROMPT = "Tell me about the moon."


def train_tag_runs(store: Any, model: Path, methods: tuple[str, ...] = ("lora",)) -> dict[str, int]:
    """Runs of `methods` on the tiny model, trained through the worker until they answer with TAUGHT."""
    from jobs.worker.loop import Worker
    from storage.models import RunStatus

    settings = {
        "lora": {"max_steps": 30, "learning_rate": 1e-2},
        "prompt_tuning": {"max_steps": 4},
        "full": {"max_steps": 4, "learning_rate": 1e-3},
    }
    ids = {m: store.create_run(tiny_spec(model, method=m, run_name=f"chat-{m}", **settings[m])) for m in methods}
    Worker(store, poll_interval=0.1).work(burst=True)
    for method, run_id in ids.items():
        run = store.get_run(run_id)
        assert run.status is RunStatus.SUCCEEDED, (method, run.error_detail)
    return ids


def broken_copy(store: Any, run_id: int, model: Path, worker_id: str = "test-worker") -> int:
    """A succeeded run whose adapter folder is a copy of `run_id`'s with its weights file damaged."""
    import shutil

    source = next(Path(a.path) for a in store.artifacts(run_id) if a.kind == "adapter")
    broken = store.create_run(tiny_spec(model, run_name="broken"))
    folder = store.run_dir(broken) / "bundle"
    shutil.copytree(source, folder)
    (folder / "adapter_model.safetensors").write_bytes(b"not safetensors")
    claim_run(store, broken, worker_id, "fake-broken")
    store.mark_succeeded(broken, {})
    store.add_artifact(broken, "adapter", str(folder), 1, "0" * 64)
    return broken
