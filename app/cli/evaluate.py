"""`tunedeck evaluate` and `tunedeck judge`: did the run get better than its base?

    tunedeck evaluate RUN_ID --tasks qa.jsonl,arc.yaml        # benchmarks here, in this process
    tunedeck evaluate RUN_ID --tasks qa.jsonl --on-worker     # carried out by a worker that reaches the run
    tunedeck evaluate RUN_ID --tasks qa.jsonl --judge smollm2-135m-instruct   # both, the models loaded once
    tunedeck judge RUN_ID --judge smollm2-135m-instruct       # a judge's win rate on the before/after samples

`jobs.evaluate.harness` does the work (lm-evaluation-harness) and stores the scores; this module prints
them as `tunedeck show` does. A worker carries out an `evaluate` task with this same command.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.cli.usage import EXIT_OK

if TYPE_CHECKING:  # the parser is built for every command: `plan` must not import the database layer
    from storage.roles_tasks import Evaluating, EvaluationOnWorker, ScoreReport, TaskOnWorker


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
    s.add_argument(
        "--judge",
        default=None,
        help="then judge the run against its base too, in this process (`tunedeck judge`'s --judge; the run's "
        "base model as the judge is the base already loaded)",
    )
    from app.cli.tasks import add_flag

    add_flag(s)
    s.set_defaults(func=cmd_evaluate)
    j: argparse.ArgumentParser = sub.add_parser(
        "judge", help="a judge model's win rate of a finished run against its base, on its before/after samples"
    )
    j.add_argument("run_id", type=int, metavar="RUN_ID")
    j.add_argument(
        "--judge",
        required=True,
        help="a built-in model, a local folder, run:N, or an OpenAI-compatible endpoint URL#MODEL (key: OPENAI_API_KEY, sent only to TUNEDECK_TRUSTED_ENDPOINTS)",
    )
    add_flag(j)
    j.set_defaults(func=cmd_judge)
    return s


def _on_worker(store: TaskOnWorker, run_id: int, request: Callable[[], int]) -> int:
    """Queue the task `request` makes for a worker that reaches the run, and follow it to its end."""
    from app.cli.tasks import check_reachable, follow

    check_reachable(store, run_id)
    task_id = request()
    print(f"run {run_id}: asked a worker for task {task_id}; following")
    return follow(store, [task_id])


def cmd_judge(store: EvaluationOnWorker, args: argparse.Namespace) -> int:
    from jobs.evaluate.judge import judge_run

    if getattr(args, "on_worker", False):
        from jobs.worker.tasks import request_judge

        return _on_worker(store, args.run_id, lambda: request_judge(store, args.run_id, args.judge))
    result = judge_run(store, args.run_id, args.judge)
    for j in result.judgments:
        shown = "run first" if j.run_first else "base first"
        print(f"[{j.verdict:>8}] ({shown}) {j.prompt[:60]!r}: {j.reply[:100]!r}")
    print(result.summary())
    return EXIT_OK


def cmd_evaluate(store: Evaluating, args: argparse.Namespace) -> int:
    from jobs.evaluate.harness import evaluate_run

    if getattr(args, "on_worker", False):
        from jobs.worker.tasks import request_evaluate

        code = _on_worker(store, args.run_id, lambda: request_evaluate(store, args.run_id, args.tasks, args.judge))
    else:
        logging.getLogger("jobs.evaluate.harness").setLevel(logging.INFO)
        evaluate_run(store, args.run_id, args.tasks, limit=args.limit, judge=args.judge)
        code = EXIT_OK
    _print_scores(store, args.run_id)
    return code


def _print_scores(store: ScoreReport, run_id: int) -> None:
    """The run's benchmark table, base beside run, and the judge's line, as `tunedeck show` ends."""
    from app.cli.show import run_or_fail, score_lines

    for line in score_lines(store, run_or_fail(store, run_id))[1:]:
        print(line)


def evaluations_after_run(store: Evaluating, run_id: int, worker: Any = None) -> int:
    """`tunedeck run`'s ending: the benchmark and judge tasks the run queued (eval_tasks, judge), followed to their
    end and their scores printed, base beside run, then the judge's win rate. `worker`: the run's in-process
    worker, when no other runs; its task service carries them out here, in a thread, as `tunedeck worker` would.
    Returns the exit code (0: none, or all succeeded)."""
    import threading

    from app.cli.tasks import follow
    from jobs.worker.tasks import EVALUATION_KINDS, reach_problem

    ids = [t.id for t in store.run_tasks(run_id) if t.kind in EVALUATION_KINDS and not t.status.finished]
    if not ids:
        return EXIT_OK
    thread = None
    if worker is not None:
        from jobs.worker.task_service import task_service

        service = task_service(worker.place())
        claimed = [c for c in (store.claim_task(i, worker.worker_id) for i in ids) if c is not None]
        thread = threading.Thread(target=lambda: [service.carry_out(c) for c in claimed], name="tunedeck-evaluate")
        thread.start()
    else:
        run = store.get_run(run_id)
        problem = reach_problem(store, run) if run is not None else None
        if problem is not None:
            print(f"run {run_id}: evaluation tasks {ids} stay queued: {problem}", flush=True)
            return EXIT_OK
    print(f"run {run_id}: evaluating the run against its base (tasks {ids})", flush=True)
    code = follow(store, ids)
    if thread is not None:
        thread.join()
    _print_scores(store, run_id)
    return code
