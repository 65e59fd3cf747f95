"""A finished reward run's model, as a GRPO reward: the submit-time check that the run can serve.

A GRPO spec names a run (`reward_model_run: 7`) whose trainer was `reward`; its bundle holds the
sequence-classification model (a full fine-tune) or the adapter with the trained score head (peft).
The training process loads it with `jobs.train.reward_model.load_reward_model` (above `jobs.config`,
whose MoRA loader it needs); this check reads only the store and the run's spec.

    problems = reward_run_problems(store, spec)             # [] when the run can serve as a reward
    problems = reward_problems(store, run_id)               # the same for a run id
"""

from __future__ import annotations

from pathlib import Path

from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from storage.models import RunStatus
from storage.roles import ArtifactReader

FIX = "give the id of a succeeded run with trainer: reward (`tunedeck runs` lists them), or train one first"


def bundle_folder(store: ArtifactReader, run_id: int) -> Path | None:
    """The run's saved model or adapter folder (the bundle), if recorded and present."""
    found = [Path(a.path) for a in store.artifacts(run_id) if a.kind in ("adapter", "model")]
    return found[-1] if found and found[-1].is_dir() else None


def reward_run_problems(store: ArtifactReader, spec: JobSpec) -> list[Problem]:
    """Why `spec.reward_model_run` cannot score completions (none when it is a finished reward run)."""
    run_id = spec.reward_model_run
    if run_id is None or not record_for(spec.trainer).generates:
        return []
    return reward_problems(store, run_id)


def reward_problems(store: ArtifactReader, run_id: int) -> list[Problem]:
    """Why run `run_id` cannot score completions (none when it is a finished reward run)."""
    from jobs.spec.stored import spec_of

    run = store.get_run(run_id)
    if run is None:
        return [Problem("reward_model_run", f"run {run_id} does not exist", FIX)]
    trainer = spec_of(run).trainer
    if not record_for(trainer).score_head:
        return [
            Problem("reward_model_run", f"run {run_id} trained with trainer: {trainer.value}, not a reward model", FIX)
        ]
    if run.status is not RunStatus.SUCCEEDED:
        return [Problem("reward_model_run", f"reward run {run_id} is {run.status.value}, not succeeded", FIX)]
    if bundle_folder(store, run_id) is None:
        return [
            Problem(
                "reward_model_run",
                f"reward run {run_id} has no saved model or adapter folder (deleted from disk?)",
                FIX,
            )
        ]
    return []
