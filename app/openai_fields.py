"""The fields of an OpenAI-style request, read and checked at the edge: each wrong one is a 400 naming it.

    body = await read_body(request)          # JSON, at most MAX_BODY_BYTES (413 past it)
    system, turns = chat_turns(body["messages"])
    sampling = sampling_of(body, chat=True)  # temperature, top_p, max_new_tokens, seed: typed and in range
    stops = stops_of(body)                   # `stop`: a string or a list of up to 4 strings
    check_prompt(store, ask)                 # the prompt's tokens against the model's context (400 over it)

Nothing here loads a model: a prompt is counted with the run's saved tokenizer (`jobs.chat.limits`), and an
image is measured from its header before a pixel is decoded (`jobs.chat.images.image_problem`).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from jobs.chat.generate import MAX_NEW_TOKENS, ChatError, locate
from jobs.chat.limits import prompt_problem
from storage.roles import ArtifactReader
from storage.roles_chat import ChatImages

MAX_BODY_BYTES = 32 * 2**20  # a request body past this is refused (413) before it is read whole
MAX_STOPS = 4
ROLES = ("system", "developer", "user", "assistant")


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, type, the parameter at fault and a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = {401: "authentication_error"}.get(self.status)
        kind = kind or ("invalid_request_error" if 400 <= self.status < 500 else "server_error")
        body = {"message": self.message, "type": kind, "param": self.param}
        return JSONResponse({"error": body | {"code": self.code}}, status_code=self.status)


@dataclass(frozen=True)
class Ask:
    """One request, parsed: what to answer with, the conversation, the sampling and the stop strings."""

    run_id: int
    side: str  # "run" (the result) or "base"
    model: str  # as the client named it, echoed back
    turns: list[dict[str, Any]]  # {"role", "content"}; a user turn's image as "image_bytes" until it is kept
    system: str
    sampling: dict[str, Any]
    stop: list[str] = field(default_factory=list)
    stream: bool = False


# ---------------------------------------------------------------------- the body
def _too_large() -> ApiError:
    return ApiError(
        413,
        f"the request body is over {MAX_BODY_BYTES // 2**20} MiB: send a shorter conversation or a smaller image",
        code="request_too_large",
    )


async def read_body(request: Request) -> Any:
    """The request's JSON, read up to MAX_BODY_BYTES (413 past it, without reading the rest); 400 if not JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    try:
        return await run_in_threadpool(json.loads, b"".join(chunks))
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not JSON (a JSON object is expected)") from None


# ---------------------------------------------------------------------- messages
def _text(content: Any, where: str) -> str:
    """A message's content: a string, or the text parts of a list of parts (image parts read by `_image`)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ApiError(400, f"`{where}.content` must be a string or a list of content parts", "messages")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind != "image_url":
            raise ApiError(
                400,
                f'`{where}.content[{i}]` must be a part {{"type": "text", "text": "..."}} or '
                '{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}',
                "messages",
            )
    return "".join(texts)


def _image(content: Any) -> bytes | None:
    """The bytes of a message's one `image_url` part (a base64 `data:` URL), or None when it has none."""
    parts = content if isinstance(content, list) else []
    urls = [p.get("image_url") for p in parts if isinstance(p, dict) and p.get("type") == "image_url"]
    urls = [u.get("url") if isinstance(u, dict) else u for u in urls]
    if not urls:
        return None
    if len(urls) > 1:
        raise ApiError(400, "a message can carry one image: send one `image_url` part per user message", "messages")
    head, _, data = (urls[0] if isinstance(urls[0], str) else "").partition(",")
    if not (head.startswith("data:image/") and head.endswith(";base64")):
        raise ApiError(
            400, "an `image_url` must be a base64 `data:image/...` URL (web URLs are not fetched)", "messages"
        )
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "an `image_url` data URL is not valid base64", "messages") from None


def chat_turns(messages: Any) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, user/assistant turns alternating and ending with the user's) from OpenAI messages."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "`messages` must be a non-empty list of {role, content} objects", "messages")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"`messages[{i}]` must be an object with a `role` and a `content`", "messages")
        role = message.get("role")
        if role not in ROLES:
            raise ApiError(400, f"`messages[{i}].role` {role!r} is not one of {', '.join(ROLES)}", "messages")
        content = message.get("content")
        text, image = _text(content, f"messages[{i}]"), _image(content)
        if image is not None and (role != "user" or (turns and turns[-1]["role"] == role)):
            raise ApiError(
                400, "an image goes in a user message that follows an assistant's (one per turn)", "messages"
            )
        if role in ("system", "developer"):
            system.append(text)
        elif turns and turns[-1]["role"] == role:  # the chat template wants them alternating: join the two
            turns[-1] = {"role": role, "content": turns[-1]["content"] + "\n\n" + text}
        elif turns or role == "user":
            turns.append({"role": role, "content": text} | ({"image_bytes": image} if image else {}))
    if not turns or turns[-1]["role"] != "user":
        raise ApiError(400, "the last message must be the user's", "messages")
    return "\n\n".join(system), turns


def prompt_of(body: dict[str, Any]) -> str:
    """`/v1/completions`' `prompt`: a string, or a list of one string."""
    prompt = body.get("prompt")
    prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
    if not isinstance(prompt, str):
        raise ApiError(400, "`prompt` must be a string (or a list of one string)", "prompt")
    return prompt


# ---------------------------------------------------------------------- sampling
def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, f"`{name}` must be a number from {low:g} to {high:g}, not {value!r}", name)
    if not low <= value <= high:
        raise ApiError(400, f"`{name}` must be from {low:g} to {high:g}, not {value!r}", name)
    return float(value)


def _integer(value: Any, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"`{name}` must be a whole number from {low} to {high}, not {value!r}", name)
    if not low <= value <= high:
        raise ApiError(400, f"`{name}` must be from {low} to {high}, not {value}", name)
    return value


def sampling_of(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """temperature, top_p, max_new_tokens (`max_completion_tokens` or `max_tokens`), seed; raw for completions."""
    limit_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get("n") not in (None, 1):
        raise ApiError(400, f"`n` must be 1 (one answer per request), not {body.get('n')!r}", "n")
    if not isinstance(body.get("stream", False), (bool, type(None))):
        raise ApiError(400, f"`stream` must be true or false, not {body.get('stream')!r}", "stream")
    return {
        "temperature": _number(body, "temperature", 0.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0) or 1.0,
        "max_new_tokens": _integer(body.get(limit_name), limit_name, 256, 1, MAX_NEW_TOKENS),
        "seed": _integer(body.get("seed"), "seed", 0, 0, 2**31 - 1),
        "raw": not chat,
    }


def stops_of(body: dict[str, Any]) -> list[str]:
    """`stop`: absent, a string, or a list of up to MAX_STOPS non-empty strings."""
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(
            400, f"`stop` must be a string or a list of up to {MAX_STOPS} non-empty strings, not {stop!r}", "stop"
        )
    return stops


# ---------------------------------------------------------------------- what the run can take
def check_prompt(store: ArtifactReader, ask: Ask) -> None:
    """400 when the prompt has more tokens than the run's model reads at once (counted with the run's tokenizer
    when its folder is here; else the worker counts before its generation process is given it)."""
    try:
        result = locate(store, ask.run_id)
    except ChatError:
        return  # not answerable here: the worker says why
    problem = prompt_problem(result, [ask.system, *(t["content"] for t in ask.turns)])
    if problem is not None:
        param = "prompt" if ask.sampling.get("raw") else "messages"
        raise ApiError(400, f"{problem.problem}. Fix: {problem.fix}", param, "context_length_exceeded")


def keep_images(store: ChatImages, ask: Ask) -> Ask:
    """The request with its images kept as files in the run's folder (their paths in the turns); an image that is
    not a readable picture, has more pixels than allowed, or goes to a run of a text-only model is refused."""
    from app.ui.chat import image_refused
    from jobs.chat.images import keep_image

    if not any("image_bytes" in t for t in ask.turns):
        return ask
    turns = []
    for turn in ask.turns:
        data = turn.pop("image_bytes", None)
        if data is not None:
            problem = image_refused(store, ask.run_id, io.BytesIO(data))
            if problem is not None:
                raise ApiError(400, f"{problem.problem}. Fix: {problem.fix}", "messages", "image_refused")
            turn = {**turn, "image": keep_image(store.run_dir(ask.run_id), io.BytesIO(data))}
        turns.append(turn)
    return Ask(ask.run_id, ask.side, ask.model, turns, ask.system, ask.sampling, ask.stop, ask.stream)
