"""Benchmark tasks on a finished run and on its base model, with the same settings: lm-evaluation-harness.

    scores = evaluate_run(store, run_id, "qa.jsonl, arc.yaml")   # {task name: [Score(model, metric, value, stderr)]}
    # also stored: store.scores(run_id)

The run's result and its base are loaded once (`jobs.chat.generate.load`: for an adapter the base is
the same weights with the adapter switched off). The tasks `eval_tasks` names are written as lm-eval
tasks into a temporary folder (`jobs.data.bench_tasks`) that lm-eval's `TaskManager` reads through
`include_path`; each model is wrapped in lm-eval's `HFLM` (its log-likelihoods and greedy generation)
and scored by `simple_evaluate`, zero-shot, with the chat template when the tokenizer has one (the
same for both, so the comparison is fair). Every metric comes with its standard error, as lm-eval
computes it. A worker runs this as a task (`tunedeck evaluate`, `jobs.worker.tasks`), where the
weights are, holding the device's lease like an export.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs.data.bench_tasks import TaskKind, lm_eval_spec, task_problems, task_refs, write_tasks
from jobs.evaluate.card import refresh_card
from jobs.spec.job import SpecError
from storage.roles import Evaluations
from storage.store import Score

log = logging.getLogger(__name__)

MODELS = ("base", "run")
BATCH_SIZE = 8


def evaluate_run(
    store: Evaluations, run_id: int, tasks: str, *, device: str | None = None, limit: int | None = None
) -> dict[str, list[Score]]:
    """Score `tasks` (eval_tasks' text) on run `run_id` and its base; stores and returns the scores by task."""
    from jobs.chat.generate import load, locate

    problems = task_problems(tasks)
    if problems:
        raise SpecError(problems)
    refs = task_refs(tasks)
    if not refs:
        raise SpecError([])
    pair = load(locate(store, run_id), device)
    by_task: dict[str, list[Score]] = {}
    with tempfile.TemporaryDirectory(prefix="tunedeck-tasks-") as tmp:
        include, names = write_tasks(refs, Path(tmp))
        manager = _task_manager(include, hub=any(r.kind is TaskKind.HUB for r in refs))
        specs = [lm_eval_spec(Path(tmp), task) for task in names]
        for which in MODELS:
            with _model(pair, which) as model:
                log.info("scoring the %s model on %s", which, ", ".join(names.values()))
                results = _score(model, pair.tokenizer, specs, manager, limit)
            for task, scores in _scores(results, which).items():
                by_task.setdefault(names.get(task, task), []).extend(scores)
    for name, scores in by_task.items():
        store.set_scores(run_id, name, scores)
    from jobs.evaluate.judge import judge_file

    refresh_card(store, run_id, judge_file(store.run_dir(run_id)))
    return by_task


@contextlib.contextmanager
def _model(pair: Any, which: str) -> Iterator[Any]:
    """The run's model, or its base: a full fine-tune's separate base, or the adapter switched off."""
    if which == "run" or pair._base is not None:
        yield pair.tuned if which == "run" else pair._base
        return
    with pair.tuned.disable_adapter():
        yield pair.tuned


def _task_manager(include: list[str], *, hub: bool) -> Any:
    from lm_eval.tasks import TaskManager

    # lm-eval's own registry is indexed only when a hub task is asked for (it reads thousands of YAML files).
    return TaskManager(include_path=include, include_defaults=hub)


def _score(
    model: Any, tokenizer: Any, tasks: list[str | dict[str, Any]], manager: Any, limit: int | None
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
        bootstrap_iters=1000,
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
