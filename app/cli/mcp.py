"""`tunedeck mcp`: tunedeck's tools for agents over stdio (the Model Context Protocol; `app.mcp_tools`).

    tunedeck mcp                 # data sets and models from the data folders only, no code the agent brings
    tunedeck mcp --any-path      # ... any path this user can read (still no remote code or reward functions)

A desktop agent starts it as a child and talks JSON-RPC on its stdin/stdout; nothing else is printed there
(logs go to stderr). An agent reaches what a dashboard user with a login reaches (`AccessPolicy.for_server`):
by default only the data folders (TUNEDECK_DATA_DIRS), and remote code or a reward function only when the
environment allows it as it does for `tunedeck serve`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the parser is built for every command: no store imported for it
    from storage.roles_api import McpTools


def cmd_mcp(store: McpTools, args: argparse.Namespace) -> int:
    from app.cli.usage import EXIT_OK
    from app.mcp_tools import serve_stdio
    from jobs.checks.access import AccessPolicy

    serve_stdio(store, AccessPolicy.for_server(login=not args.any_path))
    return EXIT_OK


def add_parser(sub: Any) -> argparse.ArgumentParser:
    s = sub.add_parser("mcp", help="serve tunedeck's tools to an agent over stdio (Model Context Protocol)")
    s.add_argument(
        "--any-path",
        action="store_true",
        help="let the agent name any readable path as data or model (default: the data folders only)",
    )
    return s
