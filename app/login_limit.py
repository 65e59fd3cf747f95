"""Login attempts, rate-limited per client: after `max_failures` failed logins within `window_s`
seconds, a client's next attempts are answered 429 (with `Retry-After`) until the oldest failure of
the window has aged out; a successful login clears its count. Guessing a password at the login
form thus costs a minute per five tries, on top of scrypt's ~50 ms a try (app.auth).

The client is the connection's address: behind a reverse proxy every user shares the proxy's, so
the limit then holds for all of them together (a proxy that limits its own logins is the fix there).
Only POST /login (Gradio's login route, with or without a trailing slash) is counted.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

LOGIN_PATHS = frozenset({"/login", "/login/"})
MAX_FAILURES = 5
WINDOW_S = 60.0
MAX_CLIENTS = 10_000  # remembered at once; the oldest entries are dropped beyond this


class LoginLimiter:
    """ASGI middleware counting failed `POST /login` answers (status >= 400) per client address."""

    def __init__(
        self,
        app: Any,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.app, self.max_failures, self.window_s, self.clock = app, max_failures, window_s, clock
        self.failures: dict[str, deque[float]] = {}

    def wait_s(self, client: str) -> float:
        """Seconds until `client` may try again (0: now)."""
        times = self.failures.get(client)
        if not times:
            return 0.0
        now = self.clock()
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if len(times) < self.max_failures:
            return 0.0
        return max(0.0, self.window_s - (now - times[0]))

    def record(self, client: str, ok: bool) -> None:
        if ok:
            self.failures.pop(client, None)
            return
        if client not in self.failures and len(self.failures) >= MAX_CLIENTS:
            self.failures.pop(next(iter(self.failures)))
        self.failures.setdefault(client, deque(maxlen=self.max_failures)).append(self.clock())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in LOGIN_PATHS:
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("?", 0))[0]
        wait = self.wait_s(client)
        if wait > 0:
            body = json.dumps(
                {"detail": f"too many failed logins from this address: try again in {int(wait) + 1} s"}
            ).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(int(wait) + 1).encode()),
            ]
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        status: list[int] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, watch)
        if status:
            self.record(client, ok=status[0] < 400)
