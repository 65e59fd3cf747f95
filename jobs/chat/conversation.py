"""What one side of a chat session is given: the turns so far, as the chat template reads them.

    turns = conversation(store.chat_history(session_id), turn=1, side="run")
    # [{"role": "user", ...}, {"role": "assistant", ...(the run's own first answer)}, {"role": "user", ...}]

"Base" and "this run" answer the same user messages, each continuing its own conversation: a
side sees its own earlier answers, never the other side's. A turn whose reply on that side did
not finish (failed, or still under way) is left out of that side's history, user message and all,
so the roles keep alternating (many chat templates refuse anything else). Pure: records in, a list out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def conversation(history: Sequence[Any], turn: int, side: str) -> list[dict[str, str]]:
    """The messages `side` answers turn `turn` with: finished earlier turns, then that turn's user message."""
    users = {m.turn: m.content for m in history if m.role == "user"}
    replies = {m.turn: m.content for m in history if m.role == "assistant" and m.side == side and m.status == "done"}
    if turn not in users:
        raise KeyError(f"turn {turn} has no user message")
    out: list[dict[str, str]] = []
    for t in sorted(users):
        if t >= turn:
            break
        if t in replies:
            out += [{"role": "user", "content": users[t]}, {"role": "assistant", "content": replies[t]}]
    return out + [{"role": "user", "content": users[turn]}]
