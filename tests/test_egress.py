"""Issue 48: a worker's key goes only to endpoints its operator trusts (TUNEDECK_TRUSTED_ENDPOINTS), never to a URL
a spec names; a shared dashboard refuses an untrusted judge endpoint at submit.

The endpoints are real HTTP servers on 127.0.0.1 that play the attacker and record each request's headers."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobs.checks.access import AccessPolicy
from jobs.checks.egress import TRUSTED_ENV, endpoint_problem, is_trusted, trusted_endpoints
from jobs.spec.job import JobSpec, SpecError
from jobs.train.judges import KEY_ENV, endpoint_asker
from storage.store import Store

BACKENDS = ("sqlite",)  # only the checks in front of the store are tested here
KEY = "sk-operator-secret"


# ---------------------------------------------------------------------- the matching rule
@pytest.mark.parametrize(
    ("url", "trusted"),
    [
        ("https://api.x.com/v1/chat/completions", True),
        ("https://api.x.com/v1", True),
        ("https://api.x.com/v1/", True),
        ("HTTPS://API.X.COM/v1/chat/completions", True),  # scheme and host compared in lower case
        ("https://api.x.com:443/v1/chat/completions", True),  # the default port written out
        ("https://api.x.com.evil/v1/chat/completions", False),  # a longer host
        ("https://evil.api.x.com/v1/chat/completions", False),
        ("https://api.x.com/v1evil/chat/completions", False),  # the path matched by whole segments
        ("https://api.x.com/v2/chat/completions", False),
        ("https://api.x.com/chat/completions", False),
        ("https://api.x.com@evil.example/v1/chat/completions", False),  # user-info: the host is evil.example
        ("https://user:pw@api.x.com/v1/chat/completions", False),  # any user-info
        ("https://api.x.com/v1/../../evil/chat/completions", False),  # dot segments
        ("https://api.x.com/v1/./chat/completions", False),
        ("https://api.x.com/v1/%2e%2e/evil", False),  # encoded dots
        ("https://api.x.com/v1/%2E%2E/evil", False),
        ("https://api.x.com/v1%2f..%2fevil", False),  # encoded slash
        ("https://api.x.com/v1\\..\\evil", False),  # backslashes
        ("https://api.x.com\\@evil.example/v1", False),
        ("https://api.x.com/v1/chat completions", False),  # whitespace
        ("https://api.x.com/v1/\nchat", False),
        ("http://api.x.com/v1/chat/completions", False),  # another scheme
        ("https://api.x.com:8443/v1/chat/completions", False),  # another port
        ("https://api.x.com:99999/v1", False),  # no port at all
        ("ftp://api.x.com/v1", False),
        ("//api.x.com/v1", False),
        ("", False),
    ],
)
def test_a_url_is_trusted_only_under_an_operator_prefix(url: str, trusted: bool) -> None:
    allowed = trusted_endpoints({TRUSTED_ENV: " https://api.x.com/v1 , http://10.0.0.7:8000 "})
    assert is_trusted(url, allowed) is trusted


def test_a_prefix_without_a_path_trusts_the_whole_origin_and_bad_entries_trust_nothing() -> None:
    allowed = trusted_endpoints({TRUSTED_ENV: "http://10.0.0.7:8000"})
    assert is_trusted("http://10.0.0.7:8000/anything/chat/completions", allowed)
    assert not is_trusted("http://10.0.0.7:8001/v1", allowed) and not is_trusted("http://10.0.0.70:8000/v1", allowed)
    bad = "https://me@api.x.com/v1,https://api.x.com/v1/../x,ftp://api.x.com,not a url,"
    assert trusted_endpoints({TRUSTED_ENV: bad}) == ()
    assert trusted_endpoints({}) == ()


# ---------------------------------------------------------------------- a real endpoint that records what it got
class Recorder(ThreadingHTTPServer):
    def __init__(self, redirect_to: str | None = None, status: int = 200, content: str = "A, it is better") -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers)
        self.redirect_to = redirect_to
        self.status = status
        self.content = content  # the reply's message

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, self.path, dict(self.headers.items())))
        if self.server.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": self.server.content}}]}).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = _answer
    do_GET = _answer

    def log_message(self, *args: Any) -> None:
        pass


def serving(server: Recorder) -> Recorder:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def attacker() -> Iterator[Recorder]:
    with serving(Recorder()) as server:
        yield server
        server.shutdown()


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv(TRUSTED_ENV, raising=False)
    return KEY


def authorizations(server: Recorder) -> list[str | None]:
    return [
        next((v for k, v in headers.items() if k.lower() == "authorization"), None) for _, _, headers in server.seen
    ]


def test_a_judge_endpoint_the_operator_does_not_trust_gets_no_key(attacker: Recorder, key: str) -> None:
    assert endpoint_asker(f"{attacker.url}/v1#gpt-judge")("Which is better?") == "A, it is better"
    assert [(m, p) for m, p, _ in attacker.seen] == [("POST", "/v1/chat/completions")]
    assert authorizations(attacker) == [None]


def test_a_trusted_prefix_that_only_looks_alike_gets_no_key(
    attacker: Recorder, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = attacker.server_address[1]
    with socket.socket() as other:  # a port nobody serves: a trusted entry for another port
        other.bind(("127.0.0.1", 0))
        elsewhere = other.getsockname()[1]
    trusted = f"http://127.0.0.1:{port}/v1evil,http://127.0.0.1:{elsewhere}/v1,http://localhost:{port}/v1"
    monkeypatch.setenv(TRUSTED_ENV, trusted)
    endpoint_asker(f"{attacker.url}/v1#gpt-judge")("q")
    assert authorizations(attacker) == [None]


def test_a_trusted_endpoint_gets_the_key(attacker: Recorder, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRUSTED_ENV, f"https://api.example.com/v1,{attacker.url}/v1")
    endpoint_asker(f"{attacker.url}/v1/#gpt-judge")("q")
    assert authorizations(attacker) == [f"Bearer {KEY}"]


def test_a_trusted_endpoint_that_redirects_elsewhere_does_not_pass_the_key_on(
    attacker: Recorder, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(Recorder(redirect_to=f"{attacker.url}/stolen")) as trusted:
        monkeypatch.setenv(TRUSTED_ENV, f"{trusted.url}/v1")
        assert endpoint_asker(f"{trusted.url}/v1#gpt-judge")("q") == "A, it is better"
        trusted.shutdown()
    assert authorizations(trusted) == [f"Bearer {KEY}"]
    assert [(m, p) for m, p, _ in attacker.seen] == [("GET", "/stolen")] and authorizations(attacker) == [None]


def test_an_untrusted_endpoint_that_wants_a_key_says_why_none_was_sent(key: str) -> None:
    with serving(Recorder(status=401)) as locked:
        with pytest.raises(SpecError) as refused:
            endpoint_asker(f"{locked.url}/v1#gpt-judge")("q")
        locked.shutdown()
    (problem,) = refused.value.problems
    assert problem.field == "judge" and f"`{locked.url}/v1/chat/completions` answered 401" in problem.problem
    assert "called without the worker's key" in problem.problem and TRUSTED_ENV in problem.fix
    assert authorizations(locked) == [None]


# ---------------------------------------------------------------------- refused at submit on a shared dashboard
def _finished_run(store: Store, model: Path) -> int:
    from training_helpers import tiny_spec

    host = socket.gethostname()
    run_id = store.create_run(tiny_spec(model))
    claimed = store.claim_next_on_device(f"{host}:1", "0", host=host)
    assert claimed is not None and claimed.id == run_id
    store.mark_succeeded(run_id, {})
    store.release_device("0", f"{host}:1", host=host)
    return run_id


def test_a_shared_dashboard_refuses_an_untrusted_judge_endpoint_at_submit(
    store: Store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app import api
    from app.ui import evaluate as ui_evaluate
    from app.ui import form as ui_form
    from jobs.checks.pipeline import check
    from jobs.queue.submit import submit

    monkeypatch.delenv(TRUSTED_ENV, raising=False)
    judge = "https://judge.evil.example/v1#gpt-judge"
    spec = JobSpec(model="tiny-llama", max_steps=1, judge=judge)
    shared = AccessPolicy.for_server(login=True)
    with pytest.raises(SpecError) as refused:
        submit(store, spec, shared)
    (problem,) = refused.value.problems
    assert problem.field == "judge" and "`https://judge.evil.example/v1` is not an endpoint" in problem.problem
    assert TRUSTED_ENV in problem.fix
    errors, queued = ui_form.launch(store, *ui_form.form_values(spec), policy=shared)  # the launch form
    assert queued is None and "judge" in errors and TRUSTED_ENV in errors
    out = api.submit_yaml(store, spec.to_yaml(), shared)
    assert out["run_id"] is None and [p["field"] for p in out["problems"]] == ["judge"]
    assert store.count_runs() == 0
    # the run page's Judge button (a finished run, a worker that can reach it): the same refusal, nothing queued
    run_id = _finished_run(store, tiny_model)
    host = socket.gethostname()
    store.worker_beat(f"{host}:5", 5, host)
    text, ids = ui_evaluate.request_judging(store, shared, run_id, judge)
    assert ids == [] and "is not an endpoint this server trusts" in text and TRUSTED_ENV in text
    assert store.run_tasks(run_id) == []
    # a local dashboard (no login) and the command line queue it, with a warning: it is called without a key
    assert AccessPolicy.for_server(login=False).problems(spec) == [] and AccessPolicy.open().problems(spec) == []
    checked = check(spec, policy=AccessPolicy.for_server(login=False))
    assert checked.problems == []
    assert [w for w in checked.warnings if w.startswith("judge:")] == [
        f"judge: `https://judge.evil.example/v1` is not in {TRUSTED_ENV}, so the workers call it without their keys "
        "(fine for an endpoint that needs none; else ask the operator to add it)"
    ]
    monkeypatch.setenv(TRUSTED_ENV, "https://judge.evil.example/v1")
    assert AccessPolicy.for_server(login=True).problems(spec) == []


def test_what_is_no_endpoint_is_no_egress_problem() -> None:
    for judge in (None, "", "smollm2-135m-instruct", "run:3", "/models/judge"):
        assert endpoint_problem(judge, "judge") is None


def test_other_fields_that_could_name_a_url_fetch_nothing_from_it(attacker: Recorder, key: str) -> None:
    """The audit's other fields: a model, data sets or an image named by a URL are refused at submit, and the
    attacker's server never hears from the dashboard or a worker."""
    from jobs.checks.pipeline import check
    from jobs.data.images import resolve_image

    spec = JobSpec(
        model=f"{attacker.url}/org/model",
        dataset=f"{attacker.url}/rows.jsonl",
        eval_dataset=f"{attacker.url}/held-out.jsonl",
        max_steps=1,
    )
    fields = {p.field for p in check(spec).problems}
    assert {"model", "dataset", "eval_dataset"} <= fields
    assert resolve_image(f"{attacker.url}/cat.png", None)[1] is not None  # a web image is never fetched
    assert attacker.seen == []
