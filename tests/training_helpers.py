"""Helpers shared by the training, worker and fault tests: a quick tiny-model spec and polling."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.spec.job import JobSpec


def tiny_spec(model: Path, *, max_steps: int = 12, max_length: int = 96, **changes: Any) -> JobSpec:
    """A spec that trains the tiny model quickly and visibly (high lr, few short rows)."""
    base = dict(
        model=str(model),
        dataset="sample:chat-format",
        method="lora",
        max_steps=max_steps,
        per_device_train_batch_size=4,
        max_length=max_length,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        max_train_samples=16,
        logging_steps=1,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.0,
    )
    return JobSpec.from_dict({**base, **changes})


def claim_run(store: Any, run_id: int, worker_id: str, device: str, host: str | None = None) -> Any:
    """Claim run `run_id` itself, as a worker on (host, device) would: `claim_next_on_device` takes the oldest
    queued run, and a store shared by a module's tests may still hold another test's (the order is random)."""
    others = [r.id for r in store.queued() if r.id != run_id]
    claimed = store.claim_next_on_device(worker_id, device, host=host, skip=others)
    assert claimed is not None and claimed.id == run_id, f"run {run_id} was not claimed: {claimed}"
    return claimed


# max_steps for a run a test stops mid-training (cancel, kill, scancel): one that never ends by itself first. The
# tiny model trains ~50 steps a second on one thread (the suite runs with OMP_NUM_THREADS=1), so "2,000 steps"
# was over before a loaded test got to its kill.
LONG = 100_000


def wait_for(
    predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout} s")


def run_card_snippet(bundle: Path, env: dict[str, str] | None = None) -> str:
    """Run the Python snippet of a bundle's README.md as written, from the bundle folder; its stdout."""
    code = re.search(r"```python\n(.*?)```", (bundle / "README.md").read_text(), re.S)
    assert code, "the model card has no python snippet"
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        cwd=bundle,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def greedy_answer(model, tokenizer, prompt: str, max_new_tokens: int = 40) -> str:
    """What the card snippet prints, computed in-process: chat template, greedy decoding."""
    import torch

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def refusal_messages(data: dict[str, Any]) -> list[str]:
    """Every refusal of a spec dict: from parsing, or from the capability check on the CPU."""
    from jobs.config.mapping import capability_problems
    from jobs.devices.facts import CPU
    from jobs.spec.job import SpecError

    try:
        return [str(p) for p in capability_problems(JobSpec.from_dict(data), CPU)]
    except SpecError as exc:
        return [str(p) for p in exc.problems]
