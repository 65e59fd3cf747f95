"""The Chat tab's Regenerate draws a sampled answer anew: it moves the session to its next seed before the replies are
pending again, and a later send keeps that seed (the worker samples each reply with the session's seed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from training_helpers import tiny_spec

from app.ui.chat import regenerate, session_sampling
from jobs.chat.generate import Sampling
from storage.models import ReplyStatus


@pytest.fixture
def answered(store: Any, tiny_model: Path) -> tuple[int, int]:
    """(run id, session id): a finished run whose tab session has one turn answered by both sides."""
    run_id = store.create_run(tiny_spec(tiny_model, run_name="regen"))
    assert store.claim_next_on_device("w1", "0").id == run_id
    store.mark_succeeded(run_id, {})
    sid = store.create_chat(run_id, "", {"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 8})
    store.add_chat_turn(sid, "Hi")
    for reply in store.pending_chat_replies():
        assert store.claim_chat_reply(reply.id, "w1") and store.finish_chat_reply(reply.id, "w1", "an answer")
    return run_id, sid


def test_regenerate_moves_the_session_to_its_next_seed_and_asks_again(store: Any, answered: tuple[int, int]) -> None:
    run_id, sid = answered
    for expected in (1, 2):
        regenerate(store, run_id)
        session = store.chat_session(sid)
        assert session.sampling == {"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 8, "seed": expected}
        replies = [m for m in store.chat_history(sid) if m.role == "assistant"]
        assert [r.status for r in replies] == [ReplyStatus.PENDING] * 2 and all(r.content == "" for r in replies)
        assert Sampling.from_dict(session.sampling).seed == expected  # what the worker samples the replies with


def test_a_send_keeps_the_seed_regenerate_moved_to() -> None:
    tab = Sampling(temperature=0.7, top_p=0.9, max_new_tokens=32)
    assert session_sampling(tab, {}) == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 32}
    kept = session_sampling(tab, {"temperature": 0.1, "seed": 3})
    assert kept == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 32, "seed": 3}
