"""`tunedeck sweep`: queue short probe runs of a spec's memory tricks, or print a sweep's table.

    tunedeck sweep SPEC.yaml --steps 10 --tricks baseline,accumulation,optim_8bit
    tunedeck sweep --show 3        # peak memory and s/step per trick, relative to the baseline
    tunedeck sweep --list          # sweeps, newest first

The probes are ordinary queued runs (a worker trains them: `tunedeck worker --burst` drains
them); the table fills in as they finish.
"""

from __future__ import annotations

import argparse
from typing import Any

from jobs.errors import Problem
from jobs.spec.job import JobSpec, SpecError
from storage.roles import Sweeps


def _tricks(text: str) -> list[Any]:
    from jobs.spec.tricks.registry import Trick

    out, bad = [], []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        try:
            out.append(Trick(name))
        except ValueError:
            bad.append(name)
    if bad or not out:
        choices = ", ".join(t.value for t in Trick)
        raise SpecError(
            [
                Problem(
                    "--tricks",
                    f"unknown trick(s): {', '.join(bad) or '(none given)'}",
                    f"use a comma-separated list of: {choices}",
                )
            ]
        )
    return out


def sweep_command(store: Sweeps, args: argparse.Namespace, spec: JobSpec | None) -> int:
    """`tunedeck sweep`: --list, --show ID, or queue probes of `spec` (read by app.cli.main from SPEC.yaml)."""
    from jobs.queue.sweep import DEFAULT_TRICKS, format_table, queue_sweep, sweep_table

    if args.list:
        for sweep_id in store.sweep_ids():
            members = store.sweep_runs(sweep_id)
            print(
                f"sweep {sweep_id}: runs {', '.join(str(m['run_id']) for m in members)} "
                f"({', '.join(m['trick'] for m in members)})"
            )
        return 0
    if args.show is not None:
        rows = sweep_table(store, args.show)
        if not rows:
            raise SpecError([Problem("--show", f"no sweep {args.show}", "list sweeps with `tunedeck sweep --list`")])
        print(format_table(rows))
        return 0
    if spec is None:
        raise SpecError([Problem("spec", "missing", "give a YAML spec: tunedeck sweep SPEC.yaml --steps 10")])
    chosen = _tricks(args.tricks) if args.tricks else list(DEFAULT_TRICKS)
    queued = queue_sweep(store, spec, chosen, args.steps)
    print(f"sweep {queued.sweep_id}: queued runs {', '.join(map(str, queued.run_ids))}")
    for trick, why in queued.skipped:
        print(f"  skipped {trick}: {why}")
    print(f"table: tunedeck sweep --show {queued.sweep_id} (fills in as the runs finish)")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register `sweep` on the CLI's subparsers; app.cli.main sets its function."""
    from jobs.queue.sweep import DEFAULT_STEPS
    from jobs.spec.tricks.registry import Trick

    s = sub.add_parser("sweep", help="queue short probe runs of memory tricks; --show N prints their table")
    s.add_argument("spec", nargs="?", metavar="SPEC.yaml")
    s.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="optimizer steps per probe run")
    s.add_argument(
        "--tricks",
        default=None,
        help="comma-separated: " + ", ".join(t.value for t in Trick) + " (default: all that apply)",
    )
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    s.add_argument("--show", type=int, default=None, metavar="SWEEP_ID", help="print a sweep's table")
    s.add_argument("--list", action="store_true", help="list sweeps")
    return s
