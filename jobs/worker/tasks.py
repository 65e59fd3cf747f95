"""Tasks: exports and pushes the dashboard asks a worker for through the store, and who can carry them out.

    ids = request_export(store, run_id, merged=True, dtype="fp32", gguf=["f16"])   # one task per file kind
    task_id = request_push(store, run_id, "alice/tag-adapter", what="bundle")
    problem = reach_problem(store, run)      # no live worker can reach the run's weights: say where to start one
    cli_args(task)                           # the `tunedeck export|push` arguments a worker runs it with

A worker carries each out as a child process (`jobs.worker.task_service`): the same command a user
types, so its checks (merged answers equal to the adapter's, GGUF round trips, sha256 of every file)
are the command's. Kinds are `TaskKind`; the store keeps them as strings. A push uses the worker's
own HF_TOKEN: a token is never written into a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from jobs.errors import Problem
from jobs.export.gguf_route import family_problems
from jobs.export.imatrix import request_problems, uses_imatrix
from jobs.export.llamacpp import EXPORT_TYPES, LLAMA_CPP_FIX, llama_cpp_problem
from jobs.export.merged import DTYPES, ExportError
from jobs.export.vision import gguf_problems
from jobs.spec.evaluation import EVALUATE_TASK, JUDGE_TASK, evaluate_args
from jobs.spec.grpo import TRY_REWARDS_TASK
from jobs.worker.services import SHARED_DATA_ENV, run_host, shared_data
from storage.roles import WorkerDirectory
from storage.roles_tasks import EvaluationRequests, ExportRequests
from storage.store import RunRecord, TaskRecord

GGUF_TYPES = EXPORT_TYPES
WORKER_LIVE_S = 15.0  # a worker that beat within this long is running (idle workers beat every ~2 s)


class TaskKind(str, Enum):
    MERGED = "merged"  # `tunedeck export RUN --merged --dtype D`
    GGUF = "gguf"  # `tunedeck export RUN --gguf T`
    PUSH = "push"  # `tunedeck push RUN --repo R --what W [--private]`
    EVALUATE = EVALUATE_TASK  # `tunedeck evaluate RUN --tasks T` (benchmarks on the run and its base)
    JUDGE = JUDGE_TASK  # `tunedeck judge RUN --judge J` (a judge's win rate against the base)
    TRY_REWARDS = TRY_REWARDS_TASK  # `tunedeck grpo try --task ID` (a grpo spec's rewards on base samples; no run)

    @property
    def uses_gpu(self) -> bool:
        """Whether it loads a model (and so must not share a GPU with a training run)."""
        return self is not TaskKind.PUSH


EVALUATION_KINDS = (TaskKind.EVALUATE.value, TaskKind.JUDGE.value)  # the run page's Evaluate panel follows these


def cli_args(task: TaskRecord) -> list[str]:
    """The `tunedeck` arguments that carry the task out (what a user would type)."""
    kind, a, rid = TaskKind(task.kind), task.args, str(task.run_id)
    if kind is TaskKind.TRY_REWARDS:
        return ["grpo", "try", "--task", str(task.id)]
    if kind is TaskKind.MERGED:
        return ["export", rid, "--merged", "--dtype", str(a["dtype"])]
    if kind is TaskKind.GGUF:
        weighted = ["--imatrix"] if a.get("imatrix") else []
        return ["export", rid, "--gguf", str(a["gguf_type"]), *weighted] + (
            ["--calibration", str(a["calibration"])] if a.get("calibration") else []
        )
    if kind is TaskKind.EVALUATE:
        return ["evaluate", rid, "--tasks", str(a["tasks"])] + (["--judge", str(a["judge"])] if a.get("judge") else [])
    if kind is TaskKind.JUDGE:
        return ["judge", rid, "--judge", str(a["judge"])]
    argv = ["push", rid, "--repo", str(a["repo"]), "--what", str(a.get("what", "bundle"))]
    return argv + (["--private"] if a.get("private") else [])


def describe(task: TaskRecord) -> str:
    """The task in a few words: "merged fp32", "GGUF q8_0", "push bundle to alice/x"."""
    kind = TaskKind(task.kind)
    if kind is TaskKind.MERGED:
        return f"merged {task.args.get('dtype')}"
    if kind is TaskKind.GGUF:
        return f"GGUF {task.args.get('gguf_type')}" + (" (importance matrix)" if task.args.get("imatrix") else "")
    if kind is TaskKind.EVALUATE:
        judged = f", judged by {task.args['judge']}" if task.args.get("judge") else ""
        return f"benchmarks {task.args.get('tasks')}{judged}"
    if kind is TaskKind.JUDGE:
        return f"judged by {task.args.get('judge')}"
    if kind is TaskKind.TRY_REWARDS:
        return f"try rewards on {task.args.get('prompts')} prompts"
    return f"push {task.args.get('what', 'bundle')} to {task.args.get('repo')}"


def request_export(
    store: ExportRequests,
    run_id: int,
    merged: bool,
    dtype: str,
    gguf: Sequence[str],
    imatrix: bool = False,
    calibration: str | None = None,
) -> list[int]:
    """Queue the export tasks of one request: the merged model first, then each GGUF type (in GGUF_TYPES order);
    `imatrix`: its quantized types made with an importance matrix of `calibration` (a text file on the worker's
    machine; default: the run's training rows)."""
    problems = []
    if merged and dtype not in DTYPES:
        problems.append(Problem("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}", "pick bf16, fp16 or fp32"))
    unknown = [t for t in gguf if t not in GGUF_TYPES]
    if unknown:
        problems.append(Problem("gguf", f"{', '.join(unknown)} not one of {', '.join(GGUF_TYPES)}", "pick one of them"))
    problems += [Problem("gguf", problem, LLAMA_CPP_FIX) for t in gguf if (problem := llama_cpp_problem(t))]
    problems += [Problem(*p) for p in request_problems(list(gguf), imatrix, calibration)]
    problems += gguf_problems(store, run_id, gguf)  # a vision-language run: refused with llama.cpp's way out
    if gguf and not problems:
        problems += family_problems(store, run_id)  # a family neither GGUF writer knows, named
    if not merged and not gguf:
        problems.append(Problem("merged", "nothing chosen", "tick 'Merged model' and/or a GGUF type"))
    if problems:
        raise ExportError(problems)
    ids = [store.create_task(run_id, TaskKind.MERGED.value, {"dtype": dtype})] if merged else []
    ids += [
        store.create_task(run_id, TaskKind.GGUF.value, _gguf_args(t, imatrix, calibration))
        for t in GGUF_TYPES
        if t in gguf
    ]
    return ids


def _gguf_args(gguf_type: str, imatrix: bool, calibration: str | None) -> dict[str, Any]:
    """One GGUF task's arguments: its type, and the importance matrix it is made with (the calibration file's
    absolute path)."""
    if not uses_imatrix(gguf_type, imatrix):
        return {"gguf_type": gguf_type}
    from pathlib import Path

    return {
        "gguf_type": gguf_type,
        "imatrix": True,
        "calibration": str(Path(calibration).resolve()) if calibration else None,
    }


def request_push(store: ExportRequests, run_id: int, repo: str, what: str = "bundle", private: bool = False) -> int:
    """Queue a push (checked as `tunedeck push` checks it, before anything is queued)."""
    from jobs.export.push import check_repo_id, push_folder

    repo = check_repo_id(repo)
    push_folder(store, run_id, what)  # nothing to push: refused now, not on the worker
    return store.create_task(run_id, TaskKind.PUSH.value, {"repo": repo, "what": what, "private": bool(private)})


def request_evaluate(store: EvaluationRequests, run_id: int, tasks: str, judge: str | None = None) -> int:
    """Queue benchmark tasks on a finished run and its base (the task files checked first, rows named); `judge`:
    judged against its base by the same task (refused now when it has no samples)."""
    from jobs.data.bench_tasks import task_problems, task_refs
    from jobs.export.merged import finished_spec
    from jobs.spec.job import SpecError

    finished_spec(store, run_id)  # a run without a result is refused now, not on the worker
    problems = task_problems(tasks)
    if not task_refs(tasks):
        problems.append(Problem("eval_tasks", "names no task", "give a .jsonl of questions, a task .yaml or a name"))
    if problems:
        raise SpecError(problems)
    if judge and judge.strip():
        from jobs.evaluate.judge import sample_pairs

        sample_pairs(store, run_id)
    return store.create_task(run_id, TaskKind.EVALUATE.value, evaluate_args(tasks, judge))


def request_judge(store: EvaluationRequests, run_id: int, judge: str) -> int:
    """Queue a judge's win rate of a finished run against its base (refused now when it has no samples)."""
    from jobs.evaluate.judge import sample_pairs

    sample_pairs(store, run_id)
    return store.create_task(run_id, TaskKind.JUDGE.value, {"judge": judge.strip()})


def reach_problem(store: WorkerDirectory, run: RunRecord) -> Problem | None:
    """Why no running worker can carry out a task of `run` (its weights are on its host), or None."""
    workers = store.live_workers(within_s=WORKER_LIVE_S)
    host = run_host(run)
    if not workers:
        where = f" on host {host}" if host and not shared_data() else ""
        return Problem(
            "worker",
            "no worker is running, so nothing would carry this out (the dashboard never loads a model)",
            f"start `tunedeck worker`{where} (or `tunedeck serve` without --no-worker)",
        )
    if host is None or shared_data() or any(w.get("host") == host for w in workers):
        return None
    others = ", ".join(sorted({str(w.get("host")) for w in workers}))
    return Problem(
        "worker",
        f"no worker on host {host} is running; run {run.id}'s weights are in that host's data folder "
        f"(workers are running on {others})",
        f"start `tunedeck worker` on {host}, or set {SHARED_DATA_ENV}=1 on the workers and the dashboard "
        "when every host sees the same data folder",
    )


def task_summary(task: TaskRecord) -> dict[str, Any]:
    """The task as plain data (the CLI's --json and tests)."""
    return {
        "id": task.id,
        "run_id": task.run_id,
        "kind": task.kind,
        "args": task.args,
        "status": task.status.value,
        "worker_id": task.worker_id,
        "result": task.result,
        "error": task.error,
    }
