"""Scoring a loaded model on benchmark tasks with lm-evaluation-harness: the one definition of a task's score.

    with TaskScorer(refs) as scorer:                   # the tasks written once as lm-eval tasks, in a temporary folder
        scores = scorer.score(model, tokenizer)        # {task name: [Score(model, metric, value, stderr, samples)]}

Both users hand in a model they already hold: `jobs.evaluate.harness` the finished run and its base (after
training), `jobs.train.task_watch` the live model at each evaluation (early stopping on a task's score). The
tasks come from `jobs.data.bench_tasks` (questions written as lm-eval tasks, their answers scored by its
`answer_scores`); the model is wrapped in lm-eval's `HFLM` and scored by `simple_evaluate`, zero-shot, with
the chat template when the tokenizer has one, seeded, so the same model gets the same score wherever it is
scored. Every metric comes with its standard error, as lm-eval computes it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from jobs.data.bench_tasks import TaskKind, TaskRef, lm_eval_spec, write_tasks
from storage.store import Score

BATCH_SIZE = 8


class TaskScorer:
    """The tasks of `refs` written as lm-eval tasks (until `close`), scored on any model handed to `score`."""

    def __init__(self, refs: list[TaskRef], *, tokenizer: Any = None, bootstrap_iters: int = 1000) -> None:
        """`tokenizer`: the scored models' (it sizes a generation task's replies: `bench_tasks.generation_budget`)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="tunedeck-tasks-")
        folder = Path(self._tmp.name)
        count = (lambda text: len(tokenizer(text)["input_ids"])) if tokenizer is not None else None
        include, self.names = write_tasks(refs, folder, count)  # {lm-eval task name: the name scores are stored under}
        self._manager = _task_manager(include, hub=any(r.kind is TaskKind.HUB for r in refs))
        self._specs = [lm_eval_spec(folder, task) for task in self.names]
        self._bootstrap_iters = bootstrap_iters

    def score(
        self, model: Any, tokenizer: Any, *, which: str = "run", limit: int | None = None
    ) -> dict[str, list[Score]]:
        """`model`'s scores by task name, each labelled `which` ("run", "base"); the model is left in eval mode."""
        results = _evaluate(model, tokenizer, self._specs, self._manager, limit, self._bootstrap_iters)
        out: dict[str, list[Score]] = {}
        for task, scores in _scores(results, which).items():
            out.setdefault(self.names.get(task, task), []).extend(scores)
        return out

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> TaskScorer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _task_manager(include: list[str], *, hub: bool) -> Any:
    from lm_eval.tasks import TaskManager

    # lm-eval's own registry is indexed only when a hub task is asked for (it reads thousands of YAML files).
    return TaskManager(include_path=include, include_defaults=hub)


def _evaluate(
    model: Any, tokenizer: Any, tasks: list[str | dict[str, Any]], manager: Any, limit: int | None, bootstrap: int
) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    model.eval()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=BATCH_SIZE)
    out = simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=manager,
        num_fewshot=0,
        limit=limit,
        log_samples=False,
        bootstrap_iters=bootstrap,
        apply_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    return dict(out["results"]) if out else {}


def _scores(results: dict[str, Any], which: str) -> dict[str, list[Score]]:
    """lm-eval's results ({task: {"acc,none": v, "acc_stderr,none": s, ...}}) as Scores per task."""
    out: dict[str, list[Score]] = {}
    for task, values in results.items():
        samples = values.get("sample_len") or values.get("samples")
        for key, value in values.items():
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            stderr = values.get(f"{metric}_stderr,{filt}")
            name = metric if filt == "none" else f"{metric} ({filt})"
            out.setdefault(task, []).append(
                Score(
                    which,
                    name,
                    float(value),
                    float(stderr) if isinstance(stderr, (int, float)) else None,
                    int(samples) if isinstance(samples, int) else None,
                )
            )
    return out
