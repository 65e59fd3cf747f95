"""The Chat tab: a conversation with a finished run and its base model, side by side, answered by a worker.

Pick a succeeded run, optionally write a system prompt, set temperature / top_p / max new tokens
(temperature 0, the default, is greedy: the same conversation gives the same answers), and send.
Each message is a turn of the run's chat session in the store (`storage.store_chat`): the tab writes
the user's message with a pending reply for each side, and a worker that reaches the run's weights
answers them (`jobs.worker.chat_service`): "Base model" and "This run" each continue their own
conversation on the same user messages, with the run's chat template. The dashboard never loads a
model. The history survives a reload (the run's latest session is shown again); Regenerate asks the
last turn again, Clear empties the session. A message may carry one image for a vision-language run:
the tab keeps it in the run's folder (`jobs.chat.images.keep_image`) and the turn names the file; both
sides get it with the turn. An image for a text-only run is refused before anything is written.

While a reply is pending or streaming, a timer reads the session every `TICK_S` and shows the text
so far; once both are done it stops, so an idle tab makes no requests at all. A cold start shows the
worker's progress ("loading run 3's model on the worker ..."). When no live worker can reach the
run's weights the tab says so, naming the host and the fix, and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any

import gradio as gr

from jobs.chat.generate import MAX_NEW_TOKENS, ChatError, RunResult, Sampling, locate
from jobs.chat.images import image_problem, keep_image
from jobs.checks.access import AccessPolicy, loading_problem
from jobs.errors import Problem
from jobs.spec.stored import spec_of
from jobs.worker.services import SHARED_DATA_ENV, run_host
from storage.models import ReplyStatus, RunStatus
from storage.roles import ChatHistory, RunLister, RunReader
from storage.roles_chat import ChatLength, ChatReach, ChatReading, ChatTab, ChatTurnActions, ChatWriting
from storage.store import ChatMessageRecord

NO_RUNS = "No finished runs yet: launch one in the Launch tab; once it succeeds it can be picked here."
TICK_S = 0.2  # how often the tab reads a session while one of its replies is pending or streaming
OPEN = (ReplyStatus.PENDING, ReplyStatus.STREAMING)
BLANK = "(an empty answer: only whitespace or special tokens)"
EVENTS = "chat-tab"  # the concurrency group of every event of the tab (see `wire`)
IMAGE_MARK = "[image] "  # a user turn with an image, as the columns show it


@dataclass
class ChatView:
    run: gr.Dropdown
    refresh: gr.Button
    system: gr.Textbox
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Number
    prompt: gr.Textbox
    image: gr.Image
    send: gr.Button
    regenerate: gr.Button
    clear: gr.Button
    status: gr.Markdown
    base: gr.Chatbot
    tuned: gr.Chatbot
    timer: gr.Timer

    @property
    def settings(self) -> list[Any]:
        return [self.system, self.temperature, self.top_p, self.max_new_tokens]

    @property
    def shown(self) -> list[Any]:
        """What every handler returns: the status, both columns and the timer (on while a reply is open)."""
        return [self.status, self.base, self.tuned, self.timer]


def refuse_bombs(image: gr.Image) -> gr.Image:
    """The tab's image upload with a decompression bomb (a small file whose header claims billions of pixels) a
    clear refusal, not a server error: Gradio opens the upload with PIL before the handler sees it. (An instance
    wrapper, not a subclass: Gradio writes a .pyi beside the module of every component subclass.)"""
    plain = image.preprocess

    def preprocess(payload: Any) -> Any:
        from PIL import Image

        from jobs.chat.images import bomb_size, too_many_pixels

        try:
            return plain(payload)
        except Image.DecompressionBombError as exc:
            problem = too_many_pixels("the image", bomb_size(exc))
            raise gr.Error(f"{problem.problem}. Fix: {problem.fix}") from None

    image.preprocess = preprocess  # type: ignore[method-assign]
    return image


def build() -> ChatView:
    gr.Markdown(
        "Hold a conversation with a finished run and its base model: the same messages, the same sampling, "
        "the run's chat template; each side continues its own answers. A worker where the run's weights are "
        "answers. Temperature 0 is greedy decoding (reproducible answers)."
    )
    with gr.Row():
        run = gr.Dropdown([], label="Finished run", elem_id="chat-run-choice", scale=3)
        refresh = gr.Button("Refresh runs", scale=0)
    system = gr.Textbox(label="System prompt (optional)", lines=1, elem_id="chat-system")
    with gr.Row():
        temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
        top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top_p")
        max_new_tokens = gr.Number(128, precision=0, minimum=1, maximum=MAX_NEW_TOKENS, label="Max new tokens")
    with gr.Row():
        options = {"render_markdown": False, "feedback_options": None, "height": 360, "buttons": ["copy"]}
        base = gr.Chatbot(label="Base model", elem_id="chat-base", **options)  # type: ignore[arg-type]
        tuned = gr.Chatbot(label="This run", elem_id="chat-tuned", **options)  # type: ignore[arg-type]
    status = gr.Markdown(elem_id="chat-status")
    with gr.Row():
        prompt = gr.Textbox(label="Message", lines=2, elem_id="chat-prompt", scale=3)
        image = refuse_bombs(
            gr.Image(
                type="filepath",
                label="Image (optional, vision-language runs)",
                sources=["upload", "clipboard"],
                elem_id="chat-image",
                height=120,
                scale=1,
            )
        )
    with gr.Row():
        send = gr.Button("Send to both", variant="primary", elem_id="chat-send")
        regenerate = gr.Button("Regenerate last answers", elem_id="chat-regenerate")
        clear = gr.Button("Clear conversation", elem_id="chat-clear")
    timer = gr.Timer(TICK_S, active=False)
    return ChatView(
        run,
        refresh,
        system,
        temperature,
        top_p,
        max_new_tokens,
        prompt,
        image,
        send,
        regenerate,
        clear,
        status,
        base,
        tuned,
        timer,
    )


def run_choices(store: RunLister) -> list[tuple[str, int]]:
    """Succeeded runs, newest first, as (label, id)."""
    return [
        (f"{r.id} · {r.name} ({spec_of(r).method.value}, {spec_of(r).trainer.value})", r.id)
        for r in store.list_runs(status=RunStatus.SUCCEEDED)
    ]


def policy_problem(store: RunReader, run_id: int, policy: AccessPolicy | None) -> Problem | None:
    """Loading a run whose model ships its own code needs the server's permission, as training does."""
    run = store.get_run(run_id)
    return None if run is None else loading_problem(spec_of(run), run_id, policy, "chat with it")


def reach_problem(store: ChatReach, run_id: int) -> str | None:
    """Why no live worker can answer run `run_id` (none on its host, none sharing the data folder), or None."""
    run = store.get_run(run_id)
    if run is None:
        return f"Run {run_id} does not exist (deleted?): press Refresh runs."
    host = run_host(run)
    services = store.chat_services()
    if any(s.get("shared_data") or (host is not None and s.get("host") == host) for s in services):
        return None
    where = f"host **{host}**" if host else "no recorded host"
    on = host or "the host that has its data folder"
    return (
        f"No live worker can reach run {run_id}'s weights (they are on {where}). Fix: start `tunedeck worker` "
        f"on {on}, or set {SHARED_DATA_ENV}=1 on workers that share this data folder."
    )


def image_refused(store: RunReader, run_id: int, image: str | IO[bytes]) -> Problem | None:
    """Why `image` cannot go with a turn to run `run_id`: not a readable image, or a run known to be text-only
    (its base model's config, when it is on this machine; else the worker decides and refuses the same way)."""
    from jobs.models.vision import vision_model

    problem = image_problem(image)
    run = store.get_run(run_id)
    if problem is not None or run is None:
        return problem
    spec = spec_of(run)
    if vision_model(spec.model) is False:
        result = RunResult(run_id, spec.display_name, spec.model, "", spec.method.value, False)
        return result.image_refusal().problems[0]
    return None


def length_problem(store: ChatLength, run_id: int, system: str, prompt: str) -> Problem | None:
    """Why the tab's conversation with `prompt` added is too long for the run's model (counted with the run's
    tokenizer, as /v1 counts: `jobs.chat.limits`), or None (also when its folder is not here: the worker counts)."""
    from jobs.chat.limits import prompt_problem

    try:
        result = locate(store, run_id)
    except ChatError:
        return None
    session = store.latest_chat(run_id)
    history = store.chat_history(session.id) if session is not None else []
    users = [m.content for m in history if m.role == "user"]
    sides = [[m.content for m in history if m.role == "assistant" and m.side == side] for side in ("base", "run")]
    return prompt_problem(result, [system, *users, *max(sides, key=lambda texts: sum(map(len, texts))), prompt])


def sampling_of(temperature: float | None, top_p: float | None, max_new_tokens: float | None) -> Sampling:
    return Sampling(float(temperature or 0.0), float(top_p or 1.0), int(max_new_tokens or 128)).checked()


def _problems_text(problems: list[Problem]) -> str:
    return "\n".join(f"**{p.field}**: {p.problem}. Fix: {p.fix}" for p in problems)


def columns(history: list[ChatMessageRecord]) -> tuple[list[dict[str, str]], list[dict[str, str]], str]:
    """(base column, run column, status line) of a session's messages."""
    cols: dict[str, list[dict[str, str]]] = {"base": [], "run": []}
    notes: list[str] = []
    for message in history:
        if message.role == "user":
            shown = (IMAGE_MARK if message.image else "") + message.content
            for col in cols.values():
                col.append({"role": "user", "content": shown})
            continue
        text = message.content
        label = "the base model" if message.side == "base" else "the run"
        if message.status is ReplyStatus.FAILED:
            text = (text + "\n\n" if text else "") + f"(failed: {message.error})"
            notes.append(f"The answer of {label} failed: {message.error}")
        elif message.status is ReplyStatus.PENDING:
            text = text or "…"
            notes.append(f"Waiting for a worker to answer with {label}…")
        elif message.status is ReplyStatus.DONE and not text.strip():
            text = BLANK
        elif message.status is ReplyStatus.STREAMING:
            if message.note and not text:
                notes.append(f"{message.note[0].upper()}{message.note[1:]}…")
            else:
                notes.append(f"Answering with {label}…")
            text = text or "…"
        cols[message.side or "run"].append({"role": "assistant", "content": text})
    return cols["base"], cols["run"], (notes[0] if notes else ("Done." if history else ""))


def _open(history: list[ChatMessageRecord]) -> bool:
    return any(m.status in OPEN for m in history)


def show(store: ChatReading, run_id: Any, status: str | None = None) -> tuple[Any, ...]:
    """The run's latest session as (status, base column, run column, timer): the timer on while a reply is open."""
    if run_id in (None, ""):
        return status or "", [], [], gr.Timer(active=False)
    session = store.latest_chat(int(run_id))
    history = store.chat_history(session.id) if session is not None else []
    base, tuned, line = columns(history)
    pending = _open(history)
    if pending and not any(m.status is ReplyStatus.STREAMING for m in history):
        problem = reach_problem(store, int(run_id))
        if problem is not None:  # nobody will take it: say so and stop reading (Refresh runs looks again)
            return problem, base, tuned, gr.Timer(active=False)
    return status or line, base, tuned, gr.Timer(active=pending)


def tick(store: ChatTurnActions, run_id: Any) -> tuple[Any, ...]:
    """A timer tick while a reply is open: fail replies of workers gone away, then show the session."""
    store.fail_stale_chat_replies()
    return show(store, run_id)


def send(
    store: ChatWriting,
    policy: AccessPolicy | None,
    run_id: Any,
    system: str,
    temperature: float,
    top_p: float,
    max_new_tokens: float | None,
    prompt: str,
    image: str | None = None,
) -> tuple[Any, ...]:
    """Write the user's message (and its image) as the next turn, a pending reply per side;
    (status, columns, timer, prompt, image): the prompt and image emptied once written."""
    if run_id in (None, ""):
        none = not store.list_runs(status=RunStatus.SUCCEEDED, limit=1)
        return (*show(store, None, NO_RUNS if none else "Pick a finished run first."), gr.skip(), gr.skip())
    run_id = int(run_id)
    if not (prompt or "").strip():
        return (*show(store, run_id, "Write a message first."), gr.skip(), gr.skip())
    try:
        sampling = sampling_of(temperature, top_p, max_new_tokens)
    except ChatError as exc:
        return (*show(store, run_id, _problems_text(exc.problems)), gr.skip(), gr.skip())
    refused = policy_problem(store, run_id, policy) or (image_refused(store, run_id, image) if image else None)
    refused = refused or length_problem(store, run_id, system or "", prompt.strip())
    if refused is not None:
        return (*show(store, run_id, _problems_text([refused])), gr.skip(), gr.skip())
    unreachable = reach_problem(store, run_id)
    if unreachable is not None:
        return (*show(store, run_id, unreachable), gr.skip(), gr.skip())
    session = store.latest_chat(run_id)
    settings = session_sampling(sampling, session.sampling if session is not None else {})
    sid = session.id if session is not None else store.create_chat(run_id, system or "", settings)
    store.update_chat(sid, system or "", settings)
    kept = keep_image(store.run_dir(run_id), image) if image else None
    store.add_chat_turn(sid, prompt.strip(), kept)
    return (*show(store, run_id), "", None)


def session_sampling(sampling: Sampling, stored: dict[str, Any]) -> dict[str, Any]:
    """The tab's sampling as the session keeps it, with the session's seed (Regenerate's last draw) kept."""
    settings = {"temperature": sampling.temperature, "top_p": sampling.top_p, "max_new_tokens": sampling.max_new_tokens}
    return {**settings, "seed": int(stored["seed"])} if "seed" in stored else settings


def regenerate(store: ChatTab, run_id: Any) -> tuple[Any, ...]:
    """The last turn's two replies asked again, with the session's next seed: a sampled answer is drawn anew
    (the same seed would draw the same answer again); a greedy one (temperature 0) comes back the same."""
    session = None if run_id in (None, "") else store.latest_chat(int(run_id))
    if session is not None:  # before the replies are pending again, so no worker answers with the old seed
        store.update_chat(
            session.id, session.system, {**session.sampling, "seed": int(session.sampling.get("seed", 0)) + 1}
        )
    if session is None or store.regenerate_chat_turn(session.id) is None:
        return show(store, run_id, "Nothing to regenerate yet: send a message first.")
    unreachable = reach_problem(store, int(run_id))
    return show(store, run_id, unreachable)


def clear(store: ChatTurnActions, run_id: Any) -> tuple[Any, ...]:
    session = None if run_id in (None, "") else store.latest_chat(int(run_id))
    if session is not None:
        store.clear_chat(session.id)
    return show(store, run_id, "Cleared." if session is not None else "Nothing to clear yet.")


def load_settings(store: ChatHistory, run_id: Any) -> tuple[Any, ...]:
    """The run's session's system prompt and sampling, or the defaults (a run without a session)."""
    session = None if run_id in (None, "") else store.latest_chat(int(run_id))
    if session is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    s = session.sampling
    return session.system, s.get("temperature", 0.0), s.get("top_p", 1.0), s.get("max_new_tokens", 128)


def wire(view: ChatView, store: ChatTab, tab: gr.Tab | None = None, policy: AccessPolicy | None = None) -> None:
    """Wire the tab's events. They share one queue (`EVENTS`, one at a time, first come first served): a pick of
    a run still being drawn would otherwise land after a Clear or a Send made just after it, and put back
    the picked run's older columns and a stopped timer (seen: a cleared tab whose status went blank)."""
    quiet: dict[str, Any] = {
        "show_progress": "hidden",
        "api_visibility": "private",
        "concurrency_id": EVENTS,
        "concurrency_limit": 1,
    }

    def choices(current: Any) -> tuple[Any, ...]:
        found = run_choices(store)
        if not found:
            return gr.Dropdown(choices=[], value=None), *show(store, None, NO_RUNS), *load_settings(store, None)
        keep = current if current in {value for _, value in found} else found[0][1]
        return gr.Dropdown(choices=found, value=keep), *show(store, keep), *load_settings(store, keep)

    opens = [view.refresh.click] + ([tab.select] if tab is not None else [])
    for event in opens:
        event(choices, view.run, [view.run, *view.shown, *view.settings], **quiet)
    view.run.input(
        lambda r: (*show(store, r), *load_settings(store, r)), view.run, [*view.shown, *view.settings], **quiet
    )
    for trigger in (view.send.click, view.prompt.submit):
        trigger(
            lambda *args: send(store, policy, *args),
            [view.run, *view.settings, view.prompt, view.image],
            [*view.shown, view.prompt, view.image],
            **quiet,
        )
    view.regenerate.click(lambda r: regenerate(store, r), view.run, view.shown, **quiet)
    view.clear.click(lambda r: clear(store, r), view.run, view.shown, **quiet)
    view.timer.tick(lambda r: tick(store, r), view.run, view.shown, **quiet)
