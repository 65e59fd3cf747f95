"""A finished run as a judge reward's model (`run:N`): whether it can judge, and where its weights are.

A run that wrote answers (not a reward model) and saved its result: its full weights, or its adapter (LoRA and the
other peft methods; a MoRA adapter is not loaded as a judge) with its base. Checked at submit (`jobs.checks.rewards`)
and again when the judge is loaded (`jobs.train.judges`).

    problem = run_judge_problem(store, 7)      # (problem, fix) or None
    folder, base = run_judge(store, 7)         # base: None for full weights
"""

from __future__ import annotations

from jobs.errors import Problem
from jobs.spec.job import SpecError
from storage.roles import ArtifactReader


def run_judge_problem(store: ArtifactReader, run_id: int) -> tuple[str, str] | None:
    """(problem, fix) when run `run_id` cannot be a judge reward's model (missing, unfinished, a reward model, a MoRA
    adapter, its result folder gone); None when it can."""
    return _judge_of(store, run_id)[0]


def run_judge(store: ArtifactReader | None, run_id: int) -> tuple[str, str | None]:
    """(the result folder, its base model or None for full weights) of finished run `run_id` as a judge; SpecError
    naming `rewards.judge` when it cannot judge."""
    if store is None:
        raise SpecError([Problem("rewards.judge", f"run:{run_id} needs the runs' store", "queue the job")])
    problem, folder, base = _judge_of(store, run_id)
    if problem is not None:
        raise SpecError([Problem("rewards.judge", *problem)])
    assert folder is not None
    return folder, base


def _judge_of(store: ArtifactReader, run_id: int) -> tuple[tuple[str, str] | None, str | None, str | None]:
    """(problem or None, the result folder, its base model: None for full weights)."""
    from jobs.spec.enums import Method
    from jobs.spec.stored import finished_problem, result_folder, spec_of
    from jobs.spec.trainer_records import record_for

    run = store.get_run(run_id)
    problem = finished_problem(run, run_id, "judge with")
    if problem is not None:
        return problem, None, None
    assert run is not None  # finished_problem names a missing run
    spec = spec_of(run)
    if record_for(spec.trainer).score_head:
        why = f"run {run_id} trained a reward model: it scores without writing a reply"
        return (why, "use it as reward_model_run, or judge with a run that writes answers"), None, None
    if spec.method is Method.MORA:
        why = f"run {run_id} trained a MoRA adapter, which a judge does not load"
        return (why, "judge with a LoRA or a full run"), None, None
    full = spec.method is Method.FULL
    kind, marker = ("model", "config.json") if full else ("adapter", "adapter_config.json")
    folder = result_folder(store, run_id, kind, marker)
    if folder is None:
        return (
            (f"run {run_id} has no saved {kind} folder (deleted or never written)", "judge with another run"),
            None,
            None,
        )
    return None, str(folder), None if full else spec.model
