"""The `tunedeck` command line.

    tunedeck serve [--host 127.0.0.1] [--port 7860] [--no-worker] [--auth-file FILE]  # dashboard (+ worker)
                   [--allowed-host NAME] [--insecure-no-login] [--allow-remote-code] [--allow-reward-function]
    tunedeck hash-password [--user NAME]      # a `user:HASH` line for --auth-file (password on stdin)
    tunedeck worker [--burst] [--device N] [--share N] [--share-margin 10%]  # take queued runs (burst: drain
                                              # the queue, exit); N: its GPU; --share: runs side by side
    tunedeck worker --executor slurm|ray [--partition P] [--account A] [--time-limit T] [--qos Q]
                    [--gpu-type TYPE] [--max-jobs N]  # hand runs to the cluster's scheduler (docs/cluster.md)
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
    tunedeck search SPEC.yaml --space F=VALUES --trials N  # hyperparameter search; show|best|list ID
    tunedeck plan SPEC.yaml [--memory 24GiB] [--json] [--fit [24GiB]]  # predicted peak memory; a variant that fits
    tunedeck import FILE [--from TOOL] [--dataset-dir DIR] [--set k=v ...] [-o SPEC.yaml]  # LLaMA-Factory/axolotl/trl config -> spec
    tunedeck chat RUN_ID [--base] [--image PICTURE] [--system TEXT]  # talk to a finished run (stdin; /exit ends)
    tunedeck generate RUN_ID "prompt" [--base] [--image PICTURE] [--json]  # one answer, for scripts
    tunedeck migrate-data [--from DIR] [--to DIR]   # move an earlier version's ./data to the user data folder
    tunedeck data audit SPEC.yaml [--set k=v ...] [--json]  # duplicates, eval overlap, empty answers, ... in the data
    tunedeck data show SPEC.yaml [--row N] [--rows K] [--set k=v ...]  # each training token, trained or masked
    tunedeck mcp [--any-path]                 # tunedeck's tools for agents over stdio (Model Context Protocol)
    tunedeck pairs [export NAME [--kind dpo|kto] [-o FILE]]  # preference data sets made in the Chat tab
    tunedeck grpo try SPEC.yaml [--prompts N] [--set k=v ...] [--json]  # a grpo spec's rewards on base samples

`run` follows the run in the database. When no worker has announced itself in the last few
seconds it runs one inside this process (burst mode, stopping after this run); runs queued
earlier are taken first, in queue order. Exit code 0 when the run succeeded, 1 when it failed,
was cancelled or interrupted, 2 for bad input (one line per problem: field, problem, fix).

This module is the argument parser, the entry point and the serve/worker commands; the others
live by kind: `app.cli.cluster` (the worker's cluster executors), `app.cli.runs` (submit ... move,
sweep; shown by `app.cli.show`), `app.cli.export` (export, setup), `app.cli.manage`, `app.cli.plan`, `app.cli.chat`, `app.cli.push`, `app.cli.importer`. Each command
gets only the store it needs (`app.cli.usage.StoreUse`): `hash-password`, `setup` and `serve` (the
server opens its own) none, `plan` one only when its database exists, so none of them creates a
database; `--help` opens nothing.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app.cli.usage import EXIT_BAD_INPUT, EXIT_OK, StoreUse, UsageError  # noqa: E402
from jobs.errors import Problem, ProblemError  # noqa: E402
from jobs.export.llamacpp import EXPORT_TYPES  # noqa: E402
from storage.settings import database_url, missing_sqlite_database, sqlite_database_file  # noqa: E402

if TYPE_CHECKING:
    from storage.store import Store


def _command(module: str, name: str) -> Callable[[Store | None, argparse.Namespace], int]:
    """Command `name` of `module`, imported when it runs: each command pays only for its own imports (`plan`
    reads a config.json; `runs`, `export` and the store bring SQLAlchemy, torch, ...)."""

    def run(store: Store | None, args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), name)(store, args)

    run.__name__ = name
    return run


# ---------------------------------------------------------------------- serve and worker
def cmd_worker(store: Store, args: argparse.Namespace) -> int:
    from app.cli import cluster

    if args.executor != "local":
        return cluster.cmd_dispatch(store, args)  # a cluster's scheduler runs the runs (app.cli.cluster)
    if cluster.problems(args):
        raise UsageError(cluster.problems(args))
    from jobs.search.driver import SearchService
    from jobs.worker.chat_service import chat_service
    from jobs.worker.loop import Worker
    from jobs.worker.services import Factory
    from jobs.worker.share import ShareError, SharePolicy
    from jobs.worker.task_service import task_service

    services: list[Factory] = [  # what the dashboard asks of a worker besides training (jobs.worker.services)
        task_service,  # exports and pushes (jobs.worker.task_service)
        chat_service,  # chat replies (jobs.worker.chat_service)
        lambda place: SearchService(place.store, place.worker_id),  # hyperparameter searches (jobs.search.driver)
    ]
    try:
        share = SharePolicy.parse(args.share, args.share_margin)
    except ShareError as exc:
        raise UsageError([Problem(exc.flag, exc.problem, exc.fix)]) from exc
    worker = Worker(store, exit_with_parent=args.exit_with_parent, device=args.device, share=share, services=services)
    done = worker.work(burst=args.burst)
    if args.burst:
        print(f"worker: {done} run(s) done", file=sys.stderr)
    return EXIT_OK


def cmd_serve(_store: None, args: argparse.Namespace) -> int:
    from app.server import serve
    from jobs.checks.access import REMOTE_CODE_ENV, REWARD_FUNCTION_ENV

    # The dashboard's policy (jobs.checks.access) reads these; its worker inherits them, harmlessly.
    for flag, name in ((args.allow_remote_code, REMOTE_CODE_ENV), (args.allow_reward_function, REWARD_FUNCTION_ENV)):
        if flag:
            os.environ[name] = "1"
    # The worker's trackers (report_to) link back to the run's page here, unless TUNEDECK_URL names the public address.
    os.environ.setdefault("TUNEDECK_URL", f"http://{args.host}:{args.port}")
    return serve(
        host=args.host,
        port=args.port,
        with_worker=not args.no_worker,
        auth_file=args.auth_file,
        allowed_hosts=args.allowed_host,
        insecure_no_login=args.insecure_no_login,
    )


def build_parser() -> argparse.ArgumentParser:
    """Every command: the dashboard and worker here, the others from their modules (each adds its own)."""
    p = argparse.ArgumentParser(prog="tunedeck", description="Fine-tune a language model on one GPU.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_service_parsers(sub)
    _add_run_parsers(sub)
    from app.cli.chat import add_parser as add_chat_parsers
    from app.cli.data_home import add_parser as add_migrate_parser
    from app.cli.evaluate import add_parser as add_evaluate_parser
    from app.cli.grpo import add_parser as add_grpo_parser
    from app.cli.importer import add_parser as add_import_parser
    from app.cli.manage import add_parsers as add_manage_parsers
    from app.cli.mcp import add_parser as add_mcp_parser
    from app.cli.pairs import add_parser as add_pairs_parser
    from app.cli.plan import add_parser as add_plan_parser
    from app.cli.push import add_parser as add_push_parser
    from app.cli.search import add_parser as add_search_parser
    from app.cli.sweep import add_parser as add_sweep_parser

    add_manage_parsers(sub)
    add_evaluate_parser(sub)  # evaluate and judge
    s = sub.add_parser("setup", help="download/convert a built-in model once")
    s.add_argument("--model", default="smollm2-135m-instruct")
    s.set_defaults(func=_command("app.cli.export", "cmd_setup"), store_use=StoreUse.NONE)
    add_sweep_parser(sub).set_defaults(func=_command("app.cli.runs", "cmd_sweep"))
    add_mcp_parser(sub).set_defaults(func=_command("app.cli.mcp", "cmd_mcp"))
    add_pairs_parser(sub).set_defaults(func=_command("app.cli.pairs", "cmd_pairs"), store_use=StoreUse.NONE)
    add_search_parser(sub).set_defaults(func=_command("app.cli.search", "search_command"))
    for add in (
        add_plan_parser,
        add_grpo_parser,
        add_import_parser,
        add_chat_parsers,
        add_push_parser,
        add_migrate_parser,
    ):
        add(sub)
    _add_data_parsers(sub)
    return p


def _add_data_parsers(sub: argparse._SubParsersAction) -> None:
    """The `data` group: each subcommand from its own module (`app.cli.data_audit`: audit, `app.cli.data_show`: show)."""
    from app.cli.data_audit import add_parsers as add_data_audit_parsers
    from app.cli.data_show import add_parsers as add_data_show_parsers

    data = sub.add_parser("data", help="look at the job's data as training will see it")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    add_data_audit_parsers(data_sub)
    add_data_show_parsers(data_sub)


def _add_service_parsers(sub: argparse._SubParsersAction) -> None:
    """serve, hash-password and worker (its cluster executors' options come from `app.cli.cluster`)."""
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
    s.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the dashboard answers to besides 127.0.0.1/localhost (repeatable; or "
        "TUNEDECK_ALLOWED_HOSTS=a,b): the name users type, e.g. deck.example.com",
    )
    s.add_argument(
        "--insecure-no-login",
        action="store_true",
        help="serve a non-loopback --host with no login and no access token (anyone who reaches it can use it)",
    )
    s.add_argument(
        "--allow-remote-code",
        action="store_true",
        help="let dashboard users train models that run their own Python code (trust_remote_code)",
    )
    s.add_argument(
        "--allow-reward-function",
        action="store_true",
        help="let dashboard users submit a custom GRPO reward_function (Python run in training)",
    )
    s.set_defaults(func=cmd_serve, store_use=StoreUse.NONE)  # the server opens its own store

    s = sub.add_parser("hash-password", help="hash a password (read from stdin) for serve --auth-file")
    s.add_argument("--user", default=None, help="print a complete `user:HASH` line")
    s.set_defaults(func=_command("app.cli.passwords", "cmd_hash_password"), store_use=StoreUse.NONE)

    s = sub.add_parser("worker", help="take queued runs and train them, one at a time")
    s.add_argument(
        "--burst",
        action="store_true",
        help="drain the queue (runs, and the exports, pushes and chat turns this worker can carry out), then exit",
    )
    s.add_argument(
        "--device",
        default=None,
        help="the GPU this worker owns (index or UUID; default TUNEDECK_DEVICE): its training "
        "processes see only it (CUDA_VISIBLE_DEVICES), and one run at a time holds it",
    )
    s.add_argument(
        "--share",
        type=int,
        default=1,
        metavar="N",
        help="at most N runs on the device at once: runs with share_device: true train side by side while "
        "their predicted peaks plus the margin fit its memory (default 1: one run at a time)",
    )
    s.add_argument(
        "--share-margin",
        default="10%",
        metavar="SIZE",
        help="what each shared run reserves above its predicted peak: a percentage of it (10%%) or a size (2GiB)",
    )
    from app.cli.cluster import add_options as add_cluster_options

    add_cluster_options(s)
    s.add_argument("--exit-with-parent", type=int, default=None, help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_worker)


def _add_run_parsers(sub: argparse._SubParsersAction) -> None:
    """submit, run, runs, show, cancel, resume, move and export (`app.cli.runs`, `app.cli.export`)."""

    for name, func, text in (
        ("submit", _command("app.cli.runs", "cmd_submit"), "check a YAML spec and queue it; prints the run id"),
        ("run", _command("app.cli.runs", "cmd_run"), "submit a YAML spec and follow the run until it ends"),
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
    s.set_defaults(func=_command("app.cli.runs", "cmd_runs"))

    for name, func, text in (
        ("show", _command("app.cli.runs", "cmd_show"), "show one run"),
        ("cancel", _command("app.cli.runs", "cmd_cancel"), "cancel a queued or running run"),
        (
            "resume",
            _command("app.cli.runs", "cmd_resume"),
            "queue an interrupted/cancelled run again; it continues from its last complete checkpoint",
        ),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("run_id", type=int, metavar="RUN_ID")
        s.set_defaults(func=func)

    s = sub.add_parser("clone", help="queue a run's spec again as a new run; prints its id")
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    s.add_argument("--fix", type=int, metavar="N", help="with the spec change of finding N (`tunedeck show`) applied")
    s.set_defaults(func=_command("app.cli.runs", "cmd_clone"))

    s = sub.add_parser("move", help="reorder the queue: move a queued run")
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", type=int, metavar="N", help="to position N (1 = next to run)")
    where.add_argument("--first", action="store_true", help="to the front of the queue")
    s.set_defaults(func=_command("app.cli.runs", "cmd_move"))

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
        choices=EXPORT_TYPES,
        metavar="TYPE",
        help="also (or only) write GGUF files for llama.cpp/Ollama: f16, q8_0 (tunedeck's writer), q4_k_m, "
        "q5_k_m, q6_k (llama.cpp's quantizer: needs llama-cpp-python), iq4_xs (with an importance matrix); each is "
        "loaded back and checked against the merged model",
    )
    s.add_argument(
        "--imatrix",
        action="store_true",
        help="quantize the K-quant types with an importance matrix (llama.cpp's llama-imatrix over calibration "
        "text: the run's training rows, or --calibration; built by `./dev.sh gguf`)",
    )
    s.add_argument("--calibration", metavar="FILE", help="the importance matrix's calibration text (UTF-8)")
    from app.cli.tasks import add_flag as add_on_worker_flag

    add_on_worker_flag(s)
    s.set_defaults(func=_command("app.cli.export", "cmd_export"))


def print_problems(problems: Sequence[Problem]) -> None:
    print(f"tunedeck: {len(problems)} problem(s):", file=sys.stderr)
    for p in problems:
        print(f"  {p.field}: {p.problem}. Fix: {p.fix}", file=sys.stderr)


def open_store(use: StoreUse) -> Store | None:
    """The store a command needs (`StoreUse`): opened, opened if its database exists, or none at all."""
    if use is StoreUse.NONE:
        return None
    if use is StoreUse.EXISTING:
        default = sqlite_database_file()  # without TUNEDECK_DATABASE_URL: no need to parse a URL (SQLAlchemy)
        if default is not None and not default.is_file():
            return None  # a fresh home: nothing to read, and nothing is created
        if default is None and missing_sqlite_database(database_url()):
            return None
    from storage.store import Store

    return Store()


def hint_legacy_data(command: str) -> None:
    """An earlier version's ./data next to the user: say where the data lives now and how to move it."""
    from storage.data_home import legacy_data_dir, migration_hint

    legacy = legacy_data_dir() if command != "migrate-data" else None
    if legacy is not None:
        print(migration_hint(legacy), file=sys.stderr)


def watch_parent() -> None:
    """A command a worker started for a task (TUNEDECK_STOP_WITH_PARENT set) ends when that worker dies."""
    from jobs.train.parent_watch import stop_with_parent

    stop_with_parent(lambda signum, frame: sys.exit(128 + signum))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, open the store the command needs, run it; returns the exit code."""
    args = build_parser().parse_args(argv)
    watch_parent()
    hint_legacy_data(args.command)
    logging.basicConfig(
        level=logging.INFO if args.command in ("worker", "serve") else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    store = open_store(getattr(args, "store_use", StoreUse.OPEN))
    try:
        return args.func(store, args)
    except BrokenPipeError:  # `tunedeck show 1 | head`
        sys.stderr.close()
        return EXIT_OK
    except ProblemError as exc:  # a spec, a flag, a model, data, a file, a run: the input is at fault
        print_problems(exc.problems)
        return EXIT_BAD_INPUT
    finally:
        if store is not None:
            store.dispose()


if __name__ == "__main__":
    sys.exit(main())
