"""`/mcp` on the dashboard: tunedeck's MCP tools (`app.mcp_tools`) over Streamable HTTP, behind the dashboard's door.

A request passes the server's guard first (Host allowlist, no cross-site state change, the access token), then
the same check as `/v1` (`app.openai_api.authorized`: no login configured, a logged-in page's cookie, or
`Authorization: Bearer user:password` / a live login token, rate-limited with every other credential). The
SDK's session manager runs in a task of the server's event loop, started by the first request (Gradio's app
is already running when routes are added, so no lifespan would start it); its own DNS-rebinding check is off
because the guard's Host and Origin rules already hold for every route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.login_limit import TooManyFailures
from app.openai_api import authorized
from app.openai_fields import ApiError

PATH = "/mcp"


class McpEndpoint:
    """The ASGI endpoint: authorise, then hand the request to the MCP SDK's session manager."""

    def __init__(self, app: Any, server: Any, page_login: Callable[[Any, Request], bool]):
        from mcp.server.transport_security import TransportSecuritySettings

        self.app, self.page_login = app, page_login
        self.server = server
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)  # the guard's rules hold
        self.server.streamable_http_app(streamable_http_path=PATH, transport_security=security)
        self.manager = self.server.session_manager
        self.checked: dict[str, bool] = {}
        self.started: asyncio.Future[None] | None = None
        self.holder: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        if self.started is None:
            self.started = asyncio.get_running_loop().create_future()
            self.holder = asyncio.create_task(self._hold(self.started))
        await asyncio.shield(self.started)

    async def _hold(self, started: asyncio.Future[None]) -> None:
        async with self.manager.run():
            started.set_result(None)
            await asyncio.Event().wait()  # for the server's life

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            allowed = await authorized(self.app, request, self.checked, self.page_login)
        except TooManyFailures as exc:
            await exc.response()(scope, receive, send)
            return
        if not allowed:
            refusal = ApiError(401, "this dashboard has a login: send `Authorization: Bearer user:password`")
            await refusal.response()(scope, receive, send)
            return
        await self._start()
        await self.manager.handle_request(scope, receive, send)


def add_mcp_route(app: Any, server: Any, page_login: Callable[[Any, Request], bool]) -> None:
    """Serve `server` (`app.mcp_tools.build`'s, passed in by the server: this module imports no tools) at `/mcp`
    from Gradio's FastAPI `app`, ahead of Gradio's catch-all routes."""
    route = Route(PATH, endpoint=McpEndpoint(app, server, page_login), methods=["GET", "POST", "DELETE"])
    app.router.routes.insert(0, route)
