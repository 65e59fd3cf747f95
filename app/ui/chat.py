"""The Chat tab: a finished run and its base model answer the same prompt, side by side, streaming.

Pick a succeeded run, optionally write a system prompt, set temperature / top_p / max new tokens
(temperature 0, the default, is greedy: the same prompt gives the same answers), and ask. The
"Base model" column answers first, then "This run", with the same sampling; each streams its
tokens as they are generated. Generation happens in a separate process (`jobs.chat.process`)
under the training device rules, which exits after an idle timeout to free the memory. Problems
(no finished runs, a run without a result, a busy GPU, a model that fails to load) are shown in
the status line with the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.chat.generate import MAX_NEW_TOKENS, ChatError, Sampling
from jobs.chat.process import ChatProcess
from jobs.checks.access import AccessPolicy, loading_problem
from jobs.errors import Problem
from jobs.spec.stored import spec_of
from storage.models import RunStatus
from storage.store import Store

NO_RUNS = "No finished runs yet: launch one in the Launch tab; once it succeeds it can be picked here."


@dataclass
class ChatView:
    run: gr.Dropdown
    refresh: gr.Button
    system: gr.Textbox
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Number
    prompt: gr.Textbox
    ask: gr.Button
    status: gr.Markdown
    base: gr.Textbox
    tuned: gr.Textbox

    @property
    def inputs(self) -> list[Any]:
        return [self.run, self.system, self.temperature, self.top_p, self.max_new_tokens, self.prompt]


def build() -> ChatView:
    gr.Markdown(
        "Ask a finished run and its base model the same thing: same prompt, same sampling, "
        "the run's chat template. Temperature 0 is greedy decoding (reproducible answers)."
    )
    with gr.Row():
        run = gr.Dropdown([], label="Finished run", elem_id="chat-run-choice", scale=3)
        refresh = gr.Button("Refresh runs", scale=0)
    system = gr.Textbox(label="System prompt (optional)", lines=1, elem_id="chat-system")
    with gr.Row():
        temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
        top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top_p")
        max_new_tokens = gr.Number(128, precision=0, minimum=1, maximum=MAX_NEW_TOKENS, label="Max new tokens")
    prompt = gr.Textbox(label="Prompt", lines=2, elem_id="chat-prompt")
    ask = gr.Button("Ask both", variant="primary", elem_id="chat-ask")
    status = gr.Markdown(elem_id="chat-status")
    with gr.Row():
        base = gr.Textbox(label="Base model", lines=8, interactive=False, elem_id="chat-base")
        tuned = gr.Textbox(label="This run", lines=8, interactive=False, elem_id="chat-tuned")
    return ChatView(run, refresh, system, temperature, top_p, max_new_tokens, prompt, ask, status, base, tuned)


def run_choices(store: Store) -> list[tuple[str, int]]:
    """Succeeded runs, newest first, as (label, id)."""
    return [
        (f"{r.id} · {r.name} ({spec_of(r).method.value}, {spec_of(r).trainer.value})", r.id)
        for r in store.list_runs(status=RunStatus.SUCCEEDED)
    ]


def policy_problem(store: Store, run_id: int, policy: AccessPolicy | None) -> Problem | None:
    """Loading a run whose model ships its own code needs the server's permission, as training does."""
    run = store.get_run(run_id)
    return None if run is None else loading_problem(spec_of(run), run_id, policy, "chat with it")


def _problems_text(exc: ChatError) -> str:
    return "\n".join(f"**{p.field}**: {p.problem}. Fix: {p.fix}" for p in exc.problems)


def ask(
    store: Store,
    chat: ChatProcess,
    policy: AccessPolicy | None,
    run_id: Any,
    system: str,
    temperature: float,
    top_p: float,
    max_new_tokens: float | None,
    prompt: str,
) -> Iterator[tuple[str, str, str]]:
    """Stream (status, base answer, run answer): the base first, then the run, same prompt and sampling."""
    if run_id in (None, ""):
        none = not store.list_runs(status=RunStatus.SUCCEEDED, limit=1)
        yield (NO_RUNS if none else "Pick a finished run first."), "", ""
        return
    if not (prompt or "").strip():
        yield "Write a prompt first.", "", ""
        return
    refused = policy_problem(store, int(run_id), policy)
    if refused is not None:
        yield _problems_text(ChatError([refused])), "", ""
        return
    sampling = Sampling(float(temperature or 0.0), float(top_p or 1.0), int(max_new_tokens or 128))
    answers = {"base": "", "run": ""}
    way = "greedy" if sampling.temperature <= 0 else f"temperature {sampling.temperature}, top_p {sampling.top_p}"
    try:
        for which in ("base", "run"):
            status = f"Answering with the {'base model' if which == 'base' else 'run'} ({way})…"
            yield status, answers["base"], answers["run"]
            for piece in chat.stream(int(run_id), which, prompt, system or "", sampling):
                answers[which] += piece
                yield status, answers["base"], answers["run"]
    except ChatError as exc:
        yield _problems_text(exc), answers["base"], answers["run"]
        return
    blank = [label for which, label in (("base", "the base model"), ("run", "the run")) if not answers[which].strip()]
    note = f" {' and '.join(blank).capitalize()} answered with whitespace only." if blank else ""
    yield f"Done ({way}).{note}", answers["base"], answers["run"]


def wire(
    view: ChatView,
    store: Store,
    tab: gr.Tab | None = None,
    policy: AccessPolicy | None = None,
    chat: ChatProcess | None = None,
) -> ChatProcess:
    """Wire the tab's events; returns the generation process manager (started on the first question)."""
    chat = chat or ChatProcess(store)

    def choices(current: Any) -> tuple[Any, str]:
        found = run_choices(store)
        if not found:
            return gr.Dropdown(choices=[], value=None), NO_RUNS
        keep = current if current in {value for _, value in found} else found[0][1]
        return gr.Dropdown(choices=found, value=keep), ""

    opens = [view.refresh.click] + ([tab.select] if tab is not None else [])
    for event in opens:
        event(choices, view.run, [view.run, view.status], show_progress="hidden", api_visibility="private")
    view.ask.click(
        lambda *args: (yield from ask(store, chat, policy, *args)),
        view.inputs,
        [view.status, view.base, view.tuned],
        api_visibility="private",
        concurrency_limit=1,
        concurrency_id="chat",
    )
    return chat
