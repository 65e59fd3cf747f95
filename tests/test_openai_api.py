"""The dashboard's OpenAI-compatible API, spoken to by the official `openai` client.

The real `tunedeck serve` (dashboard + worker) runs on the session's tag-format runs (`tag_home`): the
LoRA run learned to start each answer with "[tag]", its base did not. The worker's chat service answers
through the store, as it answers the Chat tab.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from browser_helpers import free_port, start_server, stop_server, wait_for_route
from chat_helpers import PROMPT, TAUGHT
from engines import import_or_missing
from starlette.requests import Request
from training_helpers import tiny_spec

from app.auth import gradio_auth, hash_password
from app.openai_api import ApiError, authorized, chat_turns, cut_at_stop, parse, resolve_model
from app.ui.live_route import logged_in

openai = import_or_missing("openai")  # a test extra: missing, this file fails on CI


# ---------------------------------------------------------------------- fast: the pure parts
def test_messages_become_alternating_turns_and_a_system_prompt() -> None:
    system, turns = chat_turns(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": [{"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Moon?"},
        ]
    )
    assert system == "Be brief."
    assert turns == [
        {"role": "user", "content": "Hi\n\nthere"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Moon?"},
    ]
    with pytest.raises(ApiError, match="the last message must be the user's"):
        chat_turns([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    assert cut_at_stop("one. two. three", [". t", "three"]) == ("one", True)
    assert cut_at_stop("one", ["x"]) == ("one", False)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("stop", 5, "`stop` must be a string or a list of up to 4 non-empty strings, not 5"),
        ("stop", ["a", 3], "`stop` must be a string or a list"),
        ("max_tokens", 1.5, "`max_tokens` must be a whole number from 1 to 4096, not 1.5"),
        ("max_tokens", 10**9, "`max_tokens` must be from 1 to 4096"),
        ("max_completion_tokens", "many", "`max_completion_tokens` must be a whole number"),
        ("temperature", float("nan"), "`temperature` must be a number from 0 to 2, not nan"),
        ("temperature", "hot", "`temperature` must be a number from 0 to 2"),
        ("top_p", float("inf"), "`top_p` must be a number from 0 to 1"),
        ("seed", True, "`seed` must be a whole number"),
        ("n", 2, "`n` must be 1"),
        ("stream", "yes", "`stream` must be true or false"),
        ("messages", ["Hi"], "`messages[0]` must be an object with a `role` and a `content`"),
        ("messages", [{"role": "user", "content": 5}], "`messages[0].content` must be a string or a list"),
        ("messages", [{"role": "user", "content": [{"type": "text", "text": 5}]}], "`messages[0].content[0]`"),
        ("messages", [{"role": ["user"], "content": "Hi"}], "`messages[0].role` ['user'] is not one of"),
    ],
)
def test_each_field_is_typed_and_a_wrong_one_is_a_400_naming_it(field: str, value: Any, words: str) -> None:
    """Before: `"stop": 5` and a content part without text were 500s (a TypeError in the handler)."""
    body = {"model": "1", "messages": [{"role": "user", "content": "Hi"}], field: value}
    with pytest.raises(ApiError) as caught:
        parse(None, body, True)  # type: ignore[arg-type]  # refused before the model is looked up
    assert caught.value.status == 400 and words in caught.value.message
    assert caught.value.param == ("messages" if field == "messages" else field)


def _request(token: str | None) -> Request:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return Request({"type": "http", "method": "GET", "path": "/v1/models", "headers": headers})


def test_a_login_asks_for_a_users_password_or_a_session_token() -> None:
    app = SimpleNamespace(
        auth=gradio_auth({"ada": hash_password("secret")}),
        auth_dependency=None,
        cookie_id="c",
        tokens={"session-token": "ada"},
    )
    checked: dict[str, bool] = {}
    assert asyncio.run(authorized(app, _request("ada:secret"), checked, logged_in))
    assert asyncio.run(authorized(app, _request("session-token"), checked, logged_in))
    assert not asyncio.run(authorized(app, _request("ada:wrong"), checked, logged_in))
    assert not asyncio.run(authorized(app, _request(None), checked, logged_in))
    open_app = SimpleNamespace(auth=None, auth_dependency=None)
    assert asyncio.run(authorized(open_app, _request(None), {}, logged_in))


def test_a_base_model_answers_through_a_run_a_live_worker_can_reach(store: Any, tiny_model: Any) -> None:
    """Any finished run of a base can answer for it: the earliest a live worker can reach, not one whose weights
    sit on a host with no worker, and the same one each time."""
    runs = {}
    for name, host in (("far-host", "far-host"), ("near-host", "near-host"), ("later", "near-host")):
        runs[name] = store.create_run(tiny_spec(tiny_model, run_name=name))
        assert store.claim_next_on_device(f"{host}:3", "0", host=host).id == runs[name]
        store.mark_succeeded(runs[name], {})
    store.chat_service_beat("near-host:9", "near-host", shared_data=False)
    assert resolve_model(store, str(tiny_model)) == (runs["near-host"], "base")
    assert resolve_model(store, "far-host") == (runs["far-host"], "run")  # a run named is that run, reachable or not
    store.chat_service_gone("near-host:9")
    assert resolve_model(store, str(tiny_model))[1] == "base"  # none reachable: still resolved, /v1 then says why
    with pytest.raises(ApiError):
        resolve_model(store, "no-such-model")


# ---------------------------------------------------------------------- the real server and worker
@pytest.fixture(scope="module")
def client(tag_store: tuple[Any, Any, dict[str, int]]) -> Iterator[tuple[Any, dict[str, int]]]:
    folder, store, ids = tag_store
    port = free_port()
    proc = start_server(folder, port, folder / "openai-server.log")
    try:
        wait_for_route(port, "/v1/models", proc)
        _wait_for_its_worker(store, ids["lora"], proc)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600, max_retries=0), ids
    finally:
        stop_server(proc)


@pytest.mark.integration
def test_models_lists_the_finished_runs_and_their_base(client: tuple[Any, dict[str, int]]) -> None:
    api, ids = client
    listed = {m.id: m for m in api.models.list().data}
    assert {str(i) for i in ids.values()} <= set(listed)
    lora = listed[str(ids["lora"])]
    assert lora.owned_by == "tunedeck" and lora.model_extra["name"] == "chat-lora"
    assert lora.model_extra["root"] in listed  # its base model is a model too


@pytest.mark.integration
def test_chat_answers_whole_and_streamed_with_the_runs_weights(client: tuple[Any, dict[str, int]]) -> None:
    api, ids = client
    messages = [{"role": "user", "content": PROMPT}]
    reply = api.chat.completions.create(model=str(ids["lora"]), messages=messages, max_tokens=12, temperature=0)
    answer = reply.choices[0].message.content
    assert TAUGHT in answer and reply.choices[0].finish_reason == "stop"
    stream = api.chat.completions.create(model="chat-lora", messages=messages, max_tokens=12, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream]
    assert "".join(pieces) == answer  # greedy: the same answer, in pieces
    base = api.chat.completions.create(model=_base(api, ids), messages=messages, max_tokens=12)
    assert TAUGHT not in base.choices[0].message.content  # the base model did not learn the format
    cut = api.chat.completions.create(model="chat-lora", messages=messages, max_tokens=12, stop=["tag"])
    assert cut.choices[0].message.content == answer[: answer.index("tag")]


@pytest.mark.integration
def test_completions_continue_the_text(client: tuple[Any, dict[str, int]]) -> None:
    api, ids = client
    text = api.completions.create(model=str(ids["lora"]), prompt="The moon is", max_tokens=6).choices[0].text
    streamed = api.completions.create(model=str(ids["lora"]), prompt="The moon is", max_tokens=6, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text and text


@pytest.mark.integration
def test_an_unknown_model_is_an_openai_error(client: tuple[Any, dict[str, int]]) -> None:
    api, _ = client
    with pytest.raises(openai.NotFoundError) as err:
        api.chat.completions.create(model="no-such-run", messages=[{"role": "user", "content": "Hi"}])
    assert err.value.code == "model_not_found" and "GET /v1/models lists them" in err.value.message


@pytest.mark.integration
def test_a_prompt_past_the_models_context_is_a_400_and_never_reaches_a_worker(
    client: tuple[Any, dict[str, int]], tag_store: Any
) -> None:
    """A 10 MiB message with max_tokens 1 (4.5 M tokens for a model of 1,024) grew the chat child to 8.5 GB:
    now it is refused with the limit before any session or reply is written, and the worker answers the next."""
    api, ids = client
    store = tag_store[1]
    before = _last_session(store)
    huge = [{"role": "user", "content": "the moon " * (10 * 2**20 // 9)}]
    with pytest.raises(openai.BadRequestError) as err:
        api.chat.completions.create(model=str(ids["lora"]), messages=huge, max_tokens=1)
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
    assert "context of 1,024 tokens (the model's max_position_embeddings)" in err.value.message
    assert _last_session(store) == before  # no session, no reply: no chat child was given it
    messages = [{"role": "user", "content": PROMPT}]
    reply = api.chat.completions.create(model=str(ids["lora"]), messages=messages, max_tokens=12)
    assert TAUGHT in reply.choices[0].message.content


@pytest.mark.integration
def test_a_decompression_bomb_a_body_too_large_and_a_mistyped_stop_are_refused(
    client: tuple[Any, dict[str, int]],
) -> None:
    """Each was a 500 (or read whole): a 50000x50000 PNG of 300 bytes, 33 MiB of body, `"stop": 5`."""
    import base64

    from test_chat_limits import png_header

    api, ids = client
    url = "data:image/png;base64," + base64.b64encode(png_header(50_000, 50_000)).decode()
    bomb = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}
    ]
    with pytest.raises(openai.BadRequestError) as err:
        api.chat.completions.create(model=str(ids["lora"]), messages=bomb)
    assert err.value.code == "image_refused" and "over the limit of 40,000,000 pixels" in err.value.message
    with pytest.raises(openai.APIStatusError) as too_large:
        api.chat.completions.create(model=str(ids["lora"]), messages=[{"role": "user", "content": "x" * (33 * 2**20)}])
    assert too_large.value.status_code == 413 and too_large.value.code == "request_too_large"
    with pytest.raises(openai.BadRequestError) as stop:
        api.chat.completions.create(model=str(ids["lora"]), messages=[{"role": "user", "content": "Hi"}], stop=5)
    assert stop.value.param == "stop" and "`stop` must be a string or a list" in stop.value.message


@pytest.mark.integration
def test_a_stream_the_client_cuts_leaves_no_session(client: tuple[Any, dict[str, int]], tag_store: Any) -> None:
    """A stream cut after its first chunk left its one-off session in the store (9 of 12), and the Chat tab then
    showed it as the run's conversation: the session is deleted however the request ends."""
    from storage.models import ChatKind

    api, ids = client
    store = tag_store[1]
    before = _last_session(store)
    base = _base(api, ids)  # the untrained base rambles on: its answer is still being written when the cut comes
    messages = [{"role": "user", "content": PROMPT}]
    stream = api.chat.completions.create(model=base, messages=messages, max_tokens=1000, stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    stream.close()
    deadline = time.monotonic() + 120
    while [s for s in store.chat_sessions(kind=ChatKind.API) if s.id > before]:
        assert time.monotonic() < deadline, "the cut stream's session is still in the store"
        time.sleep(0.2)
    assert all(s.kind is ChatKind.TAB for s in store.chat_sessions() if s.id > before)
    reply = api.chat.completions.create(model=str(ids["lora"]), messages=messages, max_tokens=12)
    assert TAUGHT in reply.choices[0].message.content  # the worker goes on answering


def _last_session(store: Any) -> int:
    return max((s.id for s in store.chat_sessions()), default=0)


def _wait_for_its_worker(store: Any, run_id: int, proc: Any, timeout: float = 600.0) -> None:
    """Until the served worker's chat service is live, /v1 answers 503 "no live worker" (right, and seen under
    load): wait for the state the API itself checks."""
    import time

    from app.ui.chat import reach_problem

    deadline = time.monotonic() + timeout
    while reach_problem(store, run_id) is not None:
        assert proc.poll() is None, f"the server exited ({proc.poll()})"
        assert time.monotonic() < deadline, reach_problem(store, run_id)
        time.sleep(0.5)


def _base(api: Any, ids: dict[str, int]) -> str:
    return next(m for m in api.models.list().data if m.id == str(ids["lora"])).model_extra["root"]
