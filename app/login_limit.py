"""One rate limit for every credential check, per client: the login form (`POST /login`), a
`Bearer user:password` on `/v1` (app.openai_api through `password_ok`) and the access token
(app.guard). After `max_failures` wrong credentials within `window_s` seconds, a client's next
attempts are answered 429 (with `Retry-After`) until the oldest failure of the window has aged out;
a right credential clears its count. The same wrong credential sent again (a browser's stale token
cookie, a script retrying one key) is counted once: it tells an attacker nothing new. Guessing thus
costs a minute per five tries, on top of scrypt's ~50 ms a try (app.auth), which runs in a worker
thread, never on the event loop.

The client is the connection's address. uvicorn takes it from `X-Forwarded-For` only when the
connection comes from a proxy named in TUNEDECK_TRUSTED_PROXIES (app.server.trusted_proxies; none by
default), so a client cannot pick its own address; behind a proxy that is not named there, every user
shares the proxy's address and the limit holds for all of them together.

`LIMITER` is the process's one limiter: the middleware, the guard and the API share it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse

LOGIN_PATHS = frozenset({"/login", "/login/"})
MAX_FAILURES = 5
WINDOW_S = 60.0
MAX_CLIENTS = 10_000  # remembered at once; the oldest entries are dropped beyond this


class CredentialLimiter:
    """Failed credential checks per client address, within a sliding window."""

    def __init__(
        self, max_failures: int = MAX_FAILURES, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ):
        self.max_failures, self.window_s, self.clock = max_failures, window_s, clock
        self.failures: dict[str, deque[tuple[float, bytes | None]]] = {}

    def wait_s(self, client: str) -> float:
        """Seconds until `client` may try again (0: now)."""
        times = self.failures.get(client)
        if not times:
            return 0.0
        now = self.clock()
        while times and now - times[0][0] >= self.window_s:
            times.popleft()
        if len(times) < self.max_failures:
            return 0.0
        return max(0.0, self.window_s - (now - times[0][0]))

    def record(self, client: str, ok: bool, key: bytes | None = None) -> None:
        """One check's outcome; `key` (a digest of the wrong credential) counts a repeated guess once."""
        if ok:
            self.failures.pop(client, None)
            return
        self.wait_s(client)  # ages the window out first
        times = self.failures.get(client)
        if times is not None and key is not None and any(k == key for _, k in times):
            return
        if times is None:
            if len(self.failures) >= MAX_CLIENTS:
                self.failures.pop(next(iter(self.failures)))
            times = self.failures[client] = deque(maxlen=self.max_failures)
        times.append((self.clock(), key))


LIMITER = CredentialLimiter()


def client_of(scope: Any) -> str:
    """The client's address (uvicorn's, after its trusted-proxy rewrite)."""
    return str((scope.get("client") or ("?", 0))[0])


def retry_after(wait: float) -> int:
    return int(wait) + 1


def refusal_payload(path: str, wait: float) -> dict[str, Any]:
    """The 429's body: OpenAI's error shape on `/v1`, `{"detail": ...}` elsewhere."""
    message = f"too many failed logins from this address: try again in {retry_after(wait)} s"
    if path.startswith("/v1/"):
        return {"error": {"message": message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
    return {"detail": message}


def refusal(path: str, wait: float) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The 429's body and headers, for an ASGI answer."""
    body = json.dumps(refusal_payload(path, wait)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry_after(wait)).encode()),
    ]
    return body, headers


class TooManyFailures(Exception):
    """A client over the limit asked for another check (`wait_s`: until it may try again)."""

    def __init__(self, path: str, wait_s: float):
        super().__init__(f"too many failed logins: try again in {retry_after(wait_s)} s")
        self.path, self.wait_s = path, wait_s

    def response(self) -> JSONResponse:
        headers = {"retry-after": str(retry_after(self.wait_s))}
        return JSONResponse(refusal_payload(self.path, self.wait_s), status_code=429, headers=headers)


async def password_ok(
    app: Any,
    request: Request,
    user: str,
    password: str,
    checked: dict[str, bool] | None = None,
    limiter: CredentialLimiter | None = None,
) -> bool:
    """Whether `user:password` is a login of `app` (Gradio's `app.auth`), checked in a worker thread and
    counted by the limiter; TooManyFailures when this client is over the limit, whatever it sends (a
    right password too: a guess's success is not told). `checked`: the answers of earlier checks by
    the credential's digest (one scrypt per distinct credential, not per request)."""
    limiter = limiter or LIMITER
    auth = getattr(app, "auth", None)
    if not callable(auth):
        return False
    client = client_of(request.scope)
    wait = limiter.wait_s(client)
    if wait > 0:
        raise TooManyFailures(request.url.path, wait)
    key = hashlib.sha256(f"{user}:{password}".encode()).digest()
    ok = checked.get(key.hex()) if checked is not None else None
    if not password:
        ok = False  # a session token nobody holds: a wrong credential all the same
    if ok is None:
        if inspect.iscoroutinefunction(auth):
            ok = bool(await auth(user, password))
        else:
            ok = bool(await anyio.to_thread.run_sync(auth, user, password))
        if checked is not None:
            if len(checked) >= MAX_CLIENTS:
                checked.clear()
            checked[key.hex()] = ok
    limiter.record(client, ok, key=key)
    return ok


class LoginLimiter:
    """ASGI middleware counting failed `POST /login` answers (status >= 400) per client address."""

    def __init__(self, app: Any, limiter: CredentialLimiter | None = None):
        self.app, self.limiter = app, limiter or LIMITER

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in LOGIN_PATHS:
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        wait = self.limiter.wait_s(client)
        if wait > 0:
            body, headers = refusal(scope.get("path", ""), wait)
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
            self.limiter.record(client, ok=status[0] < 400)
