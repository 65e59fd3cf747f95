"""The worker's chat service with real generation: a two-turn conversation through the store, both sides.

The dashboard's part is only store calls here (add a turn, read the history): the service claims the
replies, gives each side its whole conversation, streams the text into the store and records failures.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import PROMPT, TAUGHT, broken_copy
from training_helpers import claim_run, tiny_spec, wait_for

from jobs.chat.generate import Sampling, load, locate
from jobs.chat.process import ChatProcess
from jobs.worker.chat_service import ChatService
from jobs.worker.services import Place
from storage.models import ReplyStatus

NEW_TOKENS = 16
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": NEW_TOKENS, "seed": 0}
SECOND = "And what about the sun?"


class RecordingChat(ChatProcess):
    """The real generation process, keeping what each side was given (run, side, turns, system)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.given: list[tuple[int, str, Any, str]] = []

    def stream(self, run_id: int, which: str, prompt: Any, system: str = "", sampling: Any = None) -> Any:
        self.given.append((run_id, which, prompt, system))
        return super().stream(run_id, which, prompt, system, sampling)


class SlowChat:
    """A stand-in generation process: one piece, then a pause longer than the stale limit, then the rest."""

    def __init__(self, pause: float) -> None:
        self.pause = pause

    def holds(self, run_id: int) -> bool:
        return False

    def stream(self, run_id: int, which: str, prompt: Any, system: str = "", sampling: Any = None) -> Any:
        yield "Hel"
        time.sleep(self.pause)
        yield "lo"

    def close(self) -> None:
        pass


def test_a_long_answer_keeps_its_worker_alive_and_a_stopped_service_is_gone(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The presence beat goes on while an answer (or a cold load) takes longer than the stale limit."""
    import jobs.worker.chat_service as service_module
    from jobs.spec.job import JobSpec

    monkeypatch.setattr(service_module, "BEAT_S", 0.1)
    monkeypatch.setattr(service_module, "STALE_S", 0.5)
    run_id = store.create_run(JobSpec.from_dict({"model": "tiny-llama", "dataset": "sample:chat-format"}))
    host = socket.gethostname()
    assert store.claim_next_on_device(f"{host}:1", "cpu") is not None
    store.mark_succeeded(run_id, {})
    place = Place(store, f"{host}:2", host, "cpu", on_cpu=True, shared_data=False)
    service = ChatService(place, SlowChat(pause=1.5), poll_s=0.05)  # type: ignore[arg-type]
    sid = store.create_chat(run_id, sampling=SAMPLING)
    store.add_chat_turn(sid, "Hi")
    assert service.pending()  # two replies its worker can give: a burst worker waits for them
    service.start()
    try:
        wait_for(lambda: _replies(store, sid, 0)["base"].content == "Hel", what="the first piece")
        assert service.pending()  # one under way (no longer pending in the store), one still pending
        time.sleep(0.8)  # longer than the stale limit, mid-answer: the dashboard's tick must not fail it
        assert store.fail_stale_chat_replies(0.5) == []
        replies = _finished(store, sid, 0)
        assert {s: (r.status, r.content) for s, r in replies.items()} == {
            "base": (ReplyStatus.DONE, "Hello"),
            "run": (ReplyStatus.DONE, "Hello"),
        }
        wait_for(lambda: not service.pending(), what="nothing left for the service")
    finally:
        service.stop()
    assert store.chat_services() == []


@pytest.fixture(scope="module")
def served(tag_store):
    """(store, ids, service, chat, pair): a chat service of this host's worker over the session's tag runs."""
    _, store, ids = tag_store
    host = socket.gethostname()
    chat = RecordingChat(store, idle_s=120, host=host, device="cpu")
    place = Place(store, f"{host}:chat-test", host, "cpu", on_cpu=True, shared_data=False)
    service = ChatService(place, chat, poll_s=0.05)
    service.start()
    pair = load(locate(store, ids["lora"]), "cpu")
    yield store, ids, service, chat, pair
    service.stop()
    chat.close()


def _replies(store: Any, sid: int, turn: int) -> dict[str, Any]:
    return {m.side: m for m in store.chat_history(sid) if m.turn == turn and m.role == "assistant"}


def _finished(store: Any, sid: int, turn: int) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        replies = _replies(store, sid, turn)
        finished = all(r.status in (ReplyStatus.DONE, ReplyStatus.FAILED) for r in replies.values())
        return replies if finished else None

    return wait_for(done, timeout=300, what=f"both replies of turn {turn}")


@pytest.mark.integration
def test_a_two_turn_conversation_on_both_sides(served) -> None:
    store, ids, _, chat, pair = served
    run_id = ids["lora"]
    sampling = Sampling.from_dict(SAMPLING)
    sid = store.create_chat(run_id, system="", sampling=SAMPLING)
    store.add_chat_turn(sid, PROMPT)
    first = _finished(store, sid, 0)
    assert {s: r.status for s, r in first.items()} == {"base": ReplyStatus.DONE, "run": ReplyStatus.DONE}
    assert first["run"].content == pair.answer("run", PROMPT, sampling=sampling) and TAUGHT in first["run"].content
    assert first["base"].content == pair.answer("base", PROMPT, sampling=sampling)
    assert TAUGHT not in first["base"].content
    chat.given.clear()
    store.add_chat_turn(sid, SECOND)
    second = _finished(store, sid, 1)
    # Each side was given the first turn, its own first answer, then the second prompt.
    given = {which: turns for _, which, turns, _ in chat.given}
    for side in ("base", "run"):
        expected = [
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": first[side].content},
            {"role": "user", "content": SECOND},
        ]
        assert given[side] == expected
        assert second[side].status is ReplyStatus.DONE
        assert second[side].content == pair.answer(side, expected, sampling=sampling)
        assert second[side].worker_id == f"{socket.gethostname()}:chat-test"
    # The chat template put the first prompt into the second turn's input.
    ids_given = pair.inputs(given["run"])["input_ids"][0].tolist()
    alone = pair.inputs(SECOND)["input_ids"][0].tolist()
    first_ids = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert len(ids_given) > len(alone) and _contains(ids_given, first_ids) and not _contains(alone, first_ids)
    # Regenerate: the last turn again (greedy: the same answers); clear: nothing left.
    assert store.regenerate_chat_turn(sid) == 1
    again = _finished(store, sid, 1)
    assert {s: r.content for s, r in again.items()} == {s: r.content for s, r in second.items()}
    assert store.clear_chat(sid) == 6 and store.chat_history(sid) == []


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


@pytest.mark.integration
def test_first_token_of_a_warm_model_through_the_store(served) -> None:
    """Measured, not asserted on time: a turn's first streamed text, from the write to the read back."""
    store, ids, _, chat, _ = served
    sid = store.create_chat(ids["lora"], sampling={**SAMPLING, "max_new_tokens": 64})
    store.add_chat_turn(sid, PROMPT)
    _finished(store, sid, 0)  # warm now
    assert chat.holds(ids["lora"])
    store.add_chat_turn(sid, SECOND)
    started = time.monotonic()
    wait_for(lambda: _replies(store, sid, 1)["base"].content, timeout=120, interval=0.005, what="a first token")
    print(f"\nfirst token through the store (warm, tiny model, CPU): {time.monotonic() - started:.3f} s")
    _finished(store, sid, 1)


@pytest.mark.integration
def test_failures_are_the_replys_error_and_other_hosts_runs_are_left(served, tiny_model: Path) -> None:
    store, ids, service, _, _ = served
    host = socket.gethostname()
    broken = broken_copy(store, ids["lora"], tiny_model, worker_id=f"{host}:1")
    sid = store.create_chat(broken, sampling=SAMPLING)
    store.add_chat_turn(sid, PROMPT)
    failed = _finished(store, sid, 0)
    for reply in failed.values():
        assert reply.status is ReplyStatus.FAILED
        assert f"run {broken}'s model failed to load" in reply.error and "Fix:" in reply.error
    # A run trained on another host (no shared data folder): this worker leaves its replies pending.
    elsewhere = store.create_run(tiny_spec(tiny_model, run_name="elsewhere"))
    claim_run(store, elsewhere, "other-host:7", "0", host="other-host")
    store.mark_succeeded(elsewhere, {})
    sid = store.create_chat(elsewhere, sampling=SAMPLING)
    store.add_chat_turn(sid, PROMPT)
    answered = service.answered
    time.sleep(0.5)  # ten of the service's polls: it must not take them
    assert service.answered == answered
    assert {r.status for r in _replies(store, sid, 0).values()} == {ReplyStatus.PENDING}
    store.clear_chat(sid)
    assert [s["worker_id"] for s in store.chat_services()] == [f"{host}:chat-test"]


@pytest.mark.integration
def test_the_chat_tabs_handlers_write_turns_and_show_the_workers_answers(served, tiny_model: Path) -> None:
    from app.ui.chat import BLANK, clear, policy_problem, reach_problem, send, tick
    from jobs.checks.access import AccessPolicy

    store, ids, _, _, pair = served
    run_id = ids["lora"]
    # The tab continues the run's latest session (an earlier test's, if any): Clear empties it first.
    if store.latest_chat(run_id) is None:
        store.add_chat_turn(store.create_chat(run_id), "left over")
    status, base, tuned, timer = clear(store, run_id)
    assert (status, base, tuned, timer.active) == ("Cleared.", [], [], False)
    status, base, tuned, timer, cleared, _ = send(store, None, run_id, "", 0.0, 1.0, NEW_TOKENS, PROMPT)
    assert timer.active and cleared == "" and base[0] == {"role": "user", "content": PROMPT}
    shown = wait_for(lambda: (lambda r: None if r[3].active else r)(tick(store, run_id)), timeout=300, what="done")
    status, base, tuned, _ = shown
    sampling = Sampling.from_dict(SAMPLING)
    assert status == "Done."
    answer = pair.answer("base", PROMPT, sampling=sampling)
    assert base[-1] == {"role": "assistant", "content": answer if answer.strip() else BLANK}
    assert tuned[-1]["content"] == pair.answer("run", PROMPT, sampling=sampling) and TAUGHT in tuned[-1]["content"]
    assert send(store, None, run_id, "", 0.0, 1.0, NEW_TOKENS, "  ")[0] == "Write a message first."
    assert "temperature" in send(store, None, run_id, "", 9.0, 1.0, NEW_TOKENS, PROMPT)[0]
    # A run trained on a host with no live worker: the host and the fix; nothing is written.
    elsewhere = store.create_run(tiny_spec(tiny_model, run_name="far"))
    claim_run(store, elsewhere, "far-host:3", "0", host="far-host")
    store.mark_succeeded(elsewhere, {})
    problem = reach_problem(store, elsewhere)
    assert "far-host" in problem and "tunedeck worker" in problem and "TUNEDECK_SHARED_DATA=1" in problem
    status, _, _, timer, *_ = send(store, None, elsewhere, "", 0.0, 1.0, NEW_TOKENS, PROMPT)
    assert status == problem and not timer.active and store.latest_chat(elsewhere) is None
    # Remote code needs the shared server's permission, as for training.
    remote = store.create_run(tiny_spec(tiny_model, trust_remote_code=True))
    shared = AccessPolicy(restricted=True, allow_remote_code=False)
    assert "trust_remote_code" in policy_problem(store, remote, shared).problem
    assert policy_problem(store, remote, AccessPolicy.open()) is None


@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.integration
def test_smollm2_first_token_of_a_warm_model_through_the_store(
    smollm2_run: tuple[Path, int], smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2 on the CPU, warm: the time from writing a turn to reading its first text back (printed)."""
    from storage.store import Store

    folder, run_id = smollm2_run
    monkeypatch.setenv("TUNEDECK_HOME", str(folder))
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    host = socket.gethostname()
    chat = ChatProcess(store, idle_s=120, host=host, device="cpu")
    service = ChatService(Place(store, f"{host}:smollm2", host, "cpu", on_cpu=True, shared_data=False), chat)
    service.start()
    try:
        sid = store.create_chat(run_id, sampling={**SAMPLING, "max_new_tokens": 32})
        store.add_chat_turn(sid, PROMPT)
        cold = time.monotonic()
        first = _finished(store, sid, 0)
        print(f"\nSmolLM2 cold turn (load + two answers): {time.monotonic() - cold:.1f} s")
        assert {r.status for r in first.values()} == {ReplyStatus.DONE}
        times = []
        for i, text in enumerate((SECOND, "Thanks! One more thing?"), start=1):
            store.add_chat_turn(sid, text)
            started = time.monotonic()
            wait_for(lambda i=i: _replies(store, sid, i)["base"].content, timeout=120, interval=0.005, what="a token")
            times.append(time.monotonic() - started)
            replies = _finished(store, sid, i)
            assert {r.status for r in replies.values()} == {ReplyStatus.DONE}, replies
        print(f"SmolLM2 first token through the store, warm, CPU: {', '.join(f'{t:.3f} s' for t in times)}")
    finally:
        service.stop()
        store.dispose()
