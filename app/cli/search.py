"""`tunedeck search`: start a hyperparameter search, show it, launch its best settings in full.

    tunedeck search SPEC.yaml --space 'learning_rate=loguniform(1e-5,1e-3)' --space 'lora_r=[8,16]' \\
        --trials 8 --objective eval_loss --steps 50 [--parallel 2] [--sampler tpe] [--pruner median]
    tunedeck search show 3          # trials table, best so far, parameter importance
    tunedeck search best 3 --launch # queue the best settings as a full run
    tunedeck search list

A worker drives the search (`tunedeck worker`; `--burst` returns when the search has ended): it queues the
trials as ordinary runs tagged `search-<id>`, prunes the weak ones and refuses a point that will not fit.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from jobs.errors import Problem
from jobs.spec.job import SpecError

if TYPE_CHECKING:  # the parser is built for every command: no store imported for it
    from storage.roles_queue import SearchDriving, SearchPages

ACTIONS = ("show", "best", "list", "stop")


def search_command(store: SearchPages, args: argparse.Namespace) -> int:
    from jobs.search.report import best_spec, format_report, search_report

    if args.target == "list":
        for s in store.list_searches():
            print(f"search {s.id} ({s.state}): {s.name}")
        return 0
    if args.target in ACTIONS:
        if args.id is None:
            raise SpecError([Problem("id", "missing", f"give the search's id: tunedeck search {args.target} 3")])
        if args.target == "show":
            print(format_report(search_report(store, args.id)))
            return 0
        if args.target == "stop":
            stopped = store.end_search(args.id, "stopped")
            print(f"search {args.id}: {'stopped (its running trials finish)' if stopped else 'was not active'}")
            return 0
        spec = best_spec(store, args.id)
        print(spec.to_yaml())
        if args.launch:
            from jobs.queue.submit import submit

            print(f"queued run {submit(store, spec)}: the best settings of search {args.id} in full")
        return 0
    return _start(store, args)


def _start(store: SearchDriving, args: argparse.Namespace) -> int:
    from app.cli.usage import load_spec
    from jobs.search.driver import start_search
    from jobs.search.plan import SearchPlan

    spec = load_spec(args.target, args.set)
    plan = SearchPlan.build(
        spec,
        args.space,
        objective=args.objective,
        direction=args.direction,
        trials=args.trials,
        steps=args.steps,
        minutes=args.minutes,
        parallel=args.parallel,
        sampler=args.sampler,
        pruner=args.pruner,
        seed=args.seed,
        include_base=not args.no_base,
    )
    search = start_search(store, plan)
    print(f"search {search.id}: {plan.trials} trials of {plan.space.describe()}, {plan.direction} {plan.objective}")
    print(f"a worker runs it (tunedeck worker); progress: tunedeck search show {search.id}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register `search` on the CLI's subparsers; app.cli.main sets its function."""
    from jobs.search.plan import PRUNERS, SAMPLERS

    s = sub.add_parser("search", help="hyperparameter search over a spec's fields (Optuna); show, best, list, stop")
    s.add_argument("target", metavar="SPEC.yaml|show|best|list|stop")
    s.add_argument("id", nargs="?", type=int, default=None, metavar="SEARCH_ID")
    s.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="FIELD=VALUES",
        help="loguniform(a,b), uniform(a,b), int(a,b), [a,b]",
    )
    s.add_argument("--trials", type=int, default=8)
    s.add_argument("--objective", default="eval_loss", help="a metric as the runs store it (default eval_loss)")
    s.add_argument("--direction", choices=("minimize", "maximize"), default=None, help="default: minimize a loss")
    s.add_argument("--steps", type=int, default=None, help="optimizer steps per trial (default: the spec's)")
    s.add_argument("--minutes", type=float, default=None, help="stop a trial that trains longer")
    s.add_argument(
        "--parallel", type=int, default=1, help="trials queued at once (a --share worker runs them together)"
    )
    s.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    s.add_argument("--pruner", choices=PRUNERS, default="median")
    s.add_argument("--seed", type=int, default=None, help="the sampler's seed (default: the spec's seed)")
    s.add_argument("--no-base", action="store_true", help="do not try the spec's own values first")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    s.add_argument("--launch", action="store_true", help="with `best`: queue the best settings as a full run")
    return s
