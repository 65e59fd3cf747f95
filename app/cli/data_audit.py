"""`tunedeck data audit SPEC`: what the job's rows hold that a run would learn without meaning to.

    tunedeck data audit examples/smollm2-dpo.yaml
    tunedeck data audit my.yaml --set dataset=big.jsonl --json

One line per finding (`jobs.data.audit`): duplicates, near-duplicates, training rows also in the eval data,
empty or short answers, answers repeated across prompts, chosen identical to rejected, KTO label balance,
characters that are not text, a mixture's shares; each with its count, its first rows and its fix. Then a
histogram of the training rows' lengths against max_length: tokens when the checks (`tunedeck plan`,
`submit`) measured them already, else characters. Exit 0 (findings are advice, the checks refuse what cannot
run), 2 when the spec or its data cannot be read.
"""

from __future__ import annotations

import argparse
import json

from app.cli.usage import EXIT_OK, StoreUse

BAR = 40  # characters of the longest bar


def cmd_data_audit(_store: None, args: argparse.Namespace) -> int:
    from app.cli.usage import load_spec
    from jobs.checks.shown_data import token_lengths
    from jobs.data.audit.report import audit

    spec = load_spec(args.spec, args.set)
    found = token_lengths(audit(spec), spec)
    if args.json:
        print(json.dumps(found.record(), indent=2))
        return EXIT_OK
    data = found.data
    print(f"{len(data.train)} training rows, {len(data.eval)} eval rows: {len(found.findings)} finding(s)")
    for line in found.lines():
        print(line)
    tokens = found.unit == "tokens"
    histogram = found.histogram(edge=spec.max_length if tokens else None)
    if histogram:
        cut = f"; {int((found.lengths > spec.max_length).sum())} longer than max_length {spec.max_length}"
        print(f"\nlengths of the training rows ({found.unit}{cut if tokens else ''}):")
        top = max(n for _, n in histogram) or 1
        for bound, n in histogram:
            mark = "  <- max_length" if tokens and bound == spec.max_length else ""
            print(f"  <= {bound:>7}  {'#' * round(BAR * n / top):<{BAR}} {n}{mark}")
    return EXIT_OK


def add_parsers(data_sub: argparse._SubParsersAction) -> None:
    """`audit` under the `data` command group (`app.cli.main` makes the group)."""
    s = data_sub.add_parser("audit", help="duplicates, eval overlap, empty answers, ... in the spec's data")
    s.add_argument("spec", metavar="SPEC.yaml")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    s.add_argument("--json", action="store_true", help="print JSON for scripts")
    s.set_defaults(func=cmd_data_audit, store_use=StoreUse.NONE)
