"""The `tunedeck` command line.

    tunedeck serve [--host 127.0.0.1] [--port 7860] [--no-worker] [--auth-file FILE]  # dashboard (+ worker)
    tunedeck hash-password [--user NAME]      # a `user:HASH` line for --auth-file (password on stdin)
    tunedeck worker [--burst] [--device N]    # take queued runs (burst: drain the queue, exit); N: its GPU
    tunedeck submit SPEC.yaml [--set k=v ...] # check and queue; prints the run id
    tunedeck run SPEC.yaml [--set k=v ...]    # submit, then follow it with a progress bar
    tunedeck runs [--status S] [--search TEXT] [--tag TAG] [--json]   # table of runs (--json: for scripts)
    tunedeck show RUN_ID                      # status, spec, metrics, memory, artifacts, error
    tunedeck cancel RUN_ID
    tunedeck resume RUN_ID                    # queue an interrupted/cancelled run again (from its checkpoint)
    tunedeck move RUN_ID --to N | --first     # reorder the queue
    tunedeck rm RUN_ID... [--yes]             # delete runs with their files (a running run: cancel first)
    tunedeck tag RUN_ID [TAG...] [--remove TAG] [--note TEXT]   # tags and a note per run
    tunedeck setup [--model NAME]             # fetch/convert a built-in model once
    tunedeck export RUN_ID --merged [--dtype bf16|fp16|fp32]   # adapter merged into its base, checked
    tunedeck export RUN_ID --gguf f16 [q8_0]                   # GGUF files for llama.cpp/Ollama, checked
    tunedeck sweep SPEC.yaml --steps N [--tricks a,b]  # probe runs per memory trick; --show ID: table
    tunedeck plan SPEC.yaml [--memory 24GiB] [--json] [--fit [24GiB]]  # predicted peak memory; a variant that fits
    tunedeck chat RUN_ID [--base] [--system TEXT] [--temperature T]  # talk to a finished run (stdin; /exit ends)
    tunedeck generate RUN_ID "prompt" [--base] [--max-new-tokens N] [--json]  # one answer, for scripts

`run` follows the run in the database. When no worker has announced itself in the last few
seconds it runs one inside this process (burst mode, stopping after this run); runs queued
earlier are taken first, in queue order. Exit code 0 when the run succeeded, 1 when it failed,
was cancelled or interrupted, 2 for bad input (one line per problem: field, problem, fix).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app.cli.usage import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUN_FAILED, UsageError, load_spec  # noqa: E402
from jobs.errors import Problem, ProblemError
from jobs.spec.stored import spec_of  # noqa: E402
from jobs.train import figures  # noqa: E402
from jobs.train.artifacts import bundle_of  # noqa: E402
from jobs.units import human_bytes  # noqa: E402
from storage.models import RunStatus  # noqa: E402
from storage.store import RunRecord, Store  # noqa: E402

WORKER_SEEN_WITHIN_S = 10.0


# ---------------------------------------------------------------------- input
def _run_or_fail(store: Store, run_id: int) -> RunRecord:
    run = store.get_run(run_id)
    if run is None:
        raise UsageError([Problem("RUN_ID", f"run {run_id} does not exist", "list runs with `tunedeck runs`")])
    return run


# ---------------------------------------------------------------------- formatting
def _duration(run: RunRecord) -> str:
    if run.started_at is None:
        return "-"
    seconds = (run.finished_at or time.time()) - run.started_at
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _number(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def runs_table(store: Store, runs: list[RunRecord]) -> str:
    from storage.run_files import DiskUsage

    header = ("ID", "STATUS", "NAME", "STEP", "LOSS", "CREATED", "TIME", "DISK", "TAGS")
    rows = []
    disk = DiskUsage(store)
    for r in runs:
        loss = store.last_metric(r.id, "loss")
        step = f"{r.current_step}/{r.total_steps}" if r.total_steps else str(r.current_step)
        rows.append(
            (
                str(r.id),
                r.status.value,
                r.name[:40],
                step,
                f"{loss.value:.4f}" if loss else "-",
                _when(r.created_at),
                _duration(r),
                human_bytes(disk.of(r)),
                ",".join(r.tags) or "-",
            )
        )
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (header, *rows))


def show_text(store: Store, run: RunRecord) -> str:
    lines = [
        f"run {run.id}: {run.name}",
        f"status:   {run.status.value}",
        f"created:  {_when(run.created_at)}   duration: {_duration(run)}",
        f"progress: step {run.current_step}" + (f" of {run.total_steps}" if run.total_steps else ""),
    ]
    if run.exit_code is not None:
        lines.append(f"exit code: {run.exit_code}")
    measured = figures.run_figures(store, run)
    lines += [f"{f.label + ':':<13}{measured.text(f)}" for f in figures.FIGURES if measured.text(f)]
    from jobs.memory.predict import prediction_error_text
    from jobs.queue.prediction import load_prediction

    predicted = prediction_error_text(load_prediction(store, run.id), run.peak_memory_bytes, run.peak_memory_source)
    if predicted:
        lines.append(f"{'memory:':<13}{predicted}")
    if run.error_summary:
        lines.append(f"error:    {run.error_summary}")
    if run.log_path:
        lines.append(f"log:      {run.log_path}")
    lines += ["", "spec:", *("  " + ln for ln in spec_of(run).to_yaml().splitlines())]
    lines += events_lines(store, run)
    data = (run.resolved_config or {}).get("data")
    if data:
        lines += [
            "",
            "data:",
            *(
                f"  {name}: {d['ref']}: {d['rows']} rows, {d['format']}"
                + (f" ({d['conversion']})" if d.get("conversion") else "")
                for name, d in data.items()
                if isinstance(d, dict)
            ),
        ]
        lines.append(f"  rows used: {data.get('train_rows')} train, {data.get('eval_rows')} eval")
    if run.final_metrics:
        lines += ["", "final metrics:", *(f"  {k}: {_number(v)}" for k, v in run.final_metrics.items())]
    arts = store.artifacts(run.id)
    if arts:
        lines += ["", "artifacts:", *(f"  {a.kind}: {a.path} ({human_bytes(a.size)})" for a in arts)]
    if run.error_detail:
        lines += ["", "error detail:", *("  " + ln for ln in run.error_detail.splitlines())]
    return "\n".join(lines)


def events_lines(store: Store, run: RunRecord) -> list[str]:
    """The run's events (OOM recoveries) and the spec fields it continued with."""
    from jobs.train import oom

    events = store.run_events(run.id)
    if not events:
        return []
    out = ["", "events:", *(f"  {_when(e['time'])}  {e['message']}" for e in events)]
    changed = oom.changes(spec_of(run), oom.effective_spec(store, run.id, spec_of(run)))
    if changed:
        out += [
            "",
            "continued with (spec above as submitted):",
            *(f"  {k}: {before} -> {after}" for k, (before, after) in changed.items()),
        ]
    return out


# ---------------------------------------------------------------------- commands
def cmd_submit(store: Store, args: argparse.Namespace) -> int:
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
        run = _run_or_fail(store, run_id)
    finally:
        if thread is not None:
            thread.join(timeout=60)
    print(f"run {run.id}: {run.status.value} after {_duration(run)}", file=sys.stderr)
    if run.status is not RunStatus.SUCCEEDED:
        if run.error_summary:
            print(f"error: {run.error_summary}", file=sys.stderr)
        if run.log_path:
            print(f"log: {run.log_path}", file=sys.stderr)
        return EXIT_RUN_FAILED
    bundle = bundle_of(store, run.id)
    print(f"bundle: {bundle}" if bundle else "no artifacts were recorded", file=sys.stderr)
    return EXIT_OK


def follow(
    store: Store, run_id: int, worker_thread: threading.Thread | None = None, interval: float = 0.5
) -> RunRecord:
    """Show a progress bar until the run finishes; prints each status change."""
    from tqdm import tqdm

    status: RunStatus | None = None
    with tqdm(total=None, unit="step", dynamic_ncols=True, file=sys.stderr) as bar:
        while True:
            run = _run_or_fail(store, run_id)
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
                run = _run_or_fail(store, run_id)
                if run.status.finished:
                    return run
                raise RuntimeError(f"the in-process worker stopped while run {run_id} was {run.status.value}")
            time.sleep(interval)


def _queue_position(store: Store, run_id: int) -> int:
    ids = [r.id for r in store.queued()]
    return ids.index(run_id) + 1 if run_id in ids else 0


def cmd_runs(store: Store, args: argparse.Namespace) -> int:
    status = None
    if args.status:
        try:
            status = RunStatus(args.status.lower())
        except ValueError:
            choices = ", ".join(s.value for s in RunStatus)
            raise UsageError([Problem("--status", f"`{args.status}` is not a run status", f"use one of: {choices}")])
    runs = store.list_runs(status=status, limit=args.limit, search=args.search, tag=args.tag)
    if args.json:
        import json

        from app.manage import summaries

        print(json.dumps(summaries(store, runs), indent=2))
        return EXIT_OK
    from storage.run_files import total_bytes

    if not runs:
        print("no runs")
        return EXIT_OK
    print(runs_table(store, runs))
    print(f"\nall {store.count_runs()} run(s) use {human_bytes(total_bytes(store))} on disk")
    return EXIT_OK


def cmd_show(store: Store, args: argparse.Namespace) -> int:
    print(show_text(store, _run_or_fail(store, args.run_id)))
    return EXIT_OK


def cmd_cancel(store: Store, args: argparse.Namespace) -> int:
    run = _run_or_fail(store, args.run_id)
    if run.status.finished:
        print(f"run {run.id} already {run.status.value}; nothing to cancel")
        return EXIT_OK
    new = store.request_cancel(run.id)
    print(
        f"run {run.id}: cancelled"
        if new is RunStatus.CANCELLED
        else f"run {run.id}: cancel requested; the worker stops it within a few seconds"
    )
    return EXIT_OK


def cmd_resume(store: Store, args: argparse.Namespace) -> int:
    from jobs.train.checkpoints import resume

    try:
        print(resume(store, _run_or_fail(store, args.run_id)))
    except ValueError as exc:
        raise UsageError([Problem("RUN_ID", str(exc), "resume an interrupted or cancelled run, or submit again")])
    return EXIT_OK


def cmd_move(store: Store, args: argparse.Namespace) -> int:
    run = _run_or_fail(store, args.run_id)
    position = 0 if args.first else (args.to or 1) - 1
    if not store.move_queued(run.id, position):
        raise UsageError([Problem("RUN_ID", f"run {run.id} is {run.status.value}, not queued", "move a queued run")])
    order = [r.id for r in store.queued()]
    print(f"run {run.id}: position {order.index(run.id) + 1} of {len(order)} in the queue")
    return EXIT_OK


def cmd_sweep(store: Store, args: argparse.Namespace) -> int:
    from app.cli.sweep import sweep_command

    queueing = args.spec and args.show is None and not args.list
    return sweep_command(store, args, load_spec(args.spec, args.set) if queueing else None)


def cmd_worker(store: Store, args: argparse.Namespace) -> int:
    from jobs.worker.loop import Worker

    done = Worker(store, exit_with_parent=args.exit_with_parent, device=args.device).work(burst=args.burst)
    if args.burst:
        print(f"worker: {done} run(s) done", file=sys.stderr)
    return EXIT_OK


def cmd_serve(store: Store, args: argparse.Namespace) -> int:
    from app.server import serve

    store.dispose()  # the server opens its own store
    return serve(host=args.host, port=args.port, with_worker=not args.no_worker, auth_file=args.auth_file)


def cmd_hash_password(store: Store, args: argparse.Namespace) -> int:
    """Print a `user:HASH` line (or the hash alone) for an --auth-file; the password is read from stdin."""
    import getpass

    from app.auth import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise UsageError([Problem("password", "the two entries differ", "type the same password twice")])
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if len(password) < 8:
        raise UsageError([Problem("password", "is shorter than 8 characters", "choose a longer password")])
    encoded = hash_password(password)
    print(f"{args.user}:{encoded}" if args.user else encoded)
    return EXIT_OK


def cmd_export(store: Store, args: argparse.Namespace) -> int:
    from jobs.export.merged import export_merged

    if not args.merged and not args.gguf:
        raise UsageError(
            [
                Problem(
                    "--merged",
                    "no export format chosen",
                    "add --merged (the adapter merged into "
                    "its base model) or --gguf f16|q8_0; the adapter alone is the run's bundle",
                )
            ]
        )
    logging.getLogger("jobs.export.merged").setLevel(logging.INFO)  # progress: loading, answering, merging, saving
    if args.merged:
        result = export_merged(store, args.run_id, args.dtype)
        check = result.check
        print(f"run {args.run_id}: merged model ({result.dtype}) in {result.folder}")
        print(
            f"check: {check.rule}: passed; token agreement {check.token_agreement:.1%}, "
            f"largest logit difference {check.max_logit_diff:.3g}"
        )
        for note in result.notes:
            print(f"note: {note}")
        print(f"download: {result.archive}  sha256 {result.sha256}")
    if args.gguf:
        from jobs.export.gguf import export_gguf

        for gguf_type in dict.fromkeys(args.gguf):
            gguf = export_gguf(store, args.run_id, gguf_type)
            print(f"run {args.run_id}: {gguf_type} GGUF from {gguf.source}")
            print(
                f"check ({gguf.check.rule}): passed; answer token agreement {gguf.check.token_agreement:.1%}, "
                f"next-token agreement {gguf.check.forced_agreement:.1%}, "
                f"largest logit difference {gguf.check.max_logit_diff:.3g}"
            )
            print(f"download: {gguf.path}  sha256 {gguf.sha256}")
    return EXIT_OK


def cmd_setup(store: Store, args: argparse.Namespace) -> int:
    from jobs.models import references as models

    print(f"preparing built-in model {args.model} (first time: download and convert, may take a minute)...")
    ensure = getattr(models, "ensure_builtin", None)
    path = ensure(args.model) if ensure else models.resolve_model(args.model).path
    print(f"model {args.model} ready at {path}")
    return EXIT_OK


# ---------------------------------------------------------------------- entry point
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tunedeck", description="Fine-tune a language model on one GPU.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="start the dashboard (and a worker process)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=7860)
    s.add_argument("--no-worker", action="store_true", help="do not start a worker process")
    s.add_argument(
        "--auth-file",
        default=None,
        metavar="FILE",
        help="require a login; FILE has `user:HASH` lines from `tunedeck hash-password` "
        "(or set TUNEDECK_AUTH=user:password)",
    )
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("hash-password", help="hash a password (read from stdin) for serve --auth-file")
    s.add_argument("--user", default=None, help="print a complete `user:HASH` line")
    s.set_defaults(func=cmd_hash_password)

    s = sub.add_parser("worker", help="take queued runs and train them, one at a time")
    s.add_argument("--burst", action="store_true", help="drain the queue, then exit")
    s.add_argument(
        "--device",
        default=None,
        help="the GPU this worker owns (index or UUID; default TUNEDECK_DEVICE): its training "
        "processes see only it (CUDA_VISIBLE_DEVICES), and one run at a time holds it",
    )
    s.add_argument("--exit-with-parent", type=int, default=None, help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_worker)

    for name, func, text in (
        ("submit", cmd_submit, "check a YAML spec and queue it; prints the run id"),
        ("run", cmd_run, "submit a YAML spec and follow the run until it ends"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("spec", metavar="SPEC.yaml")
        s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
        s.set_defaults(func=func)

    s = sub.add_parser("runs", help="list runs")
    s.add_argument("--status", help="only runs with this status")
    s.add_argument("--limit", type=int, default=50)
    s.add_argument("--search", default=None, metavar="TEXT", help="only runs whose name, tags or note contain TEXT")
    s.add_argument("--tag", default=None, metavar="TAG", help="only runs tagged TAG")
    s.add_argument("--json", action="store_true", help="print a JSON list (id, status, tags, note, disk_bytes, ...)")
    s.set_defaults(func=cmd_runs)

    for name, func, text in (
        ("show", cmd_show, "show one run"),
        ("cancel", cmd_cancel, "cancel a queued or running run"),
        (
            "resume",
            cmd_resume,
            "queue an interrupted/cancelled run again; it continues from its last complete checkpoint",
        ),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("run_id", type=int, metavar="RUN_ID")
        s.set_defaults(func=func)

    s = sub.add_parser("move", help="reorder the queue: move a queued run")
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", type=int, metavar="N", help="to position N (1 = next to run)")
    where.add_argument("--first", action="store_true", help="to the front of the queue")
    s.set_defaults(func=cmd_move)

    s = sub.add_parser(
        "export",
        help="export a finished run: --merged merges its adapter into the base model, --gguf writes GGUF files",
    )
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    s.add_argument("--merged", action="store_true", help="merge the adapter into a 16-bit (or fp32) base and check it")
    s.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="dtype of the merged weights")
    s.add_argument(
        "--gguf",
        nargs="+",
        choices=("f16", "q8_0"),
        metavar="TYPE",
        help="also (or only) write GGUF files for llama.cpp/Ollama: f16, q8_0 or both; each is loaded "
        "back and checked against the merged model",
    )
    s.set_defaults(func=cmd_export)

    from app.cli.manage import add_parsers

    add_parsers(sub)

    s = sub.add_parser("setup", help="download/convert a built-in model once")
    s.add_argument("--model", default="smollm2-135m-instruct")
    s.set_defaults(func=cmd_setup)

    from app.cli.sweep import add_parser as add_sweep_parser

    add_sweep_parser(sub).set_defaults(func=cmd_sweep)

    from app.cli.plan import add_parser as add_plan_parser

    add_plan_parser(sub)

    from app.cli.chat import add_parser as add_chat_parsers

    add_chat_parsers(sub)

    from app.cli.push import add_parser as add_push_parser

    add_push_parser(sub)
    return p


def print_problems(problems: Sequence[Problem]) -> None:
    print(f"tunedeck: {len(problems)} problem(s):", file=sys.stderr)
    for p in problems:
        print(f"  {p.field}: {p.problem}. Fix: {p.fix}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.command in ("worker", "serve") else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    store = Store()
    try:
        return args.func(store, args)
    except BrokenPipeError:  # `tunedeck show 1 | head`
        sys.stderr.close()
        return EXIT_OK
    except ProblemError as exc:  # a spec, a flag, a model, data, a file, a run: the input is at fault
        print_problems(exc.problems)
        return EXIT_BAD_INPUT
    finally:
        store.dispose()


if __name__ == "__main__":
    sys.exit(main())
