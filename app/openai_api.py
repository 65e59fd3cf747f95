"""An OpenAI-compatible API on the dashboard: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:7860/v1", api_key="user:password")   # any key without a login
    client.chat.completions.create(model="3", messages=[{"role": "user", "content": "Hi"}], stream=True)

`model` is a finished run's id or name (its result answers), or a base model reference that a finished run
trained from (the base answers). The dashboard loads no weights: a request becomes a one-off chat session
in the store with one pending reply (`Store.ask_chat_reply`), answered by a worker's chat service that
reaches the run's weights, exactly as the Chat tab's turns are (`jobs.worker.chat_service`); the reply's
text is read back as the worker streams it into the store and sent on as server-sent events. Chat
requests go through the run's chat template; `/v1/completions` continues the prompt text as it is.
For a vision-language run a user message may carry one `image_url` part with a `data:` URL (base64): the
image is kept in the run's folder for the request, as the Chat tab keeps its images; web URLs are never
fetched, and an image for a text-only run is refused with the fix.
`max_tokens`, `temperature`, `top_p`, `seed` and `stop` (cut here, the text before the first stop string is
the answer) are honoured. Every field is typed and bounded, the body capped, the prompt counted against the
model's context before any worker is given it (`app.openai_fields`). The request's session is of kind "api"
(never the Chat tab's) and deleted however the request ends, a client gone mid-stream included. When the dashboard has a login, each request needs `Authorization: Bearer
TOKEN`, TOKEN being a dashboard user's `user:password` or the access token of a logged-in session.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from app.login_limit import TooManyFailures, password_ok
from app.openai_fields import (
    ApiError,
    Ask,
    chat_turns,
    check_prompt,
    keep_images,
    prompt_of,
    read_body,
    sampling_of,
    stops_of,
)
from app.ui.chat import reach_problem
from jobs.models.served_names import ServedRuns, served_model, served_models
from storage.models import ReplyStatus
from storage.roles_chat import ChatRequests, ModelNames, OpenAIChat

POLL_S = 0.05  # how often a request reads its reply's text from the store
PENDING_TIMEOUT_S = 600.0  # a reply no worker has claimed by then is given up (the worker may be training)
STALE_API_S = 86400.0  # a /v1 session older than this was left by a dashboard that stopped mid-request

__all__ = [
    "ApiError",
    "Ask",
    "access_rule",
    "add_openai_routes",
    "authorized",
    "chat_turns",
    "cut_at_stop",
    "keep_images",
    "parse",
]


def resolve_model(store: ModelNames, name: str) -> tuple[int, str]:
    """(run id, side) for `model`: a finished run's id, else a base model, else a run's name (`jobs.models.served_names`)."""
    found = served_model(store, name, lambda run_id: reach_problem(store, run_id) is None)
    if found is not None:
        return found
    raise ApiError(
        404,
        f"The model `{name}` does not exist: name a finished run's id or name, or a base model one was trained "
        "from (GET /v1/models lists them)",
        "model",
        "model_not_found",
    )


def parse(store: ModelNames, body: Any, chat: bool) -> Ask:
    """A request body as an `Ask`; ApiError naming the parameter at fault."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ApiError(400, "`model` is required: a finished run's id or name, or a base model", "model")
    if chat:
        system, turns = chat_turns(body.get("messages"))
    else:
        system, turns = "", [{"role": "user", "content": prompt_of(body)}]
    sampling, stops = sampling_of(body, chat), stops_of(body)
    run_id, side = resolve_model(store, model)
    return Ask(run_id, side, model, turns, system, sampling, stops, bool(body.get("stream")))


# ---------------------------------------------------------------------- answers
def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """(the text before the first stop string, whether one was found)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


async def replies(store: ChatRequests, ask: Ask) -> AsyncGenerator[str, None]:
    """The reply's text as it grows (each yield the whole text so far), until it is done; ApiError when it fails.

    The request's session is deleted however this ends: answered, failed, closed at a stop string, or cancelled
    by a client that went away mid-stream (the writes are shielded from that cancellation: an await in a
    cancelled task is cancelled again at once, and the session would stay)."""
    with anyio.CancelScope(shield=True):  # written whole and its id kept, or not written
        session_id, reply_id = await run_in_threadpool(
            store.ask_chat_reply, ask.run_id, ask.side, ask.turns, ask.system, ask.sampling
        )
    asked = time.monotonic()
    try:
        shown = None
        while True:
            reply = await run_in_threadpool(store.chat_message, reply_id)
            if reply is None:
                raise ApiError(500, "the request's reply was deleted (its run was deleted?)")
            if reply.content != shown:
                shown = reply.content
                yield reply.content
            if reply.status is ReplyStatus.DONE:
                return
            if reply.status is ReplyStatus.FAILED:
                raise ApiError(500, f"the worker could not answer: {reply.error}", code="generation_failed")
            if reply.status is ReplyStatus.PENDING and time.monotonic() - asked > PENDING_TIMEOUT_S:
                raise ApiError(503, f"no worker took the request in {PENDING_TIMEOUT_S:.0f} s", code="no_worker")
            await asyncio.sleep(POLL_S)
    finally:
        with anyio.CancelScope(shield=True):
            await run_in_threadpool(store.delete_chat, session_id)  # a one-off: gone once answered


def _envelope(ask: Ask, chat: bool, ident: str, created: int) -> dict[str, Any]:
    kind = "chat.completion" if chat else "text_completion"
    return {"id": ident, "object": kind, "created": created, "model": ask.model}


async def whole(store: ChatRequests, ask: Ask, chat: bool) -> dict[str, Any]:
    text = ""
    async with aclosing(replies(store, ask)) as texts:  # closed at once on a stop string: the session is deleted
        async for text in texts:
            if cut_at_stop(text, ask.stop)[1]:
                break
    answer, _ = cut_at_stop(text, ask.stop)
    head = _envelope(ask, chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()))
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": answer}
    else:
        choice["text"] = answer
    return head | {"choices": [choice]}


async def events(store: ChatRequests, ask: Ask, chat: bool) -> AsyncGenerator[str, None]:
    """Server-sent events: one chunk per new piece of text, then the finish chunk and `[DONE]`."""
    head = _envelope(ask, chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()))
    head["object"] = "chat.completion.chunk" if chat else "text_completion"

    def chunk(piece: str | None, finish: str | None = None, first: bool = False) -> str:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["delta"] = ({"role": "assistant"} if first else {}) | ({"content": piece} if piece else {})
        else:
            choice["text"] = piece or ""
        return f"data: {json.dumps(head | {'choices': [choice]})}\n\n"

    if chat:
        yield chunk(None, first=True)
    sent, text = 0, ""
    hold = max((len(s) for s in ask.stop), default=1) - 1  # a stop string may be cut in two: keep its length back
    try:
        async with aclosing(replies(store, ask)) as texts:
            async for text in texts:
                answer, stopped = cut_at_stop(text, ask.stop)
                safe = len(answer) if stopped else max(sent, len(answer) - hold)
                if safe > sent:
                    yield chunk(answer[sent:safe])
                    sent = safe
                if stopped:
                    break
            else:
                answer, _ = cut_at_stop(text, ask.stop)  # done: what was held back goes out too
                if len(answer) > sent:
                    yield chunk(answer[sent:])
    except ApiError as exc:
        yield f"data: {json.dumps({'error': {'message': exc.message, 'type': 'server_error', 'code': exc.code}})}\n\n"
        return
    yield chunk(None, "stop")
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------------- access and routes
async def authorized(
    app: Any, request: Request, checked: dict[str, bool], page_login: Callable[[Any, Request], bool]
) -> bool:
    """No login configured, a logged-in page's cookie (`page_login`: the live route's check), or a Bearer token:
    a live login token or `user:password`."""
    if page_login(app, request):
        return True
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else ""
    if not token:
        return False
    if getattr(app, "tokens", {}).get(token) is not None:
        return True
    user, _, password = token.partition(":")
    return await password_ok(app, request, user, password, checked)  # rate-limited, cached, off the event loop


def access_rule(
    app: Any, page_login: Callable[[Any, Request], bool]
) -> Callable[[Request], Awaitable[Response | None]]:
    """`denied(request)`: None when the request may use `/v1` (`authorized`), else the 401 (or 429) to answer;
    every `/v1` route asks it first (the fine-tuning API's too, `app.openai_tuning.routes`)."""
    checked: dict[str, bool] = {}

    async def denied(request: Request) -> Response | None:
        try:
            if await authorized(app, request, checked, page_login):
                return None
        except TooManyFailures as exc:
            return exc.response()
        return ApiError(
            401, "this dashboard has a login: send `Authorization: Bearer user:password`", code="invalid_api_key"
        ).response()

    return denied


def add_openai_routes(app: Any, store: OpenAIChat, page_login: Callable[[Any, Request], bool]) -> None:
    """Serve `/v1/models`, `/v1/chat/completions` and `/v1/completions` from Gradio's FastAPI `app`; `page_login`:
    whether a request carries a logged-in page's cookie (`app.ui.live_route.logged_in`, passed in by the server)."""
    store.delete_api_chats(time.time() - STALE_API_S)
    denied = access_rule(app, page_login)

    async def models(request: Request) -> Response:
        refused = await denied(request)
        if refused is not None:
            return refused
        return JSONResponse({"object": "list", "data": await run_in_threadpool(model_list, store)})

    def completions(chat: bool) -> Any:
        async def handle(request: Request) -> Response:
            refused = await denied(request)
            if refused is not None:
                return refused
            try:
                body = await read_body(request)
                ask = await run_in_threadpool(parse, store, body, chat)
                await run_in_threadpool(check_prompt, store, ask)  # before any worker is given it
                ask = await run_in_threadpool(keep_images, store, ask)
                problem = await run_in_threadpool(reach_problem, store, ask.run_id)
                if problem is not None:
                    raise ApiError(503, problem.replace("**", ""), "model", "no_worker")
                if ask.stream:
                    return StreamingResponse(
                        events(store, ask, chat),
                        media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                    )
                return JSONResponse(await whole(store, ask, chat))
            except ApiError as exc:
                return exc.response()

        return handle

    app.add_api_route("/v1/models", models, methods=["GET"], include_in_schema=False)
    app.add_api_route("/v1/chat/completions", completions(True), methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/completions", completions(False), methods=["POST"], include_in_schema=False)
    # Gradio's own catch-all routes come first otherwise: put ours ahead of them.
    ours = [r for r in app.router.routes if getattr(r, "path", "").startswith("/v1/")]
    app.router.routes[:] = ours + [r for r in app.router.routes if r not in ours]


def model_list(store: ServedRuns) -> list[dict[str, Any]]:
    """Every finished run (by id, with its name where it answers to it), then each base model they trained from."""
    return served_models(store)
