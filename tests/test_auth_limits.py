"""Lock the door, second pass (issue 48): one rate limit for every credential, password checks off the
event loop, proxy headers only from configured proxies, the token redirect stays on the dashboard, and
`/tunedeck/health` answers in every mode.

Real dashboards (`tunedeck serve --no-worker` subprocesses) in each mode: loopback, access token, login.
The limit is per client address, and the servers are shared by this module's tests, so each test that
fails logins speaks from its own loopback address (127.0.0.2, 127.0.0.3, ...: all of 127/8 reaches the
server) and never disturbs another; only the proxy-header test speaks from 127.0.0.1, the address
uvicorn trusted by default.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from browser_helpers import free_port
from dashboard_helpers import serve_dashboard, stop_dashboard
from starlette.requests import Request

from app import auth
from app.guard import same_site_path
from app.login_limit import CredentialLimiter, TooManyFailures, password_ok
from app.server import trusted_proxies
from jobs.errors import ProblemError
from storage.store import Store

TOKEN = "fixed-test-token-9d2e4b7a1c"
LOGIN = ("alice", "pw-alice-48-long")


def _client(base: str, address: str) -> httpx.Client:
    """An HTTP client whose connections come from `address` (a loopback address of its own)."""
    return httpx.Client(base_url=base, timeout=60, transport=httpx.HTTPTransport(local_address=address))


def _ready(base: str, key: str) -> None:
    """Wait for the API routes (added just after the server starts) from an address no test uses."""
    with _client(base, "127.0.0.9") as client:
        for _ in range(600):
            if client.get("/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200:
                return
            time.sleep(0.1)
    pytest.fail(f"{base}/v1/models never answered")


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("limits-loopback")
    proc, port = serve_dashboard(home, home / "server.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_dashboard(proc)


@pytest.fixture(scope="module")
def tokened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("limits-token")
    proc, port = serve_dashboard(home, home / "server.log", host="0.0.0.0", TUNEDECK_TOKEN=TOKEN)
    try:
        _ready(f"http://127.0.0.1:{port}", TOKEN)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_dashboard(proc)


@pytest.fixture(scope="module")
def login(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("limits-login")
    proc, port = serve_dashboard(home, home / "server.log", host="0.0.0.0", TUNEDECK_AUTH=":".join(LOGIN))
    try:
        _ready(f"http://127.0.0.1:{port}", ":".join(LOGIN))
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_dashboard(proc)


# ---------------------------------------------------------------------- health
def test_health_answers_ok_in_every_mode_without_credentials(loopback: str, tokened: str, login: str) -> None:
    for base in (loopback, tokened, login):
        r = httpx.get(f"{base}/tunedeck/health", timeout=60)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, (base, r.status_code, r.text)
    # ... and nothing else is open for it
    assert httpx.get(f"{tokened}/config", timeout=60).status_code == 401
    assert httpx.get(f"{login}/config", timeout=60).status_code in (401, 403)


def test_the_image_and_compose_health_checks_ask_the_health_route() -> None:
    root = Path(__file__).resolve().parents[1]
    for name in ("Dockerfile", "docker-compose.yml"):
        text = (root / name).read_text()
        assert "http://127.0.0.1:7860/tunedeck/health" in text, name


# ---------------------------------------------------------------------- one limit for every credential
def test_the_sixth_wrong_bearer_password_is_a_429_in_openai_s_shape(login: str) -> None:
    with _client(login, "127.0.0.2") as client:
        codes = [
            client.get("/v1/models", headers={"authorization": f"Bearer alice:guess-{i}"}).status_code for i in range(5)
        ]
        assert codes == [401] * 5
        sixth = client.get("/v1/models", headers={"authorization": "Bearer alice:guess-5"})
        assert sixth.status_code == 429 and int(sixth.headers["retry-after"]) > 0
        error = sixth.json()["error"]
        assert {"message", "type", "code"} <= set(error) and error["code"] == "rate_limit_exceeded"
        assert "too many failed logins" in error["message"]
        right = client.get("/v1/models", headers={"authorization": "Bearer " + ":".join(LOGIN)})
        assert right.status_code == 429  # even the right password waits: a guess's success is not told
        form = client.post("/login", data={"username": LOGIN[0], "password": LOGIN[1]})
        assert form.status_code == 429  # one limiter: the login form counts the API's failures
    with _client(login, "127.0.0.4") as other:  # another client is not held
        ok = other.get("/v1/models", headers={"authorization": "Bearer " + ":".join(LOGIN)})
        assert ok.status_code == 200 and ok.json()["object"] == "list"


def test_the_sixth_wrong_access_token_is_a_429(tokened: str) -> None:
    with _client(tokened, "127.0.0.3") as client:
        stale = [client.get("/", cookies={"tunedeck-token": "old-token"}).status_code for _ in range(6)]
        assert stale == [401] * 6  # one stale cookie, sent again and again, is one failure
        guesses = [client.get(f"/?token=guess-{i}").status_code for i in range(3)]
        guesses.append(client.get("/config", headers={"authorization": "Bearer guess-3"}).status_code)
        assert guesses == [401] * 4
        sixth = client.get("/v1/models", headers={"authorization": "Bearer guess-4"})
        assert sixth.status_code == 429 and int(sixth.headers["retry-after"]) > 0
        assert sixth.json()["error"]["code"] == "rate_limit_exceeded"  # OpenAI's shape on /v1
        assert client.get(f"/?token={TOKEN}").status_code == 429
        assert client.get("/tunedeck/health").status_code == 200


def test_the_api_check_counts_wrong_passwords_and_session_tokens_even_cached_ones() -> None:
    limiter, checked = CredentialLimiter(), dict[str, bool]()
    app = SimpleNamespace(auth=auth.password_check({LOGIN[0]: auth.hash_password(LOGIN[1])}))
    request = Request({"type": "http", "method": "GET", "path": "/v1/models", "headers": [], "client": ("10.1.1.1", 9)})

    def check(user: str, password: str) -> bool:
        return asyncio.run(password_ok(app, request, user, password, checked, limiter))

    assert check(*LOGIN) and check(LOGIN[0], "wrong") is False  # ... and the right one is cached
    assert [check(LOGIN[0], "wrong") for _ in range(3)] == [False] * 3  # one guess, counted once
    assert check("a-session-token-nobody-holds", "") is False
    assert check(LOGIN[0], "guess-2") is False and check(LOGIN[0], "guess-3") is False
    assert check(LOGIN[0], "guess-4") is False
    with pytest.raises(TooManyFailures) as exc:
        check(*LOGIN)  # cached as right, yet over the limit: not told
    answer = exc.value.response()
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) > 0
    assert json.loads(answer.body)["error"]["code"] == "rate_limit_exceeded"


# ---------------------------------------------------------------------- proxy headers
def test_forged_forwarded_for_addresses_count_as_one_client(login: str) -> None:
    with _client(login, "127.0.0.1") as client:
        codes = [
            client.post(
                "/login",
                data={"username": LOGIN[0], "password": f"guess-{i}"},
                headers={"x-forwarded-for": f"10.48.0.{i + 1}"},
            ).status_code
            for i in range(5)
        ]
        assert all(400 <= c < 429 for c in codes), codes
        sixth = client.post(
            "/login", data={"username": LOGIN[0], "password": "guess-6"}, headers={"x-forwarded-for": "10.48.0.99"}
        )
        assert sixth.status_code == 429, sixth.text


def test_behind_a_trusted_proxy_each_forwarded_client_is_counted_apart(tmp_path: Path) -> None:
    env = {"TUNEDECK_AUTH": ":".join(LOGIN), "TUNEDECK_TRUSTED_PROXIES": "127.0.0.6"}  # not uvicorn's default
    proc, port = serve_dashboard(tmp_path, tmp_path / "server.log", host="0.0.0.0", **env)
    try:
        with _client(f"http://127.0.0.1:{port}", "127.0.0.6") as proxy:

            def attempt(client: str, password: str) -> int:
                data = {"username": LOGIN[0], "password": password}
                return proxy.post("/login", data=data, headers={"x-forwarded-for": client}).status_code

            codes = [attempt("10.48.1.7", f"guess-{i}") for i in range(5)]
            assert all(400 <= c < 429 for c in codes), codes
            assert attempt("10.48.1.7", "guess-5") == 429
            assert attempt("10.48.1.8", LOGIN[1]) == 200  # another user behind the same proxy
    finally:
        stop_dashboard(proc)


def test_trusted_proxies_come_only_from_the_setting() -> None:
    assert trusted_proxies("") == ""  # uvicorn then trusts no one's X-Forwarded-For (its default: loopback)
    assert trusted_proxies("127.0.0.1, 10.0.0.0/8 ::1") == "127.0.0.1,10.0.0.0/8,::1"
    with pytest.raises(ProblemError, match="TUNEDECK_TRUSTED_PROXIES") as exc:
        trusted_proxies("127.0.0.1,*,proxy.lan")
    assert "'*', 'proxy.lan'" in str(exc.value)


# ---------------------------------------------------------------------- the token redirect
def _browser_target(base: str, location: str) -> str:
    """Where a browser goes for `location` (WHATWG, for http: tabs and newlines dropped, `\\` read as `/`,
    and two or more leading slashes start a host name)."""
    cleaned = re.sub(r"[\t\n\r]", "", location).replace("\\", "/")
    if cleaned.startswith("//"):
        cleaned = "//" + cleaned.lstrip("/")
    return urljoin(base + "/", cleaned)


@pytest.mark.parametrize("path", ["//evil.example/x", "/\\evil.example/x", "/%5Cevil.example/x", "///evil.example/"])
def test_the_token_redirect_stays_on_the_dashboard(tokened: str, path: str) -> None:
    netloc = urlsplit(tokened).netloc
    conn = http.client.HTTPConnection(netloc, timeout=60, source_address=("127.0.0.5", 0))
    try:
        conn.request("GET", f"{path}?token={TOKEN}&tab=runs")  # the raw path, as a link would carry it
        answer = conn.getresponse()
        answer.read()
    finally:
        conn.close()
    assert answer.status == 303, (path, answer.status)
    location = answer.getheader("location") or ""
    target = urlsplit(_browser_target(tokened, location))
    assert target.netloc == netloc, (path, location)
    assert "token=" not in location and "tab=runs" in location


def test_same_site_path_keeps_one_leading_slash() -> None:
    assert same_site_path("/") == "/" and same_site_path("/runs/3") == "/runs/3"
    assert same_site_path("//evil.example/x") == "/evil.example/x"
    assert same_site_path("/\\evil/x") == "/evil/x"
    assert same_site_path("/\t/evil/x") == "/%09/evil/x"  # a browser would drop the tab
    assert same_site_path("/a\\b c") == "/a%5Cb%20c"


# ---------------------------------------------------------------------- off the event loop
def test_a_password_check_does_not_hold_the_server(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each check is held inside its thread while a static page is asked for: it answers meanwhile."""
    import gradio as gr

    from app.openai_api import add_openai_routes
    from app.ui.live_route import logged_in

    users = {LOGIN[0]: auth.hash_password(LOGIN[1])}
    entered, release = threading.Event(), threading.Event()
    real = auth.verify_password

    def held(password: str, encoded: str) -> bool:
        entered.set()
        release.wait(300)
        return real(password, encoded)

    monkeypatch.setattr(auth, "verify_password", held)
    with gr.Blocks() as demo:
        gr.Markdown("tunedeck")
    port = free_port()
    app, _, _ = demo.launch(server_port=port, prevent_thread_lock=True, auth=auth.gradio_auth(users), quiet=True)
    add_openai_routes(app, store, logged_in)
    base = f"http://127.0.0.1:{port}"
    asks: list[tuple[str, dict[str, Any]]] = [
        ("/login", {"method": "POST", "data": {"username": LOGIN[0], "password": LOGIN[1]}}),
        ("/v1/models", {"method": "GET", "headers": {"authorization": "Bearer " + ":".join(LOGIN)}}),
    ]
    try:
        for path, request in asks:
            entered.clear()
            release.clear()
            answers: list[httpx.Response] = []
            method = request.pop("method")
            asking = threading.Thread(
                target=lambda: answers.append(httpx.request(method, base + path, timeout=300, **request))  # noqa: B023
            )
            asking.start()
            try:
                assert entered.wait(120), f"{path}: the password check never started"
                page = httpx.get(f"{base}/theme.css", timeout=60)  # the check is still held in its thread
                assert page.status_code == 200, path
            finally:
                release.set()
                asking.join(300)
            assert answers and answers[0].status_code == 200, (path, answers)
    finally:
        release.set()
        demo.close()
