"""`tunedeck evaluate`: benchmark tasks on a finished run and on its base, scores with standard errors.

    tunedeck evaluate RUN_ID --tasks qa.jsonl,arc.yaml        # here, in this process
    tunedeck evaluate RUN_ID --tasks qa.jsonl --on-worker     # carried out by a worker that reaches the run

`jobs.evaluate.harness` does the work (lm-evaluation-harness) and stores the scores; this module prints
them as `tunedeck show` does. A worker carries out an `evaluate` task with this same command.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from app.cli.usage import EXIT_OK
from storage.store import Store


def add_parser(sub: Any) -> argparse.ArgumentParser:
    s: argparse.ArgumentParser = sub.add_parser(
        "evaluate", help="score benchmark tasks (lm-evaluation-harness) on a finished run and on its base model"
    )
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    s.add_argument(
        "--tasks",
        required=True,
        help="comma-separated: a .jsonl of questions, an lm-eval task .yaml, or a hub task name (eval_tasks' forms)",
    )
    s.add_argument("--limit", type=int, default=None, help="score only the first N questions of each task")
    from app.cli.tasks import add_flag

    add_flag(s)
    return s


def cmd_evaluate(store: Store, args: argparse.Namespace) -> int:
    from jobs.evaluate.harness import evaluate_run, scores_table

    if getattr(args, "on_worker", False):
        from app.cli.tasks import check_reachable, follow
        from jobs.worker.tasks import request_evaluate

        check_reachable(store, args.run_id)
        task_id = request_evaluate(store, args.run_id, args.tasks)
        print(f"run {args.run_id}: asked a worker for task {task_id}; following")
        code = follow(store, [task_id])
    else:
        logging.getLogger("jobs.evaluate.harness").setLevel(logging.INFO)
        evaluate_run(store, args.run_id, args.tasks, limit=args.limit)
        code = EXIT_OK
    for line in scores_table(store.scores(args.run_id)):
        print(line)
    return code
