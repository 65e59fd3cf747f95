"""What a spec's early stopping and judge need from the rest of it: eval data, evaluations, checkpoints at
them; before/after samples to judge.

Pure, like the rest of `jobs.spec`: the problems name the field and the fix, and `jobs.spec.job`
adds them to a spec's own problems, so a spec that cannot stop early is refused at submit, not
after hours of training.

    problems = early_stopping_problems(spec, record_for(spec.trainer))   # [] when off or consistent
    problems = judge_problems(spec, record_for(spec.trainer))   # [] without a judge, or with samples
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from jobs.errors import Problem

EVALUATE_TASK = "evaluate"  # the worker task that scores eval_tasks (jobs.worker.tasks, queued by jobs.train.recipe)
JUDGE_TASK = "judge"  # the worker task that judges the run against its base (queued by jobs.train.recipe for `judge`)

_METRIC = re.compile(r"^[A-Za-z_][\w/.-]*$")
TASK_PREFIX = "task:"  # metric_for_best_model = "task:<eval_tasks name>/<metric>": a benchmark task's score
TASK_METRICS = ("acc", "exact_match", "regex_match")  # what a .jsonl of questions is scored by (jobs.data.bench_tasks)
_TASK = re.compile(r"^task:\s*([A-Za-z0-9][\w.-]*)/(\w+)$")


class _Source(Protocol):
    @property
    def ref(self) -> str: ...


class EvaluatedSpec(Protocol):
    """The fields early stopping reads (a `jobs.spec.job.JobSpec` has them all)."""

    @property
    def early_stopping_patience(self) -> int | None: ...
    @property
    def metric_for_best_model(self) -> str: ...
    @property
    def eval_steps(self) -> int | None: ...
    @property
    def save_steps(self) -> int | None: ...
    @property
    def eval_split(self) -> float | None: ...
    @property
    def eval_dataset(self) -> str | None: ...
    @property
    def eval_tasks(self) -> str | None: ...
    @property
    def trainer(self) -> object: ...
    @property
    def dataset_sources(self) -> Sequence[_Source]: ...
    @property
    def sample_count(self) -> int: ...
    @property
    def judge(self) -> str | None: ...


def default_eval_ref(spec: EvaluatedSpec) -> str | None:
    """A single bundled sample's own eval split (user data and mixtures have no default eval data)."""
    sources = spec.dataset_sources
    ref = sources[0].ref if len(sources) == 1 else ""
    if ref.startswith("sample:") and ref.count(":") == 1:
        return f"{ref}:eval"
    return None


def has_eval_data(spec: EvaluatedSpec) -> bool:
    """Whether the run will have held-out rows to evaluate on."""
    given = bool(spec.eval_dataset and spec.eval_dataset.strip())
    return given or spec.eval_split is not None or default_eval_ref(spec) is not None


def watched_task(metric_for_best_model: str) -> tuple[str, str] | None:
    """(task name, metric) of a watched task score (`task:tag-format-questions/exact_match`), else None."""
    found = _TASK.match(metric_for_best_model.strip())
    return (found.group(1), found.group(2)) if found else None


def task_metric_key(task: str, metric: str) -> str:
    """The eval metric a watched task score is logged, stored and charted as (`eval_task/<task>/<metric>`)."""
    return f"eval_task/{task}/{metric}"


def task_series(metric_for_best_model: str) -> dict[str, str]:
    """{chart label: logged metric} of a watched task score, for the run page's trainer-metrics chart ({} if none)."""
    task = watched_task(metric_for_best_model)
    return {f"{task[0]} {task[1]}": task_metric_key(*task)} if task else {}


def watched_metric(spec: EvaluatedSpec) -> str:
    """The metric as the trainer logs it at evaluation (`eval_` prefixed)."""
    name = spec.metric_for_best_model.strip()
    task = watched_task(name)
    if task is not None:
        return task_metric_key(*task)
    return name if name.startswith("eval_") else f"eval_{name}"


def greater_is_better(metric: str) -> bool:
    """A logged eval metric's direction: task scores and accuracies up, losses down."""
    return metric.startswith("eval_task/") or not metric.endswith("loss")


class TrainerFacts(Protocol):
    """What the trainer logs at evaluation and whether it writes answers (its `jobs.spec.trainer_records.TrainerRecord`)."""

    @property
    def eval_loss(self) -> bool: ...
    @property
    def watch(self) -> str: ...
    @property
    def score_head(self) -> bool: ...


def early_stopping_problems(spec: EvaluatedSpec, logged: TrainerFacts) -> list[Problem]:
    """Why this spec cannot stop early as asked ([] when it can, or does not ask); `logged`: what its trainer
    logs at evaluation (its record)."""
    if spec.early_stopping_patience is None or spec.early_stopping_patience < 1:
        return []  # off, or out of range (its bound problem says so)
    field = "early_stopping_patience"
    out: list[Problem] = []
    trainer = getattr(spec.trainer, "value", spec.trainer)
    if spec.metric_for_best_model.strip().startswith(TASK_PREFIX):
        out.extend(_task_syntax_problems(spec))
    elif not _METRIC.match(spec.metric_for_best_model.strip()):
        out.append(
            Problem(
                "metric_for_best_model",
                f"{spec.metric_for_best_model!r} is not a metric name",
                "use eval_loss, or another eval metric the trainer logs (eval_mean_token_accuracy)",
            )
        )
    elif not logged.eval_loss and watched_metric(spec) == "eval_loss":
        out.append(
            Problem(
                "metric_for_best_model",
                f"the {trainer} trainer logs no eval_loss at evaluation",
                f"watch a metric it logs ({logged.watch}), or leave early_stopping_patience empty",
            )
        )
    if not has_eval_data(spec):
        out.append(
            Problem(
                field,
                "needs held-out data to watch, and this run has none",
                "set eval_split (e.g. 0.1) or eval_dataset, or leave early_stopping_patience empty",
            )
        )
    if spec.eval_steps is None:
        out.append(
            Problem(
                field,
                "needs evaluations during training, and eval_steps is empty (only a final evaluation)",
                "set eval_steps (e.g. 20), or leave early_stopping_patience empty",
            )
        )
    elif spec.save_steps is not None and spec.save_steps % spec.eval_steps:
        out.append(
            Problem(
                "save_steps",
                f"{spec.save_steps} is not a multiple of eval_steps ({spec.eval_steps}), so the best "
                "evaluation may have no checkpoint to keep",
                f"set save_steps to a multiple of {spec.eval_steps}, or leave it empty (a checkpoint at each evaluation)",
            )
        )
    return out


def _task_syntax_problems(spec: EvaluatedSpec) -> list[Problem]:
    """A watched task score written wrong, or naming a task eval_tasks does not list (files: jobs.checks)."""
    field = "metric_for_best_model"
    task = watched_task(spec.metric_for_best_model)
    if task is None:
        return [
            Problem(
                field,
                f"{spec.metric_for_best_model!r} is not a task score",
                "write task:<task>/<metric>, e.g. task:my-questions/exact_match for my-questions.jsonl in eval_tasks",
            )
        ]
    name, metric = task
    out: list[Problem] = []
    if metric not in TASK_METRICS:
        out.append(
            Problem(field, f"{metric!r} is not a score of a task of questions", f"use one of {', '.join(TASK_METRICS)}")
        )
    stems = [_stem(part) for part in re.split(r"[,\n]", spec.eval_tasks or "") if part.strip()]
    if name not in stems:
        out.append(
            Problem(
                field,
                f"watches task {name!r}, which eval_tasks does not list"
                + (f" (it lists {', '.join(stems)})" if stems else " (it is empty)"),
                f"add {name}.jsonl to eval_tasks, or watch one of its tasks",
            )
        )
    return out


def _stem(ref: str) -> str:
    """The name a task is stored under: a file's stem (a .jsonl or .yaml), or a registry task's own name."""
    base = ref.strip().replace("\\", "/").rsplit("/", 1)[-1]
    return base.rsplit(".", 1)[0] if base.lower().endswith((".jsonl", ".yaml", ".yml")) else base


def judge_problems(spec: EvaluatedSpec, trained: TrainerFacts) -> list[Problem]:
    """Why this spec's judge could not judge when training ends ([] when it can, or there is none); `trained`:
    its trainer's record."""
    judge = (spec.judge or "").strip()
    if not judge:
        return []
    out: list[Problem] = []
    if trained.score_head:
        out.append(Problem("judge", "a reward model writes no answers to judge", "leave judge empty"))
    elif spec.sample_count == 0:
        out.append(
            Problem(
                "judge",
                "judges the before/after answers, and sample_count is 0 (none are written)",
                "set sample_count above 0 (3 by default), or leave judge empty",
            )
        )
    if judge.startswith(("http://", "https://")) and not judge.partition("#")[2].strip():
        out.append(Problem("judge", f"{judge!r} names no model", "write the endpoint as URL#MODEL"))
    return out


def evaluate_args(tasks: str, judge: str | None) -> dict[str, str]:
    """An evaluate task's arguments: the benchmark tasks, and a judge that judges in the same process."""
    return {"tasks": tasks, **({"judge": judge.strip()} if judge and judge.strip() else {})}


def evaluation_tasks(spec: EvaluatedSpec) -> list[tuple[str, dict[str, str]]]:
    """The worker tasks (kind, arguments) a run queues when training ends: benchmarks and a judge in one evaluate
    task (the models loaded once), or the judge alone."""
    tasks, judge = (spec.eval_tasks or "").strip(), (spec.judge or "").strip()
    if tasks:
        return [(EVALUATE_TASK, evaluate_args(spec.eval_tasks or "", judge))]
    return [(JUDGE_TASK, {"judge": judge})] if judge else []
