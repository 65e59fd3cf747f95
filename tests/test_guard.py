"""The door (issue 32): Host and Origin checks, the access token off loopback, the login rate limit.

Unit tests judge `app.guard.GuardSettings` and `app.login_limit.CredentialLimiter` directly; the rest
drive the real `tunedeck serve --no-worker` on a free port with forged Host and Origin headers, as
a DNS-rebinding page or another site's page would send them, and one Chromium test opens a page
from another origin that tries to change the dashboard.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dashboard_helpers import serve_dashboard as _serve
from dashboard_helpers import stop_dashboard as _stop

from app.guard import GuardSettings, configured_hosts, token_hash
from app.login_limit import CredentialLimiter
from app.server import access_token, exposure_warning

TOKEN = "fixed-test-token-3f9a1c7e5b"


# ---------------------------------------------------------------------- unit: the rules
def test_loopback_names_configured_names_and_ips_of_a_wildcard_bind_are_the_only_hosts() -> None:
    local = GuardSettings(hosts=configured_hosts(["Deck.Example.com", "lab:8443"], env=""), bind="127.0.0.1")
    for host in ("127.0.0.1", "127.0.0.1:7860", "localhost:7860", "LOCALHOST", "[::1]:7860", "::1"):
        assert local.host_allowed(host), host
    assert local.host_allowed("deck.example.com") and local.host_allowed("deck.example.com:7860")
    assert local.host_allowed("lab:8443") and not local.host_allowed("lab:9999")
    for host in (
        "evil.example",
        "evil.example:7860",
        "localhost.evil.example",
        "",
        "10.0.0.5:7860",
        "127.0.0.1.nip.io",
    ):
        assert not local.host_allowed(host), host
    wildcard = GuardSettings(bind="0.0.0.0")
    assert wildcard.host_allowed("10.0.0.5:7860") and wildcard.host_allowed("[fe80::1]:7860")
    assert not wildcard.host_allowed("evil.example:7860")
    assert GuardSettings(bind="10.0.0.5").host_allowed("10.0.0.5:7860")
    assert GuardSettings(bind="gpu1.lab").host_allowed("GPU1.lab:7860")  # the name it was told to bind
    assert not GuardSettings(bind="10.0.0.5").host_allowed("10.0.0.6:7860")
    assert configured_hosts([], env="a.example, b.example c.example") == {"a.example", "b.example", "c.example"}


def test_an_origin_passes_only_as_the_page_s_own_or_a_configured_host() -> None:
    s = GuardSettings(hosts=frozenset({"deck.example.com"}))
    assert s.origin_allowed("http://127.0.0.1:7860", "127.0.0.1:7860")
    assert not s.origin_allowed("http://127.0.0.1:9999", "127.0.0.1:7860")  # another local site
    assert not s.origin_allowed("http://localhost:7860", "127.0.0.1:7860")
    assert not s.origin_allowed("https://evil.example", "127.0.0.1:7860")
    assert not s.origin_allowed("null", "127.0.0.1:7860")
    assert s.origin_allowed("https://deck.example.com", "127.0.0.1:7860")  # behind a proxy that rewrites Host


def test_the_token_is_compared_by_its_hash() -> None:
    from app.guard import _cookie_token

    assert _cookie_token(f"a=b; tunedeck-token={TOKEN}; c=d".encode()) == TOKEN
    assert _cookie_token(b"xtunedeck-token=abc") is None and _cookie_token(b"garbage") is None
    s = GuardSettings(token_sha256=token_hash(TOKEN))
    assert s.token_ok(TOKEN) and not s.token_ok(TOKEN + "x") and not s.token_ok("") and not s.token_ok(None)
    assert GuardSettings().token_ok(None)


def test_serve_takes_allowed_hosts_and_the_ways_out() -> None:
    from app.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--allowed-host", "a.example", "--allowed-host", "b.example"])
    assert args.allowed_host == ["a.example", "b.example"] and not args.insecure_no_login
    assert not args.allow_remote_code and not args.allow_reward_function
    assert build_parser().parse_args(["serve", "--insecure-no-login"]).insecure_no_login


def test_a_token_is_made_off_loopback_only_without_a_login() -> None:
    assert access_token("127.0.0.1", has_login=False) is None
    assert access_token("localhost", has_login=False) is None
    assert access_token("0.0.0.0", has_login=True) is None
    assert access_token("0.0.0.0", has_login=False, insecure_no_login=True) is None
    first, second = access_token("0.0.0.0", has_login=False), access_token("0.0.0.0", has_login=False)
    assert first and second and first != second and len(first) >= 40
    warning = exposure_warning("0.0.0.0", 7860)
    assert warning and "--insecure-no-login" in warning


def test_the_login_limiter_refuses_after_five_failures_and_forgets_after_the_window() -> None:
    now = [1000.0]
    limiter = CredentialLimiter(clock=lambda: now[0])
    for _ in range(4):
        limiter.record("10.0.0.1", ok=False)
    assert limiter.wait_s("10.0.0.1") == 0
    limiter.record("10.0.0.1", ok=False)
    assert limiter.wait_s("10.0.0.1") == pytest.approx(60.0)
    assert limiter.wait_s("10.0.0.2") == 0  # per client
    now[0] += 30
    assert limiter.wait_s("10.0.0.1") == pytest.approx(30.0)
    now[0] += 31
    assert limiter.wait_s("10.0.0.1") == 0
    limiter.record("10.0.0.1", ok=True)
    assert "10.0.0.1" not in limiter.failures


def test_the_same_wrong_credential_again_counts_once() -> None:
    limiter = CredentialLimiter(clock=lambda: 1000.0)
    for _ in range(10):
        limiter.record("10.0.0.1", ok=False, key=b"stale-cookie")  # a browser's old token, sent with each request
    assert limiter.wait_s("10.0.0.1") == 0
    for i in range(4):
        limiter.record("10.0.0.1", ok=False, key=f"guess{i}".encode())
    assert limiter.wait_s("10.0.0.1") > 0


# ---------------------------------------------------------------------- the real server
@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The default: 127.0.0.1, no login (the one-user dashboard a rebinding page would aim at)."""
    home = tmp_path_factory.mktemp("guard-local")
    proc, port = _serve(home, home / "server.log", args=("--allowed-host", "deck.example.test"))
    try:
        yield {"base": f"http://127.0.0.1:{port}", "port": port, "home": home}
    finally:
        _stop(proc)


def _routes(port: int) -> list[tuple[str, str]]:
    """(method, path) for the page, its config, the API, an upload, a download and the live stream."""
    return [
        ("GET", "/"),
        ("GET", "/config"),
        ("GET", "/gradio_api/info"),
        ("POST", "/gradio_api/upload"),
        ("POST", "/gradio_api/call/submit"),
        ("GET", "/gradio_api/file=/etc/hostname"),
        ("GET", "/tunedeck/live?runs=1"),
    ]


def _send(client: httpx.Client, method: str, path: str, **headers: str) -> httpx.Response:
    if path.endswith("/upload"):
        return client.post(path, files={"files": ("a.jsonl", b"{}\n")}, headers=headers)
    if path.endswith("/submit"):
        return client.post(path, json={"data": ["model: tiny-llama\ntrust_remote_code: true\n"]}, headers=headers)
    if "/live" in path:
        with client.stream("GET", path, headers=headers) as r:
            r.close()
            return r
    return client.request(method, path, headers=headers)


def test_a_forged_host_is_refused_on_every_route(local: dict) -> None:
    with httpx.Client(base_url=local["base"], timeout=10) as client:
        for method, path in _routes(local["port"]):
            r = _send(client, method, path, host=f"evil.example:{local['port']}")
            assert r.status_code == 421, (method, path, r.status_code)
        r = client.get("/", headers={"host": "rebind.attacker.test"})
        assert r.status_code == 421 and "--allowed-host" in r.json()["error"]
        assert "gradio_config" not in r.text


def test_loopback_names_are_served_as_before(local: dict) -> None:
    with httpx.Client(base_url=local["base"], timeout=10) as client:
        for host in (f"127.0.0.1:{local['port']}", f"localhost:{local['port']}", "localhost", "deck.example.test"):
            r = client.get("/", headers={"host": host})  # the last: allowed by `serve --allowed-host`
            assert r.status_code == 200 and "gradio_config" in r.text, host
        up = client.post("/gradio_api/upload", files={"files": ("ok.jsonl", b"{}\n")})  # no Origin: a script
        assert up.status_code == 200, up.text
        own = client.post(
            "/gradio_api/upload", files={"files": ("ok.jsonl", b"{}\n")}, headers={"origin": local["base"]}
        )
        assert own.status_code == 200, own.text


def test_a_request_from_another_site_is_refused(local: dict) -> None:
    with httpx.Client(base_url=local["base"], timeout=10) as client:
        for origin in ("https://evil.example", "http://127.0.0.1:1", "null", f"http://localhost:{local['port']}"):
            for path in ("/gradio_api/upload", "/gradio_api/call/submit", "/gradio_api/queue/join"):
                r = _send(client, "POST", path, origin=origin)
                assert r.status_code == 403, (origin, path, r.status_code)
                assert "another site" in r.json()["error"]
        # Reads too: Gradio's CORS would let a page of another local origin read its answers.
        for path in ("/config", "/gradio_api/info", "/tunedeck/live?runs=1"):
            r = _send(client, "GET", path, origin="http://127.0.0.1:1")
            assert r.status_code == 403, (path, r.status_code)


@pytest.fixture(scope="module")
def tokened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """0.0.0.0 without a login: protected by a fresh random token, printed once."""
    home = tmp_path_factory.mktemp("guard-token")
    log = home / "server.log"
    proc, port = _serve(home, log, host="0.0.0.0")
    try:
        match = re.search(r"http://127\.0\.0\.1:\d+/\?token=([\w-]+)", log.read_text())
        assert match, log.read_text()
        yield {"base": f"http://127.0.0.1:{port}", "port": port, "token": match.group(1), "log": log}
    finally:
        _stop(proc)


def test_an_open_bind_without_a_login_needs_the_printed_token(tokened: dict) -> None:
    token = tokened["token"]
    assert tokened["log"].read_text().count(token) == 1  # printed once, and nowhere else
    with httpx.Client(base_url=tokened["base"], timeout=10) as anon:
        for method, path in _routes(tokened["port"]):
            r = _send(anon, method, path)
            assert r.status_code == 401, (method, path, r.status_code)
        assert _send(anon, "GET", "/?token=wrong").status_code == 401
        assert anon.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert anon.get("/tunedeck/health").json() == {"status": "ok"}  # the container health check
    with httpx.Client(base_url=tokened["base"], timeout=10) as browser:
        first = browser.get(f"/?token={token}")
        assert first.status_code == 303 and first.headers["location"] == "/"
        assert "HttpOnly" in first.headers["set-cookie"]
        page = browser.get("/")  # the cookie alone, as a browser's next requests
        assert page.status_code == 200 and "gradio_config" in page.text
        assert browser.post("/gradio_api/upload", files={"files": ("a.jsonl", b"{}\n")}).status_code == 200
    bearer = httpx.get(f"{tokened['base']}/gradio_api/info", headers={"authorization": f"Bearer {token}"}, timeout=10)
    assert bearer.status_code == 200 and "named_endpoints" in bearer.json()
    assert not [
        p
        for p in Path(tokened["log"].parent).rglob("*")
        if p.is_file() and token.encode() in p.read_bytes() and p != tokened["log"]
    ]  # only the hash is kept, never the token


def test_insecure_no_login_serves_open_with_a_loud_warning(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    proc, port = _serve(tmp_path, log, host="0.0.0.0", args=("--insecure-no-login",))
    try:
        assert "WARNING: --insecure-no-login" in log.read_text() and "token=" not in log.read_text()
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
    finally:
        _stop(proc)


def test_login_attempts_are_rate_limited_per_client(tmp_path: Path) -> None:
    proc, port = _serve(tmp_path, tmp_path / "server.log", host="0.0.0.0", TUNEDECK_AUTH="alice:pw-alice-12345")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            codes = [
                client.post("/login", data={"username": "alice", "password": f"guess{i}"}).status_code for i in range(5)
            ]
            assert all(400 <= c < 429 for c in codes), codes
            refused = client.post("/login", data={"username": "alice", "password": "pw-alice-12345"})
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
            assert "too many failed logins" in refused.json()["detail"]
    finally:
        _stop(proc)


# ---------------------------------------------------------------------- a page from another origin
class _Page(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args: object) -> None:
        pass


ATTACK = """<!doctype html><html><body><pre id=out>running</pre><script>
const target = "%s";
async function attempt(path, init) {
  try { const r = await fetch(target + path, init); return path + " " + r.status + " " + (await r.text()).slice(0, 200); }
  catch (e) { return path + " error " + e; }
}
(async () => {
  const form = new FormData(); form.append("files", new Blob(["{}\\n"]), "from-evil.jsonl");
  const spec = JSON.stringify({data: ["model: tiny-llama\\ntrust_remote_code: true\\n"]});
  const out = [
    await attempt("/gradio_api/upload", {method: "POST", body: form, credentials: "include"}),
    await attempt("/gradio_api/call/submit", {method: "POST", body: spec, headers: {"content-type": "application/json"}}),
    await attempt("/gradio_api/upload", {method: "POST", body: form, mode: "no-cors"}),
    await attempt("/config", {credentials: "include"}),
  ];
  document.getElementById("out").textContent = out.join("\\n");
})();
</script></body></html>"""


@pytest.mark.browser
def test_a_page_from_another_origin_cannot_change_the_dashboard(local: dict) -> None:
    from browser_helpers import chromium

    _Page.html = (ATTACK % local["base"]).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    uploads = local["home"] / "uploads"
    try:
        with chromium() as browser:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
            page.wait_for_function("document.getElementById('out').textContent !== 'running'", timeout=60_000)
            seen = page.inner_text("#out")
    finally:
        server.shutdown()
    lines = seen.splitlines()
    assert len(lines) == 4, seen
    for line in lines:
        assert " 200 " not in line, seen  # nothing accepted, nothing read
        assert " 403 " in line or " error " in line or " 0 " in line, seen
    assert not [p for p in uploads.rglob("from-evil.jsonl")], "the cross-origin upload was saved"


def test_a_script_uses_the_api_with_the_token_and_remote_code_stays_off(tokened: dict) -> None:
    from gradio_client import Client

    client = Client(
        tokened["base"] + "/",
        headers={"Authorization": f"Bearer {tokened['token']}"},
        analytics_enabled=False,
        verbose=False,
    )
    assert client.predict(api_name="/runs") == []
    out = client.predict(spec_yaml="model: tiny-llama\ntrust_remote_code: true\nmax_steps: 1\n", api_name="/submit")
    assert out["run_id"] is None and [p["field"] for p in out["problems"]] == ["trust_remote_code"]
    assert "--allow-remote-code" in out["problems"][0]["fix"]
