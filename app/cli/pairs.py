"""`tunedeck pairs`: the preference data sets made in the Chat tab (`jobs.data.preferences`).

    tunedeck pairs                                   # each set: name, DPO pairs, KTO rows, its files
    tunedeck pairs export NAME [--kind dpo|kto] [-o FILE]   # a set's rows as JSONL (stdout, or FILE)

A set's file is also a `dataset:` as it is: `trainer: dpo` on NAME.dpo.jsonl, `trainer: kto` on NAME.kto.jsonl.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any


def cmd_pairs(_store: Any, args: argparse.Namespace) -> int:
    from app.cli.usage import EXIT_OK, UsageError
    from jobs.data import preferences
    from jobs.errors import Problem, ProblemError

    if args.action is None:
        found = preferences.sets()
        if not found:
            print("no preference data sets yet: pick better answers in the Chat tab (Make preference data)")
            return EXIT_OK
        print(f"{'name':<28} {'pairs':>6} {'judged':>6}  files")
        for s in found:
            paths = ", ".join(str(p) for p, n in ((s.dpo, s.pairs), (s.kto, s.judged)) if n)
            print(f"{s.name:<28} {s.pairs:>6} {s.judged:>6}  {paths}")
        return EXIT_OK
    try:
        path = preferences.path_of(args.name, args.kind)
    except ProblemError as exc:
        raise UsageError([Problem("NAME", p.problem, p.fix) for p in exc.problems]) from None
    if not path.is_file():
        names = ", ".join(s.name for s in preferences.sets()) or "none yet"
        raise UsageError(
            [
                Problem(
                    "NAME",
                    f"no {args.kind} rows in a set named `{args.name}`",
                    f"`tunedeck pairs` lists them ({names})",
                )
            ]
        )
    if args.output:
        shutil.copyfile(path, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        with open(path, encoding="utf-8") as f:
            shutil.copyfileobj(f, sys.stdout)
    return EXIT_OK


def add_parser(sub: Any) -> argparse.ArgumentParser:
    s = sub.add_parser("pairs", help="list or export the preference data sets made in the Chat tab")
    actions = s.add_subparsers(dest="action", metavar="ACTION")
    export = actions.add_parser("export", help="write a set's rows as JSONL")
    export.add_argument("name", metavar="NAME")
    export.add_argument("--kind", choices=("dpo", "kto"), default="dpo", help="DPO pairs (default) or KTO rows")
    export.add_argument("-o", "--output", help="write to this file (default: standard output)")
    return s
