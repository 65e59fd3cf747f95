"""`tunedeck hash-password [--user NAME]`: a `user:HASH` line for `tunedeck serve --auth-file` (`app.auth`)."""

from __future__ import annotations

import argparse
import sys

from app.cli.usage import EXIT_OK, UsageError
from jobs.errors import Problem


def cmd_hash_password(_store: None, args: argparse.Namespace) -> int:
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
