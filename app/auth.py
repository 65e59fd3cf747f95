"""Optional login for the dashboard: salted scrypt password hashes, checked in constant time.

Credentials come from either
- `TUNEDECK_AUTH=user:password` (one user; the password is hashed in memory at start-up), or
- `tunedeck serve --auth-file FILE`: one `user:HASH` line per user, HASH made by
  `tunedeck hash-password` (`scrypt$n$r$p$salt$key`, base64); `#` starts a comment.

`gradio_auth(credentials)` is the callable handed to Gradio's `launch(auth=...)`; it costs one
scrypt (~50 ms) per login attempt whether or not the user exists, so timing tells nothing, and runs
it in a worker thread. Attempts are rate-limited per client (app.login_limit).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio.to_thread

from jobs.errors import Problem, ProblemError

SCRYPT_N, SCRYPT_R, SCRYPT_P, KEY_LEN = 2**14, 8, 1, 32
AUTH_ENV = "TUNEDECK_AUTH"


class AuthError(ProblemError):
    """Unusable credentials configuration (reported like any bad input: field, problem, fix)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """`scrypt$n$r$p$salt$key` for `password`, with a fresh 16-byte salt."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    key = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=64 * 1024 * 1024, dklen=KEY_LEN
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    scheme, n, r, p, salt, key = encoded.split("$")
    if scheme != "scrypt":
        raise ValueError(f"unknown scheme {scheme!r}")
    return int(n), int(r), int(p), base64.b64decode(salt, validate=True), base64.b64decode(key, validate=True)


def verify_password(password: str, encoded: str) -> bool:
    """True when `password` matches `encoded` (constant-time comparison of the derived keys)."""
    try:
        n, r, p, salt, key = _parse_hash(encoded)
    except (ValueError, TypeError):
        return False
    derived = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=128 * 1024 * 1024, dklen=len(key)
    )
    return hmac.compare_digest(derived, key)


def read_auth_file(path: str | Path) -> dict[str, str]:
    """{user: hash} from an auth file; AuthError naming the line of each bad entry."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise AuthError(
            [
                Problem(
                    "--auth-file",
                    f"{path} does not exist",
                    "create it with lines `user:HASH` from `tunedeck hash-password --user NAME`",
                )
            ]
        )
    users: dict[str, str] = {}
    problems = []
    for number, raw in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, encoded = line.partition(":")
        try:
            if not sep or not user.strip():
                raise ValueError("not user:HASH")
            _parse_hash(encoded.strip())
        except (ValueError, TypeError):
            problems.append(
                Problem(
                    "--auth-file",
                    f"line {number} of {path} is not `user:HASH` with a scrypt hash "
                    "(plain passwords are not accepted in the file)",
                    "replace it with the line printed by `tunedeck hash-password --user NAME`",
                )
            )
            continue
        users[user.strip()] = encoded.strip()
    if problems:
        raise AuthError(problems)
    if not users:
        raise AuthError(
            [
                Problem(
                    "--auth-file",
                    f"{path} lists no users",
                    "add a `user:HASH` line from `tunedeck hash-password --user NAME`",
                )
            ]
        )
    return users


def credentials_from_env(value: str | None = None) -> dict[str, str]:
    """{user: hash} from TUNEDECK_AUTH=user:password ({} when unset)."""
    value = os.environ.get(AUTH_ENV, "") if value is None else value
    if not value.strip():
        return {}
    user, sep, password = value.partition(":")
    if not sep or not user.strip() or not password:
        raise AuthError(
            [
                Problem(
                    AUTH_ENV, "is not `user:password`", f"set e.g. {AUTH_ENV}=admin:a-long-password, or use --auth-file"
                )
            ]
        )
    return {user.strip(): hash_password(password)}


def load_credentials(auth_file: str | Path | None = None) -> dict[str, str]:
    """Users from --auth-file, else TUNEDECK_AUTH; {} means the dashboard has no login."""
    return read_auth_file(auth_file) if auth_file else credentials_from_env()


_DUMMY_HASH = hash_password(secrets.token_hex(8))


def password_check(users: dict[str, str]) -> Callable[[str, str], bool]:
    """`check(user, password)`: one scrypt, the same work for unknown users as for wrong passwords."""

    def check(username: str, password: str) -> bool:
        encoded = users.get(username or "")
        ok = verify_password(password or "", encoded or _DUMMY_HASH)
        return ok and encoded is not None

    return check


def gradio_auth(users: dict[str, str]) -> Callable[[str, str], Awaitable[bool]]:
    """The `auth=` callable for Gradio (its login form awaits it, as `/v1` does through
    app.login_limit.password_ok): `password_check` in a worker thread, so a check of ~50 ms never
    holds the event loop, and with it every other request."""
    check = password_check(users)

    async def login(username: str, password: str) -> bool:
        return await anyio.to_thread.run_sync(check, username, password)

    return login
