"""Who may talk to the dashboard: one ASGI middleware in front of every route (pages, API, uploads,
downloads, the live stream).

Three checks, each a few dictionary look-ups per request (the live stream and the page's timers
pass through it many times a minute):
- **Host.** The `Host` header must name this server: a loopback name (`localhost`, `127.0.0.1`,
  `::1`, with or without a port), a name an administrator allowed (`serve --allowed-host NAME`,
  `TUNEDECK_ALLOWED_HOSTS=a,b`), the address or name it is bound to, or, bound to every address
  (`0.0.0.0`/`::`), any IP address. A DNS-rebinding page reaches the server under its own name, so
  its requests carry that name and are refused (421).
- **Origin.** A request whose `Origin` is another site is refused (403), whatever its method: a
  state change (POST, PUT, PATCH, DELETE) and a read alike (Gradio's own CORS lets pages of any
  local origin read its answers). Its Origin must be the page's own (`scheme://` + the request's
  Host) or name an allowed host. Browsers send no Origin on a same-origin GET, and scripts (curl,
  `gradio_client`) none at all: those pass. (A CORS preflight, OPTIONS, is answered by Gradio's CORS
  layer, which sits outside this one; it carries nothing, and the request it announces is refused.)
- **Token** (only when the server made one: `app.server.access_token`). The request must carry it:
  the `tunedeck-token` cookie (set when `/?token=...` is opened), `Authorization: Bearer TOKEN`, or
  `?token=TOKEN`. Only the token's SHA-256 is kept. A wrong token counts as a failed login of the
  client (app.login_limit, the limiter the login form and `/v1` passwords share): the sixth distinct
  wrong one within a minute is answered 429. The redirect that moves a `?token=` into the cookie
  stays on this server (`//host/...` and backslashes in the path cannot send it elsewhere).

`/tunedeck/health` answers `{"status": "ok"}` in every mode (loopback, token, login), without
credentials, for container health checks; it says nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from app.login_limit import LIMITER, CredentialLimiter, client_of
from app.login_limit import refusal as limit_refusal

ALLOWED_HOSTS_ENV = "TUNEDECK_ALLOWED_HOSTS"
TOKEN_COOKIE = "tunedeck-token"
HEALTH_PATH = "/tunedeck/health"
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
# Gradio's launch() asks this path of itself, without any token, before the server is ready.
TOKEN_FREE_PATHS = frozenset({HEALTH_PATH, "/gradio_api/startup-events"})


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def configured_hosts(flags: Iterable[str] = (), env: str | None = None) -> frozenset[str]:
    """Host names from `--allowed-host` flags and TUNEDECK_ALLOWED_HOSTS (comma- or space-separated), lower case."""
    raw = os.environ.get(ALLOWED_HOSTS_ENV, "") if env is None else env
    names = [*flags, *raw.replace(",", " ").split()]
    return frozenset(n.strip().lower() for n in names if n.strip())


def _split_host(host: str) -> str:
    """The name of `host[:port]` (`[::1]:7860` -> `::1`), lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host  # a bare IPv6 address or a name without a port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class GuardSettings:
    """What the guard lets through: `hosts` (configured names; an entry with a port matches only that
    port), `bind` (the address served), and the access token's hash (None: no token needed)."""

    hosts: frozenset[str] = frozenset()
    bind: str = "127.0.0.1"
    token_sha256: bytes | None = None
    _seen: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def host_allowed(self, host: str) -> bool:
        """Whether a Host header names this server (answers are remembered: few distinct values arrive)."""
        known = self._seen.get(host)
        if known is None:
            known = self._judge_host(host)
            if len(self._seen) < 1024:
                self._seen[host] = known
        return known

    def _judge_host(self, host: str) -> bool:
        if not host:
            return False
        name = _split_host(host)
        bind = self.bind.strip("[]").lower()
        if name in LOOPBACK_HOSTS or host.strip().lower() in self.hosts or name in self.hosts or name == bind:
            return True
        if _is_ip(name):
            return bind in ("0.0.0.0", "::", "")  # bound to every address: any of them
        return False

    def origin_allowed(self, origin: str, host: str) -> bool:
        """Whether a request from a page at `origin` may reach the server named `host`."""
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed frame, a file:// page) and anything odd
        netloc = parts.netloc.lower()
        if netloc == host.strip().lower():
            return True  # the page's own origin
        return netloc in self.hosts or _split_host(netloc) in self.hosts

    def token_ok(self, presented: str | None) -> bool:
        if self.token_sha256 is None:
            return True
        return bool(presented) and hmac.compare_digest(token_hash(presented or ""), self.token_sha256)


def _headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    return {k: v for k, v in scope.get("headers", ()) if k in (b"host", b"origin", b"authorization", b"cookie")}


def _cookie_token(raw: bytes | None) -> str | None:
    """The tunedeck-token cookie's value (a split, not http.cookies: ten times cheaper per request)."""
    if not raw:
        return None
    for pair in raw.decode("latin-1").split(";"):
        name, sep, value = pair.strip().partition("=")
        if sep and name == TOKEN_COOKIE:
            return value.strip().strip('"')
    return None


def _query_token(scope: dict[str, Any]) -> str | None:
    query = scope.get("query_string", b"")
    if b"token=" not in query:
        return None
    return dict(parse_qsl(query.decode("latin-1"))).get("token")


async def _answer(send: Any, status: int, body: dict[str, str], extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def same_site_path(path: str) -> str:
    """`path` as a Location on this server: one leading slash (`//evil.example/x` and `/\\evil/x` name
    another host to a browser), and whatever a browser might drop or read as a slash (backslashes,
    tabs, newlines) percent-encoded."""
    return "/" + quote(path.lstrip("/\\"), safe="/!$&'()*+,;=:@-._~")


class Guard:
    """The ASGI middleware (see the module's docstring). `settings`: a GuardSettings."""

    def __init__(self, app: Any, settings: GuardSettings, limiter: CredentialLimiter | None = None):
        self.app, self.settings, self.limiter = app, settings, limiter or LIMITER

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        host = headers.get(b"host", b"").decode("latin-1")
        refusal = self._refusal(scope, headers, host)
        if refusal is None:
            await self.app(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        elif refusal == "ok":
            await _answer(send, 200, {"status": "ok"})
        elif refusal.startswith("429 "):
            body, answer_headers = limit_refusal(scope.get("path", ""), float(refusal[4:]))
            await send({"type": "http.response.start", "status": 429, "headers": answer_headers})
            await send({"type": "http.response.body", "body": body})
        elif refusal == "cookie":
            await self._set_cookie(scope, send, host)
        else:
            status, message = refusal.split(" ", 1)
            await _answer(send, int(status), {"error": message})

    def _refusal(self, scope: Any, headers: dict[bytes, bytes], host: str) -> str | None:
        """None to pass the request on, else what to answer ("STATUS message", "429 WAIT_S", "ok" or "cookie")."""
        s = self.settings
        if not s.host_allowed(host):
            return (
                f"421 this dashboard does not answer to the host name {host!r}: open it as 127.0.0.1 or "
                f"localhost, or have the administrator allow the name (tunedeck serve --allowed-host NAME)"
            )
        origin = headers.get(b"origin")
        if origin is not None and not s.origin_allowed(origin.decode("latin-1"), host):
            return f"403 a page from another site ({origin.decode('latin-1')}) may not read or change this dashboard"
        path = scope.get("path", "")
        if path == HEALTH_PATH:
            return "ok"
        if s.token_sha256 is None or path in TOKEN_FREE_PATHS:
            return None
        return self._token_refusal(scope, headers)

    def _token_refusal(self, scope: Any, headers: dict[bytes, bytes]) -> str | None:
        """The token check, counted by the limiter: None, "cookie", "429 WAIT_S" or "401 message"."""
        s = self.settings
        cookie = _cookie_token(headers.get(b"cookie"))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        query_token = _query_token(scope)
        presented = [t for t in (cookie, bearer, query_token) if t]
        client = client_of(scope)
        if presented:
            wait = self.limiter.wait_s(client)
            if wait > 0:
                return f"429 {wait}"
        if (cookie and s.token_ok(cookie)) or (bearer and s.token_ok(bearer)):
            self.limiter.record(client, ok=True)
            return None
        if query_token and s.token_ok(query_token):
            self.limiter.record(client, ok=True)
            return "cookie" if scope.get("method") == "GET" and scope["type"] == "http" else None
        for wrong in presented:
            self.limiter.record(client, ok=False, key=token_hash(wrong))
        return (
            "401 this dashboard needs its access token: open the URL with ?token=... that `tunedeck serve` "
            "printed, or send `Authorization: Bearer TOKEN`"
        )

    async def _set_cookie(self, scope: Any, send: Any, host: str) -> None:
        """A GET with the right ?token=: the token goes into a cookie and the browser is sent to the same
        address without it (so it stays out of the history and of links copied from the address bar)."""
        token = _query_token(scope) or ""
        rest = urlencode(
            [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1")) if k != "token"]
        )
        location = same_site_path(scope.get("root_path", "") + scope.get("path", "/")) + (f"?{rest}" if rest else "")
        cookie = f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax"
        await _answer(
            send,
            303,
            {"status": "token accepted"},
            [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode("latin-1"))],
        )
