"""Where a worker's own credentials may go: only to endpoints its operator trusts (issue 48).

A spec can name a URL (the judge's `URL#MODEL`); the key the worker holds (OPENAI_API_KEY) is the
operator's, not the spec writer's. So a key is sent only to an endpoint the operator configured in
the worker's environment:

    TUNEDECK_TRUSTED_ENDPOINTS=https://api.openai.com/v1,http://10.0.0.7:8000/v1   # URL prefixes, by commas

A URL is trusted when its scheme, host and port equal one entry's exactly (default ports filled in,
names compared in lower case) and its path starts with the entry's path by whole segments:
`https://api.x.com/v1` trusts `https://api.x.com/v1/chat/completions`, not `https://api.x.com/v1evil`,
`https://api.x.com.evil/v1` nor `https://api.x.com:8443/v1`. A URL with user-info (`https://api.x.com@evil`),
a `.`/`..` segment, an encoded dot, slash or backslash (`%2e`, `%2f`, `%5c`), a backslash, whitespace or a
control character is never trusted, whatever the list says. Every other URL from a spec is called
WITHOUT a key (`key_headers` returns none; a 401/403 it answers then says so: `unkeyed_refusal`), a local
dashboard and the command line warn at submit (`endpoint_warning`), and a shared dashboard (an `AccessPolicy`
with a login) refuses it at submit (`endpoint_problem`), naming the field and the fix. A redirect is followed
with the key only when its target is trusted too (`opener`).

Audit of every outbound call a spec can cause (kept here so the next field that names a URL adds itself):
- judge `URL#MODEL` (`jobs.evaluate.judge.endpoint_asker`): the one field that is a URL; the key only when
  trusted, through this module.
- hub models and data sets (`model`, `dataset`, `eval_dataset`, lm-eval hub tasks): a spec names a repo id,
  never a host; the address is the worker's HF_ENDPOINT and the token its own HF_TOKEN / `hf auth login`, which
  huggingface_hub and datasets send to that endpoint only.
- images in rows: web URLs are refused, never fetched (`jobs.data.images.resolve_image`).
- trackers (`report_to`): a spec names a tracker only; where it reports and with which key come from the worker's
  environment (MLFLOW_TRACKING_URI, WANDB_API_KEY, WANDB_BASE_URL, TRACKIO_*), read by each library.
- hub push (`tunedeck push`, the Export tab): the repo id comes from the request, the address from HF_ENDPOINT.
- Ray (`jobs.cluster.ray_engine`): the address is the operator's (`--ray`, RAY_API_SERVER_ADDRESS).
- an lm-eval task .yaml may name URLs and run code: refused on dashboards unless remote code is allowed.

    key_headers("https://api.x.com/v1/chat/completions", "OPENAI_API_KEY")   # {} unless trusted and set
    endpoint_problem("https://evil.example/v1#m", "judge")                    # Problem or None
"""

from __future__ import annotations

import logging
import os
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from jobs.errors import Problem

log = logging.getLogger(__name__)

TRUSTED_ENV = "TUNEDECK_TRUSTED_ENDPOINTS"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NEVER = re.compile(r"[\\\s\x00-\x1f\x7f]|%(2e|2f|5c|00)", re.IGNORECASE)


@dataclass(frozen=True)
class Endpoint:
    """A URL prefix: scheme, host, port and the path's segments."""

    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]

    def covers(self, other: Endpoint) -> bool:
        same_origin = (self.scheme, self.host, self.port) == (other.scheme, other.host, other.port)
        return same_origin and other.segments[: len(self.segments)] == self.segments


def parse_endpoint(url: str) -> Endpoint | None:
    """`url` as an Endpoint; None when it is not a plain http(s) URL that could ever be trusted."""
    url = url.strip()
    if not url or _NEVER.search(url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    segments = tuple(parts.path.split("/"))
    if any(s in (".", "..") for s in segments):
        return None
    segments = tuple(segments[1:]) if segments and segments[0] == "" else segments  # the path's leading "/"
    while segments and segments[-1] == "":  # "https://x/v1/" is the prefix "https://x/v1"
        segments = segments[:-1]
    return Endpoint(scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme], segments)


def trusted_endpoints(environ: Mapping[str, str] | None = None) -> tuple[Endpoint, ...]:
    """The operator's trusted prefixes (TUNEDECK_TRUSTED_ENDPOINTS); an entry that could never be trusted is
    left out with a warning."""
    raw = (environ if environ is not None else os.environ).get(TRUSTED_ENV, "")
    out = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        found = parse_endpoint(entry)
        if found is None:
            log.warning("%s: %r is not a plain http(s) URL prefix; left out", TRUSTED_ENV, entry)
        else:
            out.append(found)
    return tuple(out)


def is_trusted(url: str, trusted: tuple[Endpoint, ...] | None = None) -> bool:
    """Whether the operator trusts `url` with the worker's credentials."""
    found = parse_endpoint(url)
    allowed = trusted_endpoints() if trusted is None else trusted
    return found is not None and any(t.covers(found) for t in allowed)


def key_headers(url: str, key_env: str) -> dict[str, str]:
    """`Authorization: Bearer $key_env` for a trusted `url` where the key is set; {} otherwise."""
    key = os.environ.get(key_env, "").strip()
    if not key:
        return {}
    if not is_trusted(url):
        log.warning("%s is not in %s: called without the worker's %s", _origin(url), TRUSTED_ENV, key_env)
        return {}
    return {"Authorization": f"Bearer {key}"}


def endpoint_problem(ref: str | None, field: str) -> Problem | None:
    """A Problem when `ref` (a URL, or `URL#MODEL`) is an endpoint the operator does not trust; None for
    trusted ones and for anything that is no http(s) URL."""
    url = (ref or "").strip().partition("#")[0]
    if not url.lower().startswith(("http://", "https://")) or is_trusted(url):
        return None
    return Problem(
        field,
        f"`{_origin(url)}` is not an endpoint this server trusts with its keys, and a shared dashboard calls "
        "no endpoint its users name",
        f"ask the operator to add its address to {TRUSTED_ENV} (where the dashboard and workers run), or pick a "
        "built-in model, a folder or run:N as the judge",
    )


def endpoint_warning(ref: str | None, field: str) -> str | None:
    """What a local dashboard or the command line says at submit about an untrusted endpoint (it still runs)."""
    url = (ref or "").strip().partition("#")[0]
    if not url.lower().startswith(("http://", "https://")) or is_trusted(url):
        return None
    return (
        f"{field}: `{_origin(url)}` is not in {TRUSTED_ENV}, so the workers call it without their keys "
        "(fine for an endpoint that needs none; else ask the operator to add it)"
    )


def unkeyed_refusal(url: str, status: int, field: str) -> Problem:
    """An endpoint called without a key refused it (401/403): say why no key was sent."""
    return Problem(
        field,
        f"`{_origin(url)}` answered {status}: it was called without the worker's key, as it is not in {TRUSTED_ENV}",
        f"ask the operator to add its address to {TRUSTED_ENV} where the workers run, or use an endpoint that "
        "needs no key",
    )


def _origin(url: str) -> str:
    """The URL without user-info, query or fragment, for messages and logs."""
    try:
        parts = urlsplit(url.strip())
        host = parts.netloc.rpartition("@")[2]
        return f"{parts.scheme}://{host}{parts.path}"
    except ValueError:
        return "(an unreadable URL)"


class _KeepKeyOnTrusted(urllib.request.HTTPRedirectHandler):
    """Redirects keep the key only when the new address is trusted too (urllib copies every header)."""

    def redirect_request(self, req: Any, fp: IO[bytes], code: int, msg: str, headers: Any, newurl: str) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not is_trusted(newurl):
            new.remove_header("Authorization")
        return new


def opener() -> urllib.request.OpenerDirector:
    """A urllib opener for calls that may carry a worker's key."""
    return urllib.request.build_opener(_KeepKeyOnTrusted())
