"""Safe serving, tested against the real server: login, file routes, uploads, secrets.

The server runs as a subprocess (`tunedeck serve --no-worker`) on a free port, with a data
directory holding a database, a run log, a `.env` with a fake HF token, a real bundle zip, a
symlinked "bundle" pointing out of the data directory, and a secret file outside it. Every
path-traversal attempt on every route that serves files must get a 4xx without the secret.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import zipfile
from pathlib import Path

import httpx
import pytest

from app import auth
from app.server import exposure_warning, is_loopback

ROOT = Path(__file__).resolve().parents[1]
SECRET = "TOPSECRET-7f3a9c"
HF_FAKE = "hf_fakeTOKENdoNotLeak0123456789"


# ---------------------------------------------------------------------- unit: auth and warning
def test_password_hash_round_trip_and_salt() -> None:
    first, second = auth.hash_password("correct horse"), auth.hash_password("correct horse")
    assert first != second  # salted
    assert first.startswith("scrypt$")
    assert auth.verify_password("correct horse", first)
    assert not auth.verify_password("correct horsf", first)
    assert not auth.verify_password("x", "not-a-hash")


def test_auth_file_and_env(tmp_path: Path) -> None:
    good = tmp_path / "users"
    good.write_text(f"# users\nalice:{auth.hash_password('pw-alice-1')}\n\n")
    check = auth.password_check(auth.load_credentials(good))
    assert check("alice", "pw-alice-1")
    assert not check("alice", "wrong") and not check("bob", "pw-alice-1") and not check("", "")
    plain = tmp_path / "plain"
    plain.write_text("alice:hunter2\n")
    with pytest.raises(auth.AuthError) as exc:
        auth.load_credentials(plain)
    assert "line 1" in str(exc.value) and "hash-password" in str(exc.value)
    with pytest.raises(auth.AuthError):
        auth.load_credentials(tmp_path / "missing")
    assert asyncio.run(auth.gradio_auth(auth.credentials_from_env("bob:pw-bob-22"))("bob", "pw-bob-22"))
    assert auth.credentials_from_env("") == {}
    with pytest.raises(auth.AuthError):
        auth.credentials_from_env("no-colon")


def test_hash_password_cli(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "hash-password", "--user", "carol"],
        input="pw-carol-333\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(tmp_path / "home"),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    user, _, encoded = out.stdout.strip().partition(":")
    assert user == "carol" and auth.verify_password("pw-carol-333", encoded)
    short = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "hash-password"],
        input="short\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(tmp_path / "home"),
        timeout=60,
    )
    assert short.returncode == 2 and "shorter than 8" in short.stderr


def test_default_bind_is_loopback_and_exposure_warns() -> None:
    from app.cli.main import build_parser

    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert exposure_warning("127.0.0.1", 7860) is None
    warning = exposure_warning("0.0.0.0", 7860)
    assert warning and "no login" in warning and "TUNEDECK_AUTH" in warning
    assert exposure_warning("0.0.0.0", 7860, has_login=True) is None


# ---------------------------------------------------------------------- the real server
def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEDECK_", "GRADIO_"))}
    env.update(
        TUNEDECK_HOME=str(home), HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=str(ROOT), **extra
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(home: Path, cwd: Path, host: str = "127.0.0.1", **env: str) -> tuple[subprocess.Popen, str, Path]:
    port = _free_port()
    log = cwd / f"server-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "serve", "--no-worker", "--host", host, "--port", str(port)],
        cwd=cwd,
        env=_env(home, **env),
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(base + "/", timeout=2).status_code in (200, 401):
                return proc, base, log
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"server did not come up in 120 s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory):
    """A data dir with secrets and one real bundle, and the server running on it."""
    root = tmp_path_factory.mktemp("site")
    home, outside = root / "home", root / "outside"
    home.mkdir()
    outside.mkdir()
    old = os.environ.get("TUNEDECK_HOME")
    os.environ["TUNEDECK_HOME"] = str(home)
    try:
        from jobs.spec.job import JobSpec
        from storage.store import Store

        store = Store()
        run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=1, run_name=SECRET))
        folder = store.run_dir(run_id)
        (folder / "train.log").write_text(f"log line {SECRET}\n")
        bundle = folder / "tiny-adapter.zip"
        with zipfile.ZipFile(bundle, "w") as zf:
            zf.writestr("adapter_config.json", "{}")
        store.add_artifact(run_id, "bundle", str(bundle), bundle.stat().st_size, "0" * 64)
        (outside / "secret.txt").write_text(SECRET)
        (folder / "evil.zip").symlink_to(outside / "secret.txt")
        store.add_artifact(run_id, "bundle", str(folder / "evil.zip"), 1, "0" * 64)
        store.add_artifact(run_id, "bundle", str(outside / "secret.txt"), 1, "0" * 64)  # recorded outside the dir
        (home / ".env").write_text(f"HF_TOKEN={HF_FAKE}\nX={SECRET}\n")
        (root / ".env").write_text(f"HF_TOKEN={HF_FAKE}\n")  # the server's cwd
        store.dispose()
    finally:
        if old is None:
            os.environ.pop("TUNEDECK_HOME", None)
        else:
            os.environ["TUNEDECK_HOME"] = old
    proc, base, log = _start(home, root, TUNEDECK_MAX_UPLOAD_MB="1")
    try:
        yield {
            "base": base,
            "home": home,
            "outside": outside,
            "root": root,
            "bundle": bundle,
            "log": log,
            "run_dir": folder,
        }
    finally:
        _stop(proc)


def _targets(site: dict) -> list[Path]:
    home = site["home"]
    return [
        home / "tunedeck.db",
        home / "tunedeck.db-wal",
        home / ".env",
        site["run_dir"] / "train.log",
        site["outside"] / "secret.txt",
        site["run_dir"] / "evil.zip",
        site["root"] / ".env",
        Path("/etc/passwd"),
    ]


def _spellings(target: Path, site: dict) -> list[str]:
    """Ways to name `target`: absolute, ../ from the data dir and the cwd, URL- and double-encoded."""
    absolute = str(target)
    rel_home = os.path.relpath(target, site["home"] / "uploads" / "incoming")
    rel_cwd = os.path.relpath(target, site["root"])
    deep = "../" * 12 + absolute.lstrip("/")
    forms = [absolute, rel_home, rel_cwd, deep, absolute.replace("/", "//")]
    out = []
    for form in forms:
        out += [
            form,
            urllib.parse.quote(form, safe=""),
            urllib.parse.quote(urllib.parse.quote(form, safe=""), safe=""),
            form.replace("..", "%2e%2e"),
        ]
    return out


ROUTES = [
    "/gradio_api/file={}",
    "/file={}",
    "/gradio_api/file/{}",
    "/static/{}",
    "/assets/{}",
    "/svelte/{}",
    "/gradio_api/proxy={}",
    "/{}",
]


def _secrets(site: dict) -> list[bytes]:
    return [SECRET.encode(), HF_FAKE.encode(), b"SQLite format 3", b"root:x:0:0"]


def test_no_route_serves_anything_outside_the_bundles(site: dict) -> None:
    leaks, allowed = [], []
    with httpx.Client(base_url=site["base"], timeout=10) as client:
        for target in _targets(site):
            for spelling in _spellings(target, site):
                for route in ROUTES:
                    url = route.format(spelling)
                    r = client.get(url)
                    if any(s in r.content for s in _secrets(site)):
                        leaks.append(f"{url} -> {r.status_code}")
                    elif r.status_code < 400 and "text/html" not in r.headers.get("content-type", ""):
                        allowed.append(f"{url} -> {r.status_code} {r.headers.get('content-type')}")
    assert not leaks, leaks[:20]
    assert not allowed, allowed[:20]


def test_the_real_bundle_is_downloadable(site: dict) -> None:
    r = httpx.get(f"{site['base']}/gradio_api/file={site['bundle']}", timeout=10)
    assert r.status_code == 200
    assert zipfile.ZipFile(io.BytesIO(r.content)).namelist() == ["adapter_config.json"]
    # ...but not its siblings in the same run folder, nor the bundle named through a traversal out and back.
    sneaky = f"{site['run_dir']}/../../{site['run_dir'].parent.name}/{site['run_dir'].name}/train.log"
    assert httpx.get(f"{site['base']}/gradio_api/file={sneaky}", timeout=10).status_code == 403


def test_upload_stays_in_the_data_dir_and_is_capped(site: dict) -> None:
    before = {p for p in site["root"].rglob("*")} - {p for p in site["home"].rglob("*")}
    files = {"files": ("../../../../escape.jsonl", b'{"text": "hi"}\n', "application/octet-stream")}
    r = httpx.post(f"{site['base']}/gradio_api/upload", files=files, timeout=10)
    assert r.status_code == 200, r.text
    (saved,) = r.json()
    assert Path(saved).resolve().is_relative_to(site["home"] / "uploads"), saved
    after = {p for p in site["root"].rglob("*")} - {p for p in site["home"].rglob("*")}
    assert {p.name for p in after - before} <= {site["log"].name}, after - before
    assert not list(Path("/").glob("escape.jsonl"))
    big = {"files": ("big.jsonl", b"x" * (2 * 1024 * 1024), "application/octet-stream")}
    r = httpx.post(f"{site['base']}/gradio_api/upload", files=big, timeout=30)
    assert r.status_code == 413 and "maximum allowed size" in r.text


def test_login_required_when_configured(tmp_path: Path, site: dict) -> None:
    env = {"TUNEDECK_AUTH": "alice:pw-alice-1"}  # (the warning without a login: test_default_bind_...)
    proc, base, log = _start(site["home"], tmp_path, host="0.0.0.0", **env)
    try:
        assert "WARNING" not in log.read_text() and "login required" in log.read_text()
        bundle_url = f"/gradio_api/file={site['bundle']}"
        with httpx.Client(base_url=base, timeout=10) as anon:
            assert anon.get(bundle_url).status_code in (401, 403)
            assert anon.get("/config").status_code in (401, 403)
            assert anon.post("/gradio_api/upload", files={"files": ("a.jsonl", b"{}\n")}).status_code in (401, 403)
            bad = anon.post("/login", data={"username": "alice", "password": "nope"})
            assert bad.status_code >= 400
            assert anon.get(bundle_url).status_code in (401, 403)
        with httpx.Client(base_url=base, timeout=10) as client:
            ok = client.post("/login", data={"username": "alice", "password": "pw-alice-1"})
            assert ok.status_code == 200, ok.text
            assert client.get(bundle_url).status_code == 200
            assert client.get(f"/gradio_api/file={site['home'] / 'tunedeck.db'}").status_code == 403
    finally:
        _stop(proc)


def test_auth_file_with_plain_password_is_refused(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("alice:hunter2\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli.main",
            "serve",
            "--no-worker",
            "--auth-file",
            str(users),
            "--port",
            str(_free_port()),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path / "home"),
        timeout=120,
    )
    assert out.returncode == 2 and "line 1" in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------------- weights and the HF token
def test_pickled_weights_are_refused(tiny_model: Path, tmp_path: Path) -> None:
    """A folder with only pytorch_model.bin is refused at the check, and loading never unpickles it."""
    import shutil

    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import check_model
    from jobs.models.registry import ModelError, ModelSource, ResolvedModel

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_model, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle; unpickling it would raise")
    problems = check_model(str(folder))
    assert any("safetensors" in p.problem for p in problems)
    with pytest.raises(ModelError):
        load_model_and_tokenizer(ResolvedModel(str(folder), str(folder), ModelSource.LOCAL))


@pytest.mark.slow
def test_hf_token_never_stored_logged_or_bundled(
    tiny_model: Path, store, data_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.spec.job import JobSpec
    from jobs.worker.loop import Worker

    monkeypatch.setenv("HF_TOKEN", HF_FAKE)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", HF_FAKE)
    spec = JobSpec(
        model=str(tiny_model),
        dataset="sample:chat-format",
        max_steps=2,
        max_length=64,
        per_device_train_batch_size=2,
        max_train_samples=8,
        lora_r=4,
        lora_alpha=8,
    )
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status.value == "succeeded", (run.error_summary, run.error_detail)
    token = HF_FAKE.encode()
    store.dispose()
    for path in data_home.rglob("*"):
        if path.is_file():
            assert token not in path.read_bytes(), path
            if path.suffix == ".zip":
                with zipfile.ZipFile(path) as zf:
                    for name in zf.namelist():
                        assert token not in zf.read(name), (path, name)
    assert any(p.suffix == ".zip" for p in data_home.rglob("*"))
    assert (store.run_dir(run_id) / "train.log").stat().st_size > 0


def test_no_pickle_loading_in_the_code() -> None:
    """No unpickling anywhere in tunedeck's own code (weights: safetensors; data: Arrow/JSON/CSV)."""
    import re

    pattern = re.compile(
        r"\bpickle\.loads?\(|\btorch\.load\(|\bjoblib\.load\(|\bdill\.load|use_safetensors\s*=\s*False"
    )
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in ("app", "jobs", "storage")
        for p in (ROOT / folder).rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and "weights_only=True" not in line
    ]
    assert hits == []
    assert "use_safetensors" in (ROOT / "jobs" / "models" / "loading.py").read_text()
