"""`tunedeck rm` and `tunedeck tag`: delete runs with their files, tag them and note them.

    tunedeck rm RUN_ID [RUN_ID ...] [--yes]                 # asks first on a terminal; scripts pass --yes
    tunedeck tag RUN_ID [TAG ...] [--remove TAG ...] [--note TEXT]   # no changes: print tags and note

`rm` checks every id before deleting any: a missing or running run (cancel it first) stops the
whole command with exit code 2, and nothing is deleted. Wired into the parser by `app.cli.main`; the
commands import the store when they run, so building the parser does not.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from jobs.errors import Problem
from jobs.units import human_bytes

if TYPE_CHECKING:
    from storage.roles_queue import RunActing


def cmd_rm(store: RunActing, args: argparse.Namespace) -> int:
    from jobs.queue.run_actions import RunCommandError, check_deletable, delete
    from storage.run_files import run_bytes

    runs = check_deletable(store, list(dict.fromkeys(args.run_ids)))
    if not args.yes:
        if not sys.stdin.isatty():
            raise RunCommandError(
                [
                    Problem(
                        "--yes",
                        "deleting runs needs a confirmation and there is no terminal to ask",
                        "add --yes to delete without asking",
                    )
                ]
            )
        listing = ", ".join(f"{r.id} ({r.name}, {human_bytes(run_bytes(store, r.id))})" for r in runs)
        answer = input(f"delete run(s) {listing} with their files? This cannot be undone. [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 0
    for run in runs:
        print(delete(store, run.id).message)
    return 0


def describe(tags: tuple[str, ...], note: str | None) -> str:
    return f"tags: {', '.join(tags) if tags else '-'}\nnote: {note if note else '-'}"


def cmd_tag(store: RunActing, args: argparse.Namespace) -> int:
    from jobs.queue.run_actions import tag

    run = tag(store, args.run_id, add=args.tags, remove=args.remove, note=args.note)
    print(f"run {run.id}: {run.name}\n{describe(run.tags, run.note)}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("rm", help="delete runs with their files (metrics, logs, checkpoints, bundles)")
    s.add_argument("run_ids", type=int, nargs="+", metavar="RUN_ID")
    s.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (for scripts)")
    s.set_defaults(func=cmd_rm)

    s = sub.add_parser("tag", help="add or remove tags of a run and set its note")
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    s.add_argument("tags", nargs="*", metavar="TAG", help="tags to add (letters, digits, . _ : + / -)")
    s.add_argument("--remove", "-r", action="append", default=[], metavar="TAG", help="a tag to remove")
    s.add_argument("--note", default=None, metavar="TEXT", help='the run\'s note ("" removes it)')
    s.set_defaults(func=cmd_tag)
