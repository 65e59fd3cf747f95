"""The live stream's HTTP side: `GET /tunedeck/live?run=N&gpu=1&runs=1` as Server-Sent Events.

    app = demo.launch(prevent_thread_lock=True, app_kwargs=page_head_kwargs(), ...)[0]
    add_live_route(app, store)           # then demo.block_thread()

One stream per page (app/ui/static/live.js opens it for the views on screen). Each stream is an
async loop that asks its `app.ui.live.Feed` every tick, in a worker thread (the store is
synchronous), and writes only what the feed returns: a tick where nothing changed writes nothing but
a keep-alive comment every 15 s. A feed that is done ends the stream with an `end` event. The stream
is behind the dashboard's login like every Gradio route: without the login cookie it answers 401.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers, MutableHeaders

from app.ui.live import Feed, Topics
from app.ui.run import RunPageData
from storage.roles_dashboard import LivePages

log = logging.getLogger(__name__)

PATH = "/tunedeck/live"
KEEPALIVE_S = 15.0
SCRIPT = Path(__file__).with_name("static") / "live.js"
CHART_CSS = """
.td-chart { position: relative; min-height: 250px; }
.td-chart-title { font-size: var(--block-label-text-size, 13px); opacity: 0.8; margin: 2px 0 4px; }
.td-chart-empty { opacity: 0.6; padding: 90px 0; text-align: center; }
.td-chart-legend { display: flex; flex-wrap: wrap; gap: 2px 12px; font-size: 12px; margin-top: 2px; }
.td-chart-key i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
.td-chart-tip { display: none; position: absolute; pointer-events: none; white-space: pre; font-size: 12px;
  background: var(--background-fill-primary, #fff); border: 1px solid var(--border-color-primary, #ccc);
  padding: 3px 6px; border-radius: 4px; z-index: 10; }
"""


def head_html() -> str:
    """The `<head>` additions of the dashboard page: the live page's script and its charts' style."""
    return f"<style>{CHART_CSS}</style>\n<script>\n{SCRIPT.read_text()}\n</script>"


def page_head_kwargs() -> dict[str, Any]:
    """Gradio launch()'s `app_kwargs` that put `head_html()` first in the dashboard page (`PageHead`)."""
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(PageHead, head=head_html())]}


class PageHead:
    """ASGI middleware: the dashboard page's HTML gets `head` as the first thing in its `<head>`.

    Not Gradio's `head=` option: Gradio inserts that from its own script once its modules have
    loaded, too late for live.js to wrap `requestAnimationFrame` before Gradio's status trackers take
    it (see live.js). Only GET responses of type text/html that hold Gradio's page config are touched,
    and only uncompressed ones (Gradio's compression runs outside this middleware)."""

    def __init__(self, app: Any, head: str):
        self.app, self.head = app, head.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def send_with_head(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = Headers(raw=message["headers"])
                if headers.get("content-type", "").startswith("text/html") and "content-encoding" not in headers:
                    held["start"] = message  # sent once the body is in, with its new length
                    return
            elif "start" in held and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = self._with_head(b"".join(chunks))
                start = held.pop("start")
                MutableHeaders(raw=start["headers"])["content-length"] = str(len(body))
                await send(start)
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, send_with_head)

    def _with_head(self, body: bytes) -> bytes:
        at = body.find(b"<head")
        end = body.find(b">", at) + 1 if at >= 0 else 0
        if at < 0 or end <= 0 or b"gradio_config" not in body:
            return body
        return body[:end] + self.head + body[end:]


def logged_in(app: Any, request: Request) -> bool:
    """Whether the request may read the dashboard: no login configured, or Gradio's login cookie is valid."""
    if getattr(app, "auth", None) is None and getattr(app, "auth_dependency", None) is None:
        return True
    if app.auth_dependency is not None:
        return app.auth_dependency(request) is not None
    cookie_id = app.cookie_id
    token = request.cookies.get(f"access-token-{cookie_id}") or request.cookies.get(
        f"access-token-unsecure-{cookie_id}"
    )
    return app.tokens.get(token) is not None


def add_live_route(app: Any, store: LivePages) -> None:
    """Serve the stream from `app` (the FastAPI app Gradio's launch returned), for pages of `store`."""
    page_data = RunPageData(store)  # one set of series caches for every page of this server

    async def live(request: Request) -> Response:
        if not logged_in(app, request):
            return JSONResponse({"error": "log in to the dashboard first"}, status_code=401)
        try:
            topics = Topics.from_query(dict(request.query_params))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        feed = Feed(store, topics, page_data)
        return StreamingResponse(
            _stream(feed, request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    app.add_api_route(PATH, live, methods=["GET"], include_in_schema=False)


async def _stream(feed: Feed, request: Request) -> AsyncIterator[str]:
    quiet_since = time.monotonic()
    yield "retry: 2000\n\n"  # the browser's reconnect delay after a dropped connection
    while not feed.done:
        try:
            messages = await run_in_threadpool(feed.poll)
        except Exception:  # the store is down or a run's rows are unreadable: say so, let the page retry
            log.exception("live stream: a poll failed (topics %s)", feed.topics)
            yield f"event: error\ndata: {json.dumps({'error': 'the dashboard could not read the store'})}\n\n"
            return
        for message in messages:
            yield f"data: {json.dumps(message, separators=(',', ':'))}\n\n"
        if messages:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        if feed.done:
            break
        await asyncio.sleep(feed.interval)
        if await request.is_disconnected():
            return
    yield "event: end\ndata: {}\n\n"
