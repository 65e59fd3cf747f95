"""Chat sessions and their messages: the dashboard writes turns, a worker claims and streams the replies.

    sid = store.create_chat(run_id, system="", sampling={"temperature": 0.0})
    turn = store.add_chat_turn(sid, "Hi")          # the user's message and two pending replies (base, run)
    reply = store.claim_chat_reply(message_id, "host:12")   # status guard: one worker gets it
    store.stream_chat_reply(reply.id, "host:12", "Hel")     # the text so far (one UPDATE per flush)
    store.finish_chat_reply(reply.id, "host:12", "Hello")   # or fail_chat_reply(..., error)
    store.chat_history(sid)                        # every message, in turn order: what both sides see

A reply is pending (asked), streaming (a worker claimed it and writes its text as it comes), done or
failed (with the error). Every write of a worker is guarded by the reply's status and its worker id,
so a reply that was regenerated or cleared under a worker is not written to by it again: the write
says False and the worker drops the rest of that answer. A worker's chat service announces itself
(`chat_service_beat`); a streaming reply whose worker has not been heard of for a while is failed
with that reason (`fail_stale_chat_replies`). The store knows which rows to write, not how to answer.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update

from storage import models as m
from storage.models import ChatKind, ReplyStatus
from storage.store_core import StoreCore, rowcount

SIDES = ("base", "run")
PRESENCE = "chat-service:"  # Meta key prefix of a worker's chat service presence row


@dataclass(frozen=True)
class ChatSessionRecord:
    id: int
    run_id: int
    system: str
    sampling: dict[str, Any]
    created_at: float
    updated_at: float
    kind: ChatKind = ChatKind.TAB


@dataclass(frozen=True)
class ChatMessageRecord:
    id: int
    session_id: int
    run_id: int
    turn: int
    role: str  # user | assistant
    side: str | None  # assistant replies: base | run
    content: str
    status: ReplyStatus
    note: str | None
    error: str | None
    worker_id: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    image: str | None = None  # a user turn's attached image file (vision-language runs)


def _session(row: m.ChatSession) -> ChatSessionRecord:
    sampling = json.loads(row.sampling_json or "{}")
    kind = ChatKind(row.kind or ChatKind.TAB.value)
    return ChatSessionRecord(row.id, row.run_id, row.system or "", sampling, row.created_at, row.updated_at, kind)


def _message(row: m.ChatMessage, run_id: int) -> ChatMessageRecord:
    return ChatMessageRecord(
        row.id,
        row.session_id,
        run_id,
        row.turn,
        row.role,
        row.side,
        row.content or "",
        ReplyStatus(row.status),
        row.note,
        row.error,
        row.worker_id,
        row.created_at,
        row.started_at,
        row.finished_at,
        row.image_path,
    )


_MESSAGES = select(m.ChatMessage, m.ChatSession.run_id).join(
    m.ChatSession, m.ChatSession.id == m.ChatMessage.session_id
)


class ChatMixin(StoreCore):
    # ------------------------------------------------------------------ sessions (the dashboard)
    def create_chat(self, run_id: int, system: str = "", sampling: dict[str, Any] | None = None) -> int:
        now = time.time()
        with self._tx() as s:
            row = m.ChatSession(
                run_id=run_id,
                system=system,
                sampling_json=json.dumps(sampling or {}),
                created_at=now,
                updated_at=now,
                kind=ChatKind.TAB.value,
            )
            s.add(row)
            s.flush()
            return row.id

    def chat_session(self, session_id: int) -> ChatSessionRecord | None:
        with self._read() as s:
            row = s.get(m.ChatSession, session_id)
            return None if row is None else _session(row)

    def latest_chat(self, run_id: int) -> ChatSessionRecord | None:
        """The run's most recently used Chat tab session, if it has one (a /v1 request's is never it)."""
        q = select(m.ChatSession).where(m.ChatSession.run_id == run_id, m.ChatSession.kind == ChatKind.TAB.value)
        with self._read() as s:
            row = s.scalars(q.order_by(m.ChatSession.updated_at.desc(), m.ChatSession.id.desc()).limit(1)).first()
            return None if row is None else _session(row)

    def update_chat(self, session_id: int, system: str, sampling: dict[str, Any]) -> None:
        with self._tx() as s:
            s.execute(
                update(m.ChatSession)
                .where(m.ChatSession.id == session_id)
                .values(system=system, sampling_json=json.dumps(sampling), updated_at=time.time())
            )

    def add_chat_turn(self, session_id: int, prompt: str, image: str | None = None) -> int:
        """The user's message as the session's next turn, with a pending reply of each side; its turn index.

        `image`: the path of an image file attached to the turn (kept in the data folder by the caller)."""
        now = time.time()
        with self._tx() as s:
            last = s.scalar(select(func.max(m.ChatMessage.turn)).where(m.ChatMessage.session_id == session_id))
            turn = 0 if last is None else int(last) + 1
            s.add(
                m.ChatMessage(
                    session_id=session_id,
                    turn=turn,
                    role="user",
                    content=prompt,
                    status="done",
                    created_at=now,
                    image_path=image,
                )
            )
            for side in SIDES:
                s.add(
                    m.ChatMessage(
                        session_id=session_id, turn=turn, role="assistant", side=side, status="pending", created_at=now
                    )
                )
            s.execute(update(m.ChatSession).where(m.ChatSession.id == session_id).values(updated_at=now))
            return turn

    def chat_history(self, session_id: int) -> list[ChatMessageRecord]:
        """Every message of the session: by turn, the user's first, then the base's and the run's replies."""
        q = _MESSAGES.where(m.ChatMessage.session_id == session_id).order_by(m.ChatMessage.turn, m.ChatMessage.id)
        with self._read() as s:
            return [_message(row, run_id) for row, run_id in s.execute(q)]

    def regenerate_chat_turn(self, session_id: int) -> int | None:
        """The last turn's replies back to pending (their text, error and worker cleared); its turn, or None."""
        with self._tx() as s:
            last = s.scalar(select(func.max(m.ChatMessage.turn)).where(m.ChatMessage.session_id == session_id))
            if last is None:
                return None
            s.execute(
                update(m.ChatMessage)
                .where(
                    m.ChatMessage.session_id == session_id,
                    m.ChatMessage.turn == last,
                    m.ChatMessage.role == "assistant",
                )
                .values(
                    status=ReplyStatus.PENDING.value,
                    content="",
                    note=None,
                    error=None,
                    worker_id=None,
                    started_at=None,
                    finished_at=None,
                )
            )
            return int(last)

    def clear_chat(self, session_id: int) -> int:
        """Delete every message of the session (its system prompt and sampling stay); how many went."""
        with self._tx() as s:
            return rowcount(s.execute(delete(m.ChatMessage).where(m.ChatMessage.session_id == session_id)))

    # ------------------------------------------------------------------ one-off requests (the /v1 API)
    def ask_chat_reply(
        self,
        run_id: int,
        side: str,
        turns: list[dict[str, Any]],
        system: str = "",
        sampling: dict[str, Any] | None = None,
    ) -> tuple[int, int]:
        """A session of its own (kind "api": the Chat tab never shows it) holding `turns` (user and assistant alternating, the user's last; a user turn's
        "image": its image file) as `side`'s conversation, with one pending reply of `side` to the last:
        (session id, reply message id)."""
        now = time.time()
        with self._tx() as s:
            session = m.ChatSession(
                run_id=run_id,
                system=system,
                sampling_json=json.dumps(sampling or {}),
                created_at=now,
                updated_at=now,
                kind=ChatKind.API.value,
            )
            s.add(session)
            s.flush()
            for i, message in enumerate(turns):
                user = message["role"] == "user"
                s.add(
                    m.ChatMessage(
                        session_id=session.id,
                        turn=i // 2,
                        role="user" if user else "assistant",
                        side=None if user else side,
                        content=message["content"],
                        status="done",
                        created_at=now,
                        image_path=message.get("image"),
                    )
                )
            reply = m.ChatMessage(
                session_id=session.id,
                turn=(len(turns) - 1) // 2,
                role="assistant",
                side=side,
                status=ReplyStatus.PENDING.value,
                created_at=now,
            )
            s.add(reply)
            s.flush()
            return session.id, reply.id

    def chat_message(self, message_id: int) -> ChatMessageRecord | None:
        with self._read() as s:
            found = s.execute(_MESSAGES.where(m.ChatMessage.id == message_id)).first()
            return None if found is None else _message(found[0], found[1])

    def delete_chat(self, session_id: int) -> None:
        """The session and its messages (a one-off request's, once answered)."""
        with self._tx() as s:
            s.execute(delete(m.ChatMessage).where(m.ChatMessage.session_id == session_id))
            s.execute(delete(m.ChatSession).where(m.ChatSession.id == session_id))

    def chat_sessions(self, run_id: int | None = None, kind: ChatKind | None = None) -> list[ChatSessionRecord]:
        """Chat sessions, oldest first: of one run and of one kind when given."""
        q = select(m.ChatSession).order_by(m.ChatSession.id)
        if run_id is not None:
            q = q.where(m.ChatSession.run_id == run_id)
        if kind is not None:
            q = q.where(m.ChatSession.kind == kind.value)
        with self._read() as s:
            return [_session(row) for row in s.scalars(q)]

    def delete_api_chats(self, before: float) -> int:
        """Delete the /v1 sessions last touched before `before` (left by a dashboard that stopped mid-request);
        how many went."""
        q = select(m.ChatSession.id).where(m.ChatSession.kind == ChatKind.API.value, m.ChatSession.updated_at < before)
        with self._tx() as s:
            ids = list(s.scalars(q))
            if ids:
                s.execute(delete(m.ChatMessage).where(m.ChatMessage.session_id.in_(ids)))
                s.execute(delete(m.ChatSession).where(m.ChatSession.id.in_(ids)))
            return len(ids)

    # ------------------------------------------------------------------ replies (a worker)
    def pending_chat_replies(self, limit: int = 20) -> list[ChatMessageRecord]:
        """The oldest replies nobody has claimed, with their session's run: one indexed SELECT."""
        q = _MESSAGES.where(m.ChatMessage.status == ReplyStatus.PENDING.value).order_by(m.ChatMessage.id).limit(limit)
        with self._read() as s:
            return [_message(row, run_id) for row, run_id in s.execute(q)]

    def claim_chat_reply(self, message_id: int, worker_id: str, note: str | None = None) -> bool:
        """Take a pending reply for `worker_id`: True for exactly one of the workers that try."""
        with self._tx() as s:
            done = s.execute(
                update(m.ChatMessage)
                .where(m.ChatMessage.id == message_id, m.ChatMessage.status == ReplyStatus.PENDING.value)
                .values(status=ReplyStatus.STREAMING.value, worker_id=worker_id, note=note, started_at=time.time())
            )
            return rowcount(done) == 1

    def _own(self, message_id: int, worker_id: str, **values: Any) -> bool:
        """Write a streaming reply `worker_id` holds; False when it is no longer that worker's (regenerated, cleared)."""
        with self._tx() as s:
            done = s.execute(
                update(m.ChatMessage)
                .where(
                    m.ChatMessage.id == message_id,
                    m.ChatMessage.status == ReplyStatus.STREAMING.value,
                    m.ChatMessage.worker_id == worker_id,
                )
                .values(**values)
            )
            return rowcount(done) == 1

    def note_chat_reply(self, message_id: int, worker_id: str, note: str | None) -> bool:
        return self._own(message_id, worker_id, note=note)

    def stream_chat_reply(self, message_id: int, worker_id: str, content: str, note: str | None = None) -> bool:
        """The reply's text so far (replaced whole: one UPDATE per flush, however many tokens it holds)."""
        return self._own(message_id, worker_id, content=content, note=note)

    def finish_chat_reply(self, message_id: int, worker_id: str, content: str) -> bool:
        return self._own(
            message_id, worker_id, content=content, note=None, status=ReplyStatus.DONE.value, finished_at=time.time()
        )

    def fail_chat_reply(self, message_id: int, worker_id: str, error: str) -> bool:
        return self._own(
            message_id, worker_id, error=error, note=None, status=ReplyStatus.FAILED.value, finished_at=time.time()
        )

    # ------------------------------------------------------------------ chat services' presence
    def chat_service_beat(self, worker_id: str, host: str, shared_data: bool) -> None:
        """A worker's chat service is up on `host` (shared_data: it reaches every host's weights)."""
        key = f"{PRESENCE}{worker_id}"[:64]
        value = json.dumps({"worker_id": worker_id, "host": host, "shared_data": shared_data, "time": time.time()})
        with self._tx() as s:
            if not rowcount(s.execute(update(m.Meta).where(m.Meta.key == key).values(value=value))):
                s.add(m.Meta(key=key, value=value))

    def chat_service_gone(self, worker_id: str) -> None:
        with self._tx() as s:
            s.execute(delete(m.Meta).where(m.Meta.key == f"{PRESENCE}{worker_id}"[:64]))

    def chat_services(self, within_s: float = 20.0) -> list[dict[str, Any]]:
        """Chat services heard of in the last `within_s` seconds: {worker_id, host, shared_data, time}."""
        cutoff = time.time() - within_s
        with self._read() as s:
            rows = [json.loads(v) for v in s.scalars(select(m.Meta.value).where(m.Meta.key.like(f"{PRESENCE}%")))]
        return [r for r in rows if r.get("time", 0) >= cutoff]

    def fail_stale_chat_replies(self, within_s: float = 20.0) -> list[int]:
        """Fail streaming replies whose worker's chat service has not been heard of in `within_s` s; their ids."""
        live = {r["worker_id"] for r in self.chat_services(within_s)}
        q = select(m.ChatMessage.id, m.ChatMessage.worker_id).where(m.ChatMessage.status == ReplyStatus.STREAMING.value)
        with self._read() as s:
            stale = [(i, str(w)) for i, w in s.execute(q) if w not in live]
        failed = []
        for message_id, worker_id in stale:
            error = (
                f"the worker {worker_id} stopped while answering (no sign of its chat service for {within_s:.0f} s); "
                "regenerate to ask again"
            )
            if self._own(
                message_id, worker_id, error=error, note=None, status=ReplyStatus.FAILED.value, finished_at=time.time()
            ):
                failed.append(message_id)
        return failed
