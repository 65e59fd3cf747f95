"""The store's roles for chat: the Chat tab (`app.ui.chat`) and the OpenAI-compatible `/v1` chat and completions
(`app.openai_api`), each a `Protocol` `Store` plays, checked by mypy in `storage.roles_played`. The smaller roles
they combine are in `storage.roles` and `storage.roles_pages`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from storage.roles import ArtifactReader, ChatHistory, ChatRuns, RunFolders, RunLister, RunReader

if TYPE_CHECKING:  # annotations only (a module that asks for a role must not import the database layer)
    from storage.store_chat import ChatMessageRecord, ChatSessionRecord


class ChatReach(RunReader, Protocol):
    """Whether a live worker's chat service can reach a run's weights (on the run's host, or sharing the data
    folder): `app.ui.chat.reach_problem`."""

    def chat_services(self, within_s: float = 20.0) -> list[dict[str, Any]]: ...


class ChatImages(RunReader, RunFolders, Protocol):
    """A picture checked against the run's model and kept in the run's folder (the Chat tab's turn, a /v1 message)."""


class ChatReading(ChatHistory, ChatReach, Protocol):
    """A run's latest Chat tab session shown with its turns, and whether a worker can answer it (`app.ui.chat.show`)."""


class ChatLength(ChatHistory, ArtifactReader, Protocol):
    """A tab turn counted against the run's model: the run's result folder (its tokenizer) and the session's turns."""


class ChatWriting(ChatReading, ChatLength, ChatImages, RunLister, Protocol):
    """A Chat tab turn sent (`app.ui.chat.send`): checked, its session made or updated, the turn and its image kept."""

    def create_chat(self, run_id: int, system: str = "", sampling: dict[str, Any] | None = None) -> int: ...

    def update_chat(self, session_id: int, system: str, sampling: dict[str, Any]) -> None: ...

    def add_chat_turn(self, session_id: int, prompt: str, image: str | None = None) -> int: ...


class ChatTurnActions(ChatReading, Protocol):
    """A tab session's last turn asked again or its turns cleared, and the replies of workers gone away failed."""

    def regenerate_chat_turn(self, session_id: int) -> int | None: ...

    def clear_chat(self, session_id: int) -> int: ...

    def fail_stale_chat_replies(self, within_s: float = 20.0) -> list[int]: ...


class ChatTab(ChatWriting, ChatTurnActions, Protocol):
    """The whole Chat tab (`app.ui.chat.wire`): the finished runs to pick, a turn sent, regenerated or cleared."""


class ModelNames(ChatReach, RunLister, Protocol):
    """A /v1 request's `model` read as a finished run a live worker can reach (`app.openai_api.resolve_model`)."""


class ChatRequests(Protocol):
    """A /v1 request's one-off session: its pending reply written, followed as it grows, then deleted."""

    def ask_chat_reply(
        self,
        run_id: int,
        side: str,
        turns: list[dict[str, Any]],
        system: str = "",
        sampling: dict[str, Any] | None = None,
    ) -> tuple[int, int]: ...

    def chat_message(self, message_id: int) -> ChatMessageRecord | None: ...

    def delete_chat(self, session_id: int) -> None: ...


class ChatAnswers(ModelNames, ChatRequests, ArtifactReader, Protocol):
    """One question answered as /v1 answers it: the model resolved, the prompt counted against it, the reply asked
    and followed (`app.mcp_tools.chat_answer`)."""


class OpenAIChat(ChatAnswers, ChatImages, Protocol):
    """The `/v1` chat and completions routes (`app.openai_api.add_openai_routes`): the model resolved, the prompt
    counted, images kept, the reply asked and followed; sessions left by a stopped dashboard deleted at start."""

    def delete_api_chats(self, before: float) -> int: ...


class ChatServing(ChatRuns, ChatHistory, Protocol):
    """A worker's chat service (`jobs.worker.chat_service`): its presence, the pending replies it can reach, each
    claimed, streamed and finished or failed; the run's result loaded and the device's lease respected."""

    def chat_service_beat(self, worker_id: str, host: str, shared_data: bool) -> None: ...

    def chat_service_gone(self, worker_id: str) -> None: ...

    def pending_chat_replies(self, limit: int = 20) -> list[ChatMessageRecord]: ...

    def chat_session(self, session_id: int) -> ChatSessionRecord | None: ...

    def claim_chat_reply(self, message_id: int, worker_id: str, note: str | None = None) -> bool: ...

    def stream_chat_reply(self, message_id: int, worker_id: str, content: str, note: str | None = None) -> bool: ...

    def finish_chat_reply(self, message_id: int, worker_id: str, content: str) -> bool: ...

    def fail_chat_reply(self, message_id: int, worker_id: str, error: str) -> bool: ...

    def fail_stale_chat_replies(self, within_s: float = 20.0) -> list[int]: ...
