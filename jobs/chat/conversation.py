"""What one side of a chat session is given: the turns so far, as the chat template reads them.

    turns = conversation(store.chat_history(session_id), turn=1, side="run")
    # [{"role": "user", ...}, {"role": "assistant", ...(the run's own first answer)}, {"role": "user", ...}]

"Base" and "this run" answer the same user messages, each continuing its own conversation: a
side sees its own earlier answers, never the other side's. A turn whose reply on that side did
not finish (failed, or still under way) is left out of that side's history, user message and all,
so the roles keep alternating (many chat templates refuse anything else). A user turn with an attached
image is an image part and a text part (`jobs.chat.images.user_turn`). Pure: records in, a list out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobs.chat.images import user_turn


def conversation(history: Sequence[Any], turn: int, side: str) -> list[dict[str, Any]]:
    """The messages `side` answers turn `turn` with: finished earlier turns, then that turn's user message."""
    users = {m.turn: user_turn(m.content, getattr(m, "image", None)) for m in history if m.role == "user"}
    replies = {m.turn: m.content for m in history if m.role == "assistant" and m.side == side and m.status == "done"}
    if turn not in users:
        raise KeyError(f"turn {turn} has no user message")
    out: list[dict[str, Any]] = []
    for t in sorted(users):
        if t >= turn:
            break
        if t in replies:
            out += [users[t], {"role": "assistant", "content": replies[t]}]
    return out + [users[turn]]
