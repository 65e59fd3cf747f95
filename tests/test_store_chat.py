"""Chat sessions in the store: turns, the guarded claim, streamed text, regenerate, clear, stale replies."""

from __future__ import annotations

import threading
import time

import pytest

from jobs.chat.conversation import conversation
from storage.models import ChatKind, ReplyStatus
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")


def _run(store: Store) -> int:
    from jobs.spec.job import JobSpec

    return store.create_run(JobSpec.from_dict({"model": "tiny-llama", "dataset": "sample:chat-format"}))


def _replies(store: Store, sid: int, turn: int) -> dict[str, object]:
    return {m.side: m for m in store.chat_history(sid) if m.turn == turn and m.role == "assistant"}


def test_a_turn_is_the_users_message_and_a_pending_reply_of_each_side(store: Store) -> None:
    run_id = _run(store)
    sid = store.create_chat(run_id, system="Be brief.", sampling={"temperature": 0.0, "max_new_tokens": 8})
    assert store.add_chat_turn(sid, "Hi") == 0
    assert store.add_chat_turn(sid, "And then?") == 1
    history = store.chat_history(sid)
    assert [(m.turn, m.role, m.side, m.status.value) for m in history] == [
        (0, "user", None, "done"),
        (0, "assistant", "base", "pending"),
        (0, "assistant", "run", "pending"),
        (1, "user", None, "done"),
        (1, "assistant", "base", "pending"),
        (1, "assistant", "run", "pending"),
    ]
    assert all(m.run_id == run_id for m in history)
    session = store.chat_session(sid)
    assert session.system == "Be brief." and session.sampling["max_new_tokens"] == 8
    store.update_chat(sid, "", {"temperature": 0.5})
    assert store.latest_chat(run_id).sampling == {"temperature": 0.5}
    assert store.latest_chat(run_id + 1) is None
    # The oldest pending reply first: the first turn's base.
    first = store.pending_chat_replies()[0]
    assert (first.turn, first.side) == (0, "base")


def test_only_one_worker_claims_a_reply(store: Store) -> None:
    sid = store.create_chat(_run(store))
    store.add_chat_turn(sid, "Hi")
    reply = store.pending_chat_replies()[0]
    wins: list[str] = []
    barrier = threading.Barrier(4)

    def claim(worker: str) -> None:
        barrier.wait()
        if store.claim_chat_reply(reply.id, worker):
            wins.append(worker)

    threads = [threading.Thread(target=claim, args=(f"h:{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert not store.claim_chat_reply(reply.id, "late:1")  # the status guard, not the timing
    # Only the claimant writes it; another worker's writes say False and change nothing.
    assert not store.stream_chat_reply(reply.id, "other:9", "nope")
    assert store.stream_chat_reply(reply.id, wins[0], "Hel")
    assert _replies(store, sid, 0)["base"].content == "Hel"
    assert store.finish_chat_reply(reply.id, wins[0], "Hello")
    done = _replies(store, sid, 0)["base"]
    assert done.status is ReplyStatus.DONE and done.content == "Hello" and done.worker_id == wins[0]
    assert not store.stream_chat_reply(reply.id, wins[0], "more")  # a finished reply is not written again


def test_regenerate_and_clear(store: Store) -> None:
    sid = store.create_chat(_run(store))
    store.add_chat_turn(sid, "Hi")
    for reply in store.pending_chat_replies():
        assert store.claim_chat_reply(reply.id, "h:1")
        store.finish_chat_reply(reply.id, "h:1", f"{reply.side} says hi")
    store.add_chat_turn(sid, "Again")
    base = _replies(store, sid, 1)["base"]
    assert store.claim_chat_reply(base.id, "h:1") and store.stream_chat_reply(base.id, "h:1", "half")
    # Regenerate: the last turn's replies are pending again, text gone; the streaming worker's writes stop.
    assert store.regenerate_chat_turn(sid) == 1
    again = _replies(store, sid, 1)
    assert {m.status for m in again.values()} == {ReplyStatus.PENDING} and again["base"].content == ""
    assert not store.stream_chat_reply(base.id, "h:1", "half and more")
    assert _replies(store, sid, 0)["run"].content == "run says hi"  # earlier turns stay
    assert store.clear_chat(sid) == 6
    assert store.chat_history(sid) == [] and store.pending_chat_replies() == []
    assert store.regenerate_chat_turn(sid) is None
    assert store.add_chat_turn(sid, "Fresh") == 0  # a cleared session starts again at turn 0


def test_a_reply_whose_worker_went_away_is_failed_with_that_reason(store: Store) -> None:
    sid = store.create_chat(_run(store))
    store.add_chat_turn(sid, "Hi")
    base, run = store.pending_chat_replies()
    store.chat_service_beat("alive:1", "alive", False)
    assert store.claim_chat_reply(base.id, "alive:1") and store.claim_chat_reply(run.id, "gone:2")
    assert store.fail_stale_chat_replies(15.0) == [run.id]
    failed = _replies(store, sid, 0)["run"]
    assert failed.status is ReplyStatus.FAILED and "the worker gone:2 stopped while answering" in failed.error
    assert _replies(store, sid, 0)["base"].status is ReplyStatus.STREAMING  # its service is live
    assert [s["host"] for s in store.chat_services()] == ["alive"]
    store.chat_service_gone("alive:1")
    assert store.chat_services() == []


def test_a_sessions_messages_go_with_its_run(store: Store) -> None:
    run_id = _run(store)
    sid = store.create_chat(run_id)
    store.add_chat_turn(sid, "Hi")
    store.mark_cancelled(run_id)
    store.delete_run(run_id)
    assert store.chat_session(sid) is None and store.pending_chat_replies() == []


def test_each_side_continues_its_own_conversation(store: Store) -> None:
    sid = store.create_chat(_run(store))
    store.add_chat_turn(sid, "One")
    for reply in store.pending_chat_replies():
        store.claim_chat_reply(reply.id, "h:1")
        if reply.side == "run":
            store.finish_chat_reply(reply.id, "h:1", "run one")
        else:
            store.fail_chat_reply(reply.id, "h:1", "broke")
    store.add_chat_turn(sid, "Two")
    history = store.chat_history(sid)
    assert conversation(history, 1, "run") == [
        {"role": "user", "content": "One"},
        {"role": "assistant", "content": "run one"},
        {"role": "user", "content": "Two"},
    ]
    # The base's first reply failed: its history leaves that turn out, so the roles still alternate.
    assert conversation(history, 1, "base") == [{"role": "user", "content": "Two"}]
    with pytest.raises(KeyError):
        conversation(history, 5, "run")


def test_a_one_off_request_holds_its_conversation_and_one_pending_reply(store: Store) -> None:
    """The /v1 API's request: the client's turns as one side's history, one reply of that side pending."""
    run_id = _run(store)
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Moon?"},
    ]
    sid, reply_id = store.ask_chat_reply(run_id, "base", turns, "Be brief.", {"max_new_tokens": 8, "raw": False})
    pending = [r for r in store.pending_chat_replies() if r.session_id == sid]
    assert [r.id for r in pending] == [reply_id] and pending[0].side == "base" and pending[0].turn == 1
    assert conversation(store.chat_history(sid), 1, "base") == turns
    assert store.chat_session(sid).system == "Be brief."
    assert store.chat_message(reply_id).status is ReplyStatus.PENDING
    store.delete_chat(sid)
    assert store.chat_message(reply_id) is None and store.chat_session(sid) is None


def test_a_requests_session_is_never_the_tabs_conversation(store: Store) -> None:
    """A /v1 request's session (kind api) is never the run's Chat tab conversation, however recent: the tab
    reads and writes its own (kind tab), and a tab message never joins the request's session."""
    run_id = _run(store)
    sid, _ = store.ask_chat_reply(run_id, "run", [{"role": "user", "content": "from the API"}])
    assert store.latest_chat(run_id) is None  # only a request's session: the tab has none yet
    tab = store.create_chat(run_id)
    store.add_chat_turn(tab, "from the tab")
    later, _ = store.ask_chat_reply(run_id, "run", [{"role": "user", "content": "the API again"}])
    latest = store.latest_chat(run_id)
    assert latest is not None and latest.id == tab and latest.kind is ChatKind.TAB
    assert [s.id for s in store.chat_sessions(run_id, ChatKind.API)] == [sid, later]
    assert [m.content for m in store.chat_history(tab) if m.role == "user"] == ["from the tab"]
    assert store.delete_api_chats(before=time.time() + 1) == 2  # what a stopped dashboard left, swept
    assert [s.id for s in store.chat_sessions(run_id)] == [tab]


def test_a_schema_11_database_gains_the_sessions_kind(store: Store) -> None:
    """Migration 12 on SQLite and PostgreSQL: the sessions already there are the tab's."""
    from sqlalchemy import text

    from storage import models as m

    run_id = _run(store)
    old = store.create_chat(run_id)
    with store._write_engine.begin() as con:  # as schema 11 left it: sessions without a kind
        con.execute(text("ALTER TABLE chat_sessions DROP COLUMN kind"))
        con.execute(text("UPDATE meta SET value = '11' WHERE key = 'schema_version'"))
    again = Store(store.url)
    try:
        assert again.schema_version == m.SCHEMA_VERSION >= 12
        assert again.chat_session(old).kind is ChatKind.TAB and again.latest_chat(run_id).id == old
        sid, _ = again.ask_chat_reply(run_id, "run", [{"role": "user", "content": "Hi"}])
        assert again.chat_session(sid).kind is ChatKind.API and again.latest_chat(run_id).id == old
    finally:
        again.dispose()
