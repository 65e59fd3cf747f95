"""`tunedeck push`: upload a finished run's bundle (or merged export) to a Hugging Face hub repository.

    tunedeck push 7 --repo alice/smollm2-tag-adapter             # the adapter bundle, public
    tunedeck push 7 --repo alice/smollm2-tag --what merged --private
    tunedeck push 7 --repo alice/smollm2-tag-adapter --on-worker  # a worker pushes, with its own HF_TOKEN

The token is read at push time from HF_TOKEN, else asked for without echo; it is used for this push
only and never stored or printed. `jobs.export.push` does the work; this module parses and prints.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from jobs.errors import Problem


def read_token() -> str:
    """HF_TOKEN from the environment, else asked for on the terminal (not echoed)."""
    from app.cli.usage import UsageError

    token = os.environ.get("HF_TOKEN", "").strip()
    if token:
        return token
    if not sys.stdin.isatty():
        raise UsageError(
            [
                Problem(
                    "token",
                    "no hub token: HF_TOKEN is not set and there is no terminal to ask on",
                    "set HF_TOKEN in the environment of this command",
                )
            ]
        )
    try:
        return getpass.getpass("Hugging Face token (write access; not stored): ").strip()
    except (EOFError, KeyboardInterrupt):
        return ""


def bound_hub_timeouts(connect_s: float = 5.0, io_s: float = 120.0) -> None:
    """huggingface_hub's HTTP client waits forever by default: in this command a hub that stops answering
    (connects, then stalls) ends the push with an error instead of hanging it."""
    try:
        import httpx2
        from huggingface_hub.utils import _http
    except ImportError:  # another huggingface_hub: keep its own client
        return

    def factory():
        client = _http.default_client_factory()
        client.timeout = httpx2.Timeout(io_s, connect=connect_s)
        return client

    _http.set_client_factory(factory)


def cmd_push(store, args: argparse.Namespace) -> int:
    from app.cli.usage import EXIT_OK
    from jobs.export.push import PushError, check_repo_id, endpoint, push, push_folder, reachability_problem

    check_repo_id(args.repo)
    folder = push_folder(store, args.run_id, args.what)  # refuse before asking for a token
    if args.on_worker:  # the worker pushes with its own HF_TOKEN: no token travels through the store
        from app.cli.tasks import check_reachable, follow
        from jobs.worker.tasks import request_push

        check_reachable(store, args.run_id)
        task_id = request_push(store, args.run_id, args.repo, args.what, args.private)
        print(f"run {args.run_id}: asked a worker to push the {args.what} to {args.repo} (task {task_id}); following")
        return follow(store, [task_id])
    problem = reachability_problem(endpoint())
    if problem:  # say it within seconds, before a token is typed in vain
        raise PushError(
            [
                Problem(
                    "hub",
                    f"{problem}; nothing was uploaded",
                    "connect to the internet (and unset HF_HUB_OFFLINE), then push again",
                )
            ]
        )
    bound_hub_timeouts()
    print(f"pushing {folder} to {args.repo} ({'private' if args.private else 'public'})")
    address = push(store, args.run_id, args.repo, read_token(), what=args.what, private=args.private)
    print(f"pushed: {address}")
    return EXIT_OK


def add_parser(sub) -> None:
    s = sub.add_parser("push", help="upload a finished run's bundle (or merged export) to the Hugging Face hub")
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    s.add_argument("--repo", required=True, metavar="OWNER/NAME", help="the hub model repository (created if missing)")
    s.add_argument(
        "--what",
        choices=("bundle", "merged"),
        default="bundle",
        help="the adapter/model bundle (default) or the merged export (`tunedeck export --merged` first)",
    )
    s.add_argument("--private", action="store_true", help="create the repository as private")
    from app.cli.tasks import add_flag

    add_flag(s)
    s.set_defaults(func=cmd_push)
