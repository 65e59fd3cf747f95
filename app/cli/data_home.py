"""`tunedeck migrate-data`: move an earlier version's `./data` into the per-user data folder.

    tunedeck migrate-data [--from DIR] [--to DIR]    # default: ./data -> the user data folder

Every other command typed next to such a folder prints the hint (`app.cli.main`); this one does the
move (`storage.data_home.migrate_data`): a target that already holds runs is refused, nothing moves.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.usage import EXIT_BAD_INPUT, EXIT_OK, StoreUse


def cmd_migrate_data(_store: None, args: argparse.Namespace) -> int:
    from storage.data_home import LEGACY_NAME, MigrateError, migrate_data
    from storage.settings import home_setting

    source = Path(args.source or LEGACY_NAME)
    target = Path(args.target) if args.target else home_setting()  # TUNEDECK_HOME, else the user folder
    try:
        done = migrate_data(source, target)
    except MigrateError as exc:
        print(f"tunedeck: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"moved {done.source} -> {done.target} ({done.paths_rewritten} stored path(s) rewritten)")
    if done.set_aside is not None:
        print(f"the fresh folder that stood there (no runs) was kept as {done.set_aside}")
    if done.linked:
        print(f"{done.source} is now a link to {done.target}")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("migrate-data", help="move an earlier version's ./data folder into the user data folder")
    s.add_argument("--from", dest="source", default=None, metavar="DIR", help="the old folder (default ./data)")
    s.add_argument(
        "--to",
        dest="target",
        default=None,
        metavar="DIR",
        help="where to (default TUNEDECK_HOME, else the user folder)",
    )
    s.set_defaults(func=cmd_migrate_data, store_use=StoreUse.NONE)
