"""The commands about runs: submit, run (and follow), runs, show, cancel, resume, move, sweep.

    tunedeck submit SPEC.yaml [--set k=v ...]   # check and queue; prints the run id
    tunedeck run SPEC.yaml [--set k=v ...]      # submit, then follow it with a progress bar
    tunedeck runs | show RUN_ID | cancel RUN_ID | resume RUN_ID | move RUN_ID --to N

`run` follows the run in the database. When no worker has announced itself in the last few
seconds it runs one inside this process (burst mode, stopping after this run). A run with
`eval_tasks` then has its benchmark tasks followed too (carried out here when this process ran the
worker) and ends with their table, base beside run. Each command is
`cmd_<name>(store, args)`; `app.cli.main` parses the arguments and opens the store.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from app.cli.show import duration, run_or_fail, runs_table, show_text
from app.cli.usage import EXIT_OK, EXIT_RUN_FAILED, UsageError, load_spec
from jobs.errors import Problem
from jobs.train.artifacts import bundle_of
from jobs.units import human_bytes
from storage.models import RunStatus
from storage.roles import QueueReader, Sweeps
from storage.roles_pages import RunFollowing, RunReport
from storage.roles_queue import QueueOrder, RunActing, Submitting
from storage.store import RunRecord, Store

WORKER_SEEN_WITHIN_S = 10.0


def cmd_submit(store: Submitting, args: argparse.Namespace) -> int:
    from jobs.queue.submit import submit

    run_id = submit(store, load_spec(args.spec, args.set))
    print(run_id)
    return EXIT_OK


def cmd_run(store: Store, args: argparse.Namespace) -> int:
    from jobs.queue.submit import submit

    run_id = submit(store, load_spec(args.spec, args.set))
    print(f"queued run {run_id}", file=sys.stderr)
    worker = thread = None
    if not store.live_workers(WORKER_SEEN_WITHIN_S):
        from jobs.worker.loop import Worker

        print("no worker is running: running one in this process", file=sys.stderr)
        worker = Worker(store)
        thread = threading.Thread(
            target=worker.work, kwargs={"burst": True, "stop_after": run_id}, name="tunedeck-worker", daemon=True
        )
        thread.start()
    try:
        run = follow(store, run_id, worker_thread=thread)
    except KeyboardInterrupt:
        if worker is None:
            print(
                f"\nstopped following; run {run_id} continues (cancel it with `tunedeck cancel {run_id}`)",
                file=sys.stderr,
            )
            return EXIT_RUN_FAILED
        print("\ninterrupted: stopping the training process", file=sys.stderr)
        worker.stop("interrupted from the keyboard")
        assert thread is not None
        thread.join()
        run = run_or_fail(store, run_id)
    finally:
        if thread is not None:
            thread.join(timeout=60)
    print(f"run {run.id}: {run.status.value} after {duration(run)}", file=sys.stderr)
    if run.status is not RunStatus.SUCCEEDED:
        if run.error_summary:
            print(f"error: {run.error_summary}", file=sys.stderr)
        if run.log_path:
            print(f"log: {run.log_path}", file=sys.stderr)
        return EXIT_RUN_FAILED
    bundle = bundle_of(store, run.id)
    print(f"bundle: {bundle}" if bundle else "no artifacts were recorded", file=sys.stderr)
    from app.cli.evaluate import evaluations_after_run

    return evaluations_after_run(store, run.id, worker)  # eval_tasks: base vs run, scored and printed


def follow(
    store: RunFollowing, run_id: int, worker_thread: threading.Thread | None = None, interval: float = 0.5
) -> RunRecord:
    """Show a progress bar until the run finishes; prints each status change."""
    from tqdm import tqdm

    status: RunStatus | None = None
    with tqdm(total=None, unit="step", dynamic_ncols=True, file=sys.stderr) as bar:
        while True:
            run = run_or_fail(store, run_id)
            if run.status is not status and not run.status.finished:  # the end is reported by the caller
                status = run.status
                extra = (
                    f" (position {_queue_position(store, run_id)} in the queue)" if status is RunStatus.QUEUED else ""
                )
                bar.write(f"run {run_id}: {status.value}{extra}", file=sys.stderr)
            if run.total_steps and bar.total != run.total_steps:
                bar.total = run.total_steps
            if run.current_step != bar.n:
                bar.n = run.current_step
                loss = store.last_metric(run_id, "loss")
                if loss is not None:
                    bar.set_postfix(loss=f"{loss.value:.4f}", refresh=False)
                bar.refresh()
            if run.status.finished:
                return run
            if worker_thread is not None and not worker_thread.is_alive():
                run = run_or_fail(store, run_id)
                if run.status.finished:
                    return run
                raise RuntimeError(f"the in-process worker stopped while run {run_id} was {run.status.value}")
            time.sleep(interval)


def _queue_position(store: QueueReader, run_id: int) -> int:
    ids = [r.id for r in store.queued()]
    return ids.index(run_id) + 1 if run_id in ids else 0


def cmd_runs(store: RunReport, args: argparse.Namespace) -> int:
    status = None
    if args.status:
        try:
            status = RunStatus(args.status.lower())
        except ValueError:
            choices = ", ".join(s.value for s in RunStatus)
            raise UsageError(
                [Problem("--status", f"`{args.status}` is not a run status", f"use one of: {choices}")]
            ) from None
    runs = store.list_runs(status=status, limit=args.limit, search=args.search, tag=args.tag)
    if args.json:
        import json

        from app.run_summaries import summaries

        print(json.dumps(summaries(store, runs), indent=2))
        return EXIT_OK
    from storage.run_files import total_bytes

    if not runs:
        print("no runs")
        return EXIT_OK
    print(runs_table(store, runs))
    print(f"\nall {store.count_runs()} run(s) use {human_bytes(total_bytes(store))} on disk")
    return EXIT_OK


def cmd_show(store: RunReport, args: argparse.Namespace) -> int:
    print(show_text(store, run_or_fail(store, args.run_id)))
    return EXIT_OK


def cmd_clone(store: RunActing, args: argparse.Namespace) -> int:
    from jobs.queue.run_actions import clone
    from jobs.queue.submit import submit

    print(submit(store, clone(store, args.run_id, fix=args.fix)))
    return EXIT_OK


def cmd_cancel(store: RunActing, args: argparse.Namespace) -> int:
    from jobs.queue.run_actions import CancelResult, cancel

    done = cancel(store, args.run_id)
    requested = done.result is CancelResult.REQUESTED
    print(done.message + ("; the worker stops it within a few seconds" if requested else ""))
    return EXIT_OK


def cmd_resume(store: RunActing, args: argparse.Namespace) -> int:
    from jobs.queue.run_actions import resume

    print(resume(store, args.run_id).message)
    return EXIT_OK


def cmd_move(store: QueueOrder, args: argparse.Namespace) -> int:
    run = run_or_fail(store, args.run_id)
    position = 0 if args.first else (args.to or 1) - 1
    if not store.move_queued(run.id, position):
        raise UsageError([Problem("RUN_ID", f"run {run.id} is {run.status.value}, not queued", "move a queued run")])
    order = [r.id for r in store.queued()]
    print(f"run {run.id}: position {order.index(run.id) + 1} of {len(order)} in the queue")
    return EXIT_OK


def cmd_sweep(store: Sweeps, args: argparse.Namespace) -> int:
    from app.cli.sweep import sweep_command

    queueing = args.spec and args.show is None and not args.list
    return sweep_command(store, args, load_spec(args.spec, args.set) if queueing else None)
