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
weights are, holding the device's lease like an export; with a judge (`judge` in the spec) the same process
judges the run next, reusing the base it loaded when the judge is the run's base model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from jobs.data.bench_score import TaskScorer
from jobs.data.bench_tasks import task_problems, task_refs
from jobs.evaluate.card import refresh_card
from jobs.spec.job import SpecError
from storage.roles import Evaluations
from storage.store import Score

log = logging.getLogger(__name__)

MODELS = ("base", "run")


def evaluate_run(
    store: Evaluations,
    run_id: int,
    tasks: str,
    *,
    device: str | None = None,
    limit: int | None = None,
    judge: str | None = None,
) -> dict[str, list[Score]]:
    """Score `tasks` (eval_tasks' text) on run `run_id` and its base; stores and returns the scores by task.
    `judge`: then judge the run against its base too (`jobs.evaluate.judge`), in the same process: a judge that
    is the run's base model is the base loaded here, not a second copy."""
    from jobs.chat.generate import load, locate

    problems = task_problems(tasks)
    if problems:
        raise SpecError(problems)
    refs = task_refs(tasks)
    if not refs:
        raise SpecError([])
    pair = load(locate(store, run_id), device)
    by_task: dict[str, list[Score]] = {}
    with TaskScorer(refs, tokenizer=pair.tokenizer) as scorer:
        for which in MODELS:
            with _model(pair, which) as model:
                log.info("scoring the %s model on %s", which, ", ".join(scorer.names.values()))
                for name, scores in scorer.score(model, pair.tokenizer, which=which, limit=limit).items():
                    by_task.setdefault(name, []).extend(scores)
    for name, scores in by_task.items():
        store.set_scores(run_id, name, scores)
    from jobs.evaluate.judge import base_asker, judge_file, judge_run

    if judge and judge.strip():  # its own card refresh carries the benchmark scores too
        reused = base_asker(judge.strip(), pair.result.base, lambda: _model(pair, "base"))
        judge_run(store, run_id, judge.strip(), ask_all=reused)
    else:
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
