"""A finished reward run's model, as a GRPO reward: checked at submit, loaded in the training process.

A GRPO spec names a run (`reward_model_run: 7`) whose trainer was `reward`; its bundle holds the
sequence-classification model (a full fine-tune) or the adapter with the trained score head (peft).
The adapter is loaded onto the same base and merged, so trl scores completions with one plain
model in inference mode.

    problems = reward_run_problems(store, spec)             # [] when the run can serve as a reward
    model, tokenizer = load_reward_model(store, spec.reward_model_run)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import Method, Trainer
from jobs.spec.job import JobSpec
from storage.models import RunStatus

FIX = "give the id of a succeeded run with trainer: reward (`tunedeck runs` lists them), or train one first"


def _bundle_folder(store: Any, run_id: int) -> Path | None:
    """The run's saved model or adapter folder (the bundle), if recorded and present."""
    found = [Path(a.path) for a in store.artifacts(run_id) if a.kind in ("adapter", "model")]
    return found[-1] if found and found[-1].is_dir() else None


def reward_run_problems(store: Any, spec: JobSpec) -> list[Problem]:
    """Why `spec.reward_model_run` cannot score completions (none when it is a finished reward run)."""
    from jobs.spec.stored import spec_of

    run_id = spec.reward_model_run
    if run_id is None or spec.trainer is not Trainer.GRPO:
        return []
    run = store.get_run(run_id)
    if run is None:
        return [Problem("reward_model_run", f"run {run_id} does not exist", FIX)]
    trainer = spec_of(run).trainer
    if trainer is not Trainer.REWARD:
        return [
            Problem("reward_model_run", f"run {run_id} trained with trainer: {trainer.value}, not a reward model", FIX)
        ]
    if run.status is not RunStatus.SUCCEEDED:
        return [Problem("reward_model_run", f"reward run {run_id} is {run.status.value}, not succeeded", FIX)]
    if _bundle_folder(store, run_id) is None:
        return [
            Problem(
                "reward_model_run",
                f"reward run {run_id} has no saved model or adapter folder (deleted from disk?)",
                FIX,
            )
        ]
    return []


def load_reward_model(store: Any, run_id: int, dtype: Any = None) -> tuple[Any, Any]:
    """(sequence-classification model in eval mode, its tokenizer) of a finished reward run."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from jobs.models.references import resolve_model
    from jobs.spec.job import SpecError
    from jobs.spec.stored import spec_of

    run = store.get_run(run_id)
    problems = reward_run_problems(store, JobSpec(trainer=Trainer.GRPO, reward_model_run=run_id))
    if problems:
        raise SpecError(problems)
    folder = _bundle_folder(store, run_id)
    assert folder is not None and run is not None
    reward_spec = spec_of(run)
    kwargs: dict[str, Any] = {
        "num_labels": 1,
        "use_safetensors": True,
        "trust_remote_code": reward_spec.trust_remote_code,
    }
    if dtype is not None:
        kwargs["dtype"] = dtype
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if reward_spec.method is Method.FULL:
        model = AutoModelForSequenceClassification.from_pretrained(str(folder), **kwargs)
    else:
        base_path = resolve_model(reward_spec.model, trust_remote_code=reward_spec.trust_remote_code).path
        base = AutoModelForSequenceClassification.from_pretrained(base_path, **kwargs)
        if reward_spec.method is Method.MORA:
            from jobs.config.mora import load_mora

            model = load_mora(base, str(folder))
        else:
            from peft import PeftModel

            model = PeftModel.from_pretrained(base, str(folder))
        if hasattr(model, "merge_and_unload"):
            try:
                model = model.merge_and_unload()  # one plain model: the score head and the merged weights
            except (ValueError, TypeError, NotImplementedError):
                pass  # prompt-learning adapters do not merge; the PeftModel scores as well
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model, tokenizer
