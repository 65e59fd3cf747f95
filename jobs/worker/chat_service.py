"""The chat service: a worker answers the chat turns the dashboard writes, for runs whose weights it reaches.

    worker = Worker(store, services=[chat_service])   # `tunedeck worker` does this (app.cli.main)

A thread polls the store for pending replies (`Store.pending_chat_replies`, one indexed SELECT every
`POLL_S`), takes one whose run's weights are here (`jobs.worker.services.weights_here`) with a guarded
claim, and answers it with the generation process (`jobs.chat.process.ChatProcess`: one model pair
at a time, its idle exit, the device rules: never on a GPU a training run holds, and it leaves its
GPU as soon as a run takes it). The side is given the whole conversation so far with the session's
system prompt and sampling (`jobs.chat.conversation`). Tokens go into the store as they come, one
UPDATE per `FLUSH_S` at most (the first piece at once, so the first token shows without waiting);
a cold start writes its progress first ("loading run 3's model on HOST"). A failure is the reply's
error, with the real message. The service announces itself every `BEAT_S` (the dashboard tells a
user when no live worker can reach a run's weights) and fails replies left streaming by a worker
that went away.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback

from jobs.chat.conversation import conversation
from jobs.chat.device import DEVICE_ENV
from jobs.chat.generate import ChatError, Sampling
from jobs.chat.process import ChatProcess
from jobs.worker.services import Place, weights_here
from storage.roles_chat import ChatServing
from storage.store import ChatMessageRecord

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often an idle service looks for pending replies (one indexed SELECT)
FLUSH_S = 0.1  # at most one UPDATE of a streaming reply's text per this many seconds
BEAT_S = 5.0  # the service's presence row; replies streaming by a service unheard of for STALE_S fail
STALE_S = 20.0


class ChatService:
    """Answers pending chat replies on this worker (a `jobs.worker.services.Service`)."""

    name = "chat"

    def __init__(self, place: Place, chat: ChatProcess | None = None, poll_s: float = POLL_S):
        self.place = place
        self.store: ChatServing = place.store
        # TUNEDECK_CHAT_DEVICE picks another device of this host; else the worker's own (its GPU's lease rules)
        device = os.environ.get(DEVICE_ENV, "").strip() or ("cpu" if place.on_cpu else place.device)
        self.chat = chat or ChatProcess(place.store, host=place.host, device=device)
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reach: dict[int, bool] = {}  # run id -> its weights are here (a trained run's host never changes)
        self.answered = 0
        self._looking = False  # between looking for a reply and the end of the one it claimed

    def start(self) -> None:
        self.store.chat_service_beat(self.place.worker_id, self.place.host, self.place.shared_data)
        # Two threads: the presence beat must go on while a long answer (or a cold load) is under way.
        self._threads = [
            threading.Thread(target=self._loop, name="chat-service", daemon=True),
            threading.Thread(target=self._beat_loop, name="chat-service-beat", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.chat.close()  # a reply under way ends now (its child is killed) and is failed as stopped
        for thread in self._threads:
            thread.join(timeout=30)
        try:
            self.store.chat_service_gone(self.place.worker_id)
        except Exception:
            log.exception("could not remove the chat service's presence row")

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self.store.chat_service_beat(self.place.worker_id, self.place.host, self.place.shared_data)
                self.store.fail_stale_chat_replies(STALE_S)
            except Exception:  # the store is away: the next beat tries again (training goes on)
                log.exception("chat service: could not announce itself; trying again in %.0f s", BEAT_S)

    def pending(self) -> bool:
        return self._looking or any(self.reaches(r.run_id) for r in self.store.pending_chat_replies())

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._looking = True  # a reply claimed is no longer pending: pending() still sees it
                try:
                    answered = self.answer_one()
                finally:
                    self._looking = False
                if answered:
                    continue
            # The store being away must not end the service: say so and look again (training goes on).
            except Exception:
                log.exception("chat service: a poll failed; looking again in %.0f s", BEAT_S)
                self._stop.wait(BEAT_S)
                continue
            self._stop.wait(self.poll_s)

    def reaches(self, run_id: int) -> bool:
        if run_id in self._reach:
            return self._reach[run_id]
        run = self.store.get_run(run_id)
        here = run is not None and weights_here(run, self.place)
        if run is not None and run.worker_id:  # kept once the run has its host (a run not yet trained may get one)
            self._reach[run_id] = here
        return here

    def answer_one(self) -> bool:
        """Claim and answer one pending reply whose weights are here; False when there was none."""
        for reply in self.store.pending_chat_replies():
            if not self.reaches(reply.run_id):
                continue
            warm = self.chat.holds(reply.run_id)
            note = None if warm else f"loading run {reply.run_id}'s model on the worker {self.place.worker_id}"
            if self.store.claim_chat_reply(reply.id, self.place.worker_id, note):
                self.answer(reply)
                self.answered += 1
                return True
        return False

    def answer(self, reply: ChatMessageRecord) -> None:
        """Generate the claimed `reply` with its side's conversation, streaming the text into the store."""
        worker = self.place.worker_id
        text = ""
        try:
            session = self.store.chat_session(reply.session_id)
            if session is None:
                return  # deleted with its run: nothing to write to
            turns = conversation(self.store.chat_history(reply.session_id), reply.turn, reply.side or "run")
            sampling = Sampling.from_dict(session.sampling)
            kept, flushed = True, 0.0
            for piece in self.chat.stream(reply.run_id, reply.side or "run", turns, session.system, sampling):
                text += piece
                if kept and time.monotonic() - flushed >= FLUSH_S:
                    # False: regenerated or cleared meanwhile. The rest is drawn, not written, so the
                    # model stays loaded for the next request (an abandoned stream kills its child).
                    kept = self.store.stream_chat_reply(reply.id, worker, text)
                    flushed = time.monotonic()
            if kept:
                self.store.finish_chat_reply(reply.id, worker, text)
        except ChatError as exc:
            why = "; ".join(f"{p.field}: {p.problem}. Fix: {p.fix}" for p in exc.problems)
            if self._stop.is_set():
                why = f"the worker {worker} stopped while answering; regenerate to ask again"
            self.store.fail_chat_reply(reply.id, worker, why)
        # Broad: whatever generation raised is that reply's error (with the real message), and the
        # service goes on with the next one; the traceback goes to the worker's log.
        except Exception as exc:  # noqa: BLE001 - the reply's error, logged with its traceback
            log.error("chat reply %s failed:\n%s", reply.id, traceback.format_exc())
            self.store.fail_chat_reply(reply.id, worker, f"generation failed: {type(exc).__name__}: {exc}")


def chat_service(place: Place) -> ChatService:
    """The chat service's factory for `Worker(services=[...])`."""
    return ChatService(place)
