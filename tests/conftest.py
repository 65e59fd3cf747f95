"""Shared fixtures: an isolated data directory per test, a store, and a tiny offline model."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Recomputable measurements (the workers' runtime baseline, row token lengths) are shared by the tests of
# one session, as one host's are: each test's fresh TUNEDECK_HOME would otherwise measure them again.
# Tests of the caches themselves point TUNEDECK_CACHE_DIR at a folder of their own.
os.environ.setdefault("TUNEDECK_CACHE_DIR", tempfile.mkdtemp(prefix="tunedeck-test-cache-"))
# Nothing a test does lands in the user's real data folder: the session's default TUNEDECK_HOME is a
# throw-away folder (tests that need a fresh one take `data_home`), and so is the platform's user data
# folder, for the tests of the default itself (storage.settings.user_data_dir).
os.environ["TUNEDECK_HOME"] = tempfile.mkdtemp(prefix="tunedeck-test-home-")
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="tunedeck-test-xdg-data-")

from pathlib import Path

import pytest
from hypothesis import settings

# Property tests are reproducible by default: the "ci" profile derandomizes (the same examples on
# every run and machine) and keeps no example database. `HYPOTHESIS_PROFILE=explore` searches
# afresh with many more examples (see tests/property_settings.py); run it locally, not in CI.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile` (what `./dev.sh test` asks for): whole files, those reading the session's trained runs as one
    unit, costliest first (tests/scheduling.py). Any other mode is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from scheduling import CostliestFirst

    return CostliestFirst(config, log)


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh TUNEDECK_HOME (database, runs, uploads) for one test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    return home


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules that set `BACKENDS = ("sqlite", "postgresql")` run their `store` tests on each."""
    backends = getattr(metafunc.module, "BACKENDS", None)
    if backends and "store" in metafunc.fixturenames:
        if metafunc.definition.get_closest_marker("sqlite_only"):  # a real-run test whose SQL the fast ones cover
            backends = ("sqlite",)
        metafunc.parametrize("backend", backends, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The database the `store` fixture uses: "sqlite" unless the module asks for both."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def postgres_server():
    """A throw-away PostgreSQL server for the session (initdb + pg_ctl); skips without the binaries (fails on CI)."""
    from engines import engine_missing
    from postgres_helpers import PostgresServer, postgres_missing

    why = postgres_missing()
    if why:
        engine_missing(why)
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store(data_home: Path, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A Store on a fresh database; TUNEDECK_DATABASE_URL points at it, so `Store()` and children agree."""
    from storage.store import Store

    server = None
    if backend == "postgresql":
        server = request.getfixturevalue("postgres_server")
        url = server.create_database()
        monkeypatch.setenv("TUNEDECK_DATABASE_URL", url)
    s = Store()
    yield s
    s.dispose()
    if server is not None:
        server.drop_database(url)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama model + byte-level BPE tokenizer with a chat template, built offline once."""
    from jobs.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaVA vision-language model + processor (tokenizer with `<image>`, CLIP image processor, chat template
    over content parts), random weights, built offline once (`jobs.models.tiny_vlm`)."""
    from jobs.models.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "tiny-llava")


@pytest.fixture(scope="session")
def tag_home(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, dict[str, int]]:
    """(a data folder, {method: run id}) trained once per session (`chat_helpers.train_tag_runs`): a LoRA run
    taught the "[tag]" answer format, a prompt-tuning run and a full fine-tune, all finished. The chat and
    export tests read it; each points TUNEDECK_HOME at the folder itself."""
    from chat_helpers import train_tag_runs

    from storage.store import Store

    folder = tmp_path_factory.mktemp("tag-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_HOME", str(folder))
        mp.delenv("TUNEDECK_DATABASE_URL", raising=False)
        store = Store()
        try:
            ids = train_tag_runs(store, tiny_model, ("lora", "prompt_tuning", "full"))
        finally:
            store.dispose()
    return folder, ids


@pytest.fixture(scope="module")
def tag_store(tag_home: tuple[Path, dict[str, int]]):
    """(folder, Store, ids) on the session's tag-format runs, TUNEDECK_HOME pointed at their folder for the module."""
    from storage.store import Store

    folder, ids = tag_home
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_HOME", str(folder))
        mp.delenv("TUNEDECK_DATABASE_URL", raising=False)
        mp.delenv("TUNEDECK_CHAT_DEVICE", raising=False)
        store = Store()
        yield folder, store, ids
        store.dispose()


@pytest.fixture(scope="session")
def smollm2_cache() -> Path:
    """A model cache shared across test sessions, so SmolLM2 is fetched and converted once."""
    override = os.environ.get("TUNEDECK_MODELS_DIR")
    return Path(override or Path.home() / ".cache" / "tunedeck" / "test-models").expanduser()


# The default job the README promises.
SMOLLM2_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "smollm2-tag-format.yaml"


@pytest.fixture(scope="session")
def smollm2_run(tmp_path_factory: pytest.TempPathFactory, smollm2_cache: Path) -> tuple[Path, int]:
    """(a data folder, run id): the default job (`SMOLLM2_EXAMPLE`: SmolLM2-135M-Instruct taught a format, 30
    steps, then scored against its base: its questions and a judge, the evaluate task it queues) submitted and
    carried out by the worker once per session. test_smollm2 checks the run and its scores, test_chat_browser
    talks to it, the GGUF and chat-service tests export it and time its first token. Users point TUNEDECK_HOME
    at the folder and TUNEDECK_MODELS_DIR at `smollm2_cache` themselves."""
    from app.cli.usage import load_spec
    from jobs.queue.submit import submit
    from jobs.worker.loop import Worker
    from jobs.worker.task_service import task_service
    from storage.store import Store

    folder = tmp_path_factory.mktemp("smollm2-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_HOME", str(folder))
        mp.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
        mp.delenv("TUNEDECK_DATABASE_URL", raising=False)
        store = Store()
        try:
            run_id = submit(store, load_spec(str(SMOLLM2_EXAMPLE)))
            # The evaluation too: done here, not left queued for a later test's `tunedeck serve` to pick up.
            Worker(store, poll_interval=0.2, services=[task_service]).work(burst=True)
        finally:
            store.dispose()
    return folder, run_id
