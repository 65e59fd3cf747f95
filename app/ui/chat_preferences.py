"""The Chat tab's preference picks: "Base is better" / "Run is better" under the two answers, and a thumb up or down
on the run's answer, each appended to a named preference data set (`jobs.data.preferences`).

The prompt of a row is the conversation so far as the run's column shows it (the system prompt, the earlier user
messages and the run's earlier answers, then the last user message); the two answers are the last turn's. A pick
needs both answers finished; it never asks a worker anything. The set's files are then in the Launch form's data
picker (a DPO run trains on the pairs, a KTO run on the thumbs) and downloadable here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.data import preferences
from jobs.data.preferences import Turn
from jobs.errors import Problem, ProblemError
from storage.models import ReplyStatus
from storage.roles import ChatHistory
from storage.store import ChatMessageRecord


@dataclass
class PreferenceView:
    name: gr.Textbox
    base_better: gr.Button
    run_better: gr.Button
    thumb_up: gr.Button
    thumb_down: gr.Button
    status: gr.Markdown
    download: gr.File


def build() -> PreferenceView:
    with gr.Accordion("Make preference data from these answers", open=False, elem_id="chat-pref"):
        gr.Markdown(
            "Pick the better answer of the last turn (a DPO pair) or judge the run's answer (a KTO row). Rows go to "
            "the named data set in the data folder; pick its file as the dataset of a `dpo` or `kto` run."
        )
        with gr.Row():
            name = gr.Textbox(preferences.DEFAULT_SET, label="Preference data set", elem_id="chat-pref-set", scale=2)
            base_better = gr.Button("Base is better", elem_id="chat-pref-base")
            run_better = gr.Button("Run is better", elem_id="chat-pref-run")
            thumb_up = gr.Button("👍 Run's answer is good", elem_id="chat-pref-up")
            thumb_down = gr.Button("👎 Run's answer is bad", elem_id="chat-pref-down")
        status = gr.Markdown(elem_id="chat-pref-status")
        download = gr.File(label="The set's file", interactive=False, elem_id="chat-pref-file")
    return PreferenceView(name, base_better, run_better, thumb_up, thumb_down, status, download)


def last_turn(store: ChatHistory, run_id: Any) -> tuple[list[Turn], str, str]:
    """(the conversation up to the last user message, the base's last answer, the run's last answer)."""
    session = None if run_id in (None, "") else store.latest_chat(int(run_id))
    history = store.chat_history(session.id) if session is not None else []
    users = [i for i, m in enumerate(history) if m.role == "user"]
    if not users:
        raise ProblemError([Problem("conversation", "nothing has been said yet", "send a message first")])
    last = users[-1]
    turns = [Turn("system", session.system)] if session is not None and session.system else []
    for message in history[:last]:
        if message.role == "user":
            turns.append(Turn("user", message.content, bool(message.image)))
        elif message.side == "run":
            turns.append(Turn("assistant", message.content))
    turns.append(Turn("user", history[last].content, bool(history[last].image)))
    return turns, _answer(history[last + 1 :], "base"), _answer(history[last + 1 :], "run")


def _answer(replies: list[ChatMessageRecord], side: str) -> str:
    reply = next((m for m in replies if m.side == side), None)
    if reply is None or reply.status is not ReplyStatus.DONE:
        label = "the base model's" if side == "base" else "the run's"
        raise ProblemError([Problem("conversation", f"{label} answer has not finished", "wait for both answers")])
    return reply.content


def pick(store: ChatHistory, run_id: Any, name: str, choice: str) -> tuple[str, Any]:
    """Append the pick (`base` or `run` better, `up` or `down` on the run's answer); (status line, file to show)."""
    try:
        set_name = preferences.check_name(name)
        prompt, base, run = last_turn(store, run_id)
        if choice in ("base", "run"):
            chosen, rejected = (base, run) if choice == "base" else (run, base)
            count = preferences.add_pair(set_name, prompt, chosen, rejected)
            path, what = preferences.path_of(set_name, "dpo"), f"{count} pair{'s' * (count != 1)}"
        else:
            count = preferences.add_judgement(set_name, prompt, run, good=choice == "up")
            path, what = preferences.path_of(set_name, "kto"), f"{count} judged answer{'s' * (count != 1)}"
    except ProblemError as exc:
        return "\n".join(f"**{p.field}**: {p.problem}. Fix: {p.fix}" for p in exc.problems), gr.skip()
    return f"Saved: `{set_name}` holds {what} (`{path}`).", str(path)


def wire(view: PreferenceView, run: gr.Dropdown, store: ChatHistory) -> None:
    quiet: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}
    for button, choice in (
        (view.base_better, "base"),
        (view.run_better, "run"),
        (view.thumb_up, "up"),
        (view.thumb_down, "down"),
    ):
        button.click(
            lambda r, n, c=choice: pick(store, r, n, c), [run, view.name], [view.status, view.download], **quiet
        )
