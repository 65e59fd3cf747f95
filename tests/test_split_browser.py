"""Issue 22's split, in Chromium: a dashboard with no worker, no model files and no GPU, and a separate
worker process. The Chat tab holds a two-turn conversation on both columns and the run page exports a
merged model and a GGUF file and asks for a push (refused by the offline worker, with the reason): the
worker carries them all out, and the dashboard's process never maps a
model's weights (its /proc maps are read while it serves)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
from browser_helpers import CHROMIUM, REPO, chromium, free_port, start_server, stop_server, tunedeck_command
from chat_browser_helpers import conversation, expected_answers, shown
from chat_helpers import PROMPT, TAUGHT
from engines import engine_missing, import_or_missing
from training_helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")

WEIGHTS = (".safetensors", ".bin", ".gguf")
NEW_TOKENS = 16
SECOND = "And what about the sun?"


def _worker(home: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "TUNEDECK_HOME": str(home), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("TUNEDECK_DATABASE_URL", None)
    return subprocess.Popen(
        [*tunedeck_command(), "worker"],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _mapped_weights(pid: int) -> set[str]:
    """Model weight files any process of the dashboard's tree has mapped (or open) now."""
    found: set[str] = set()
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            paths = [m.path for m in proc.memory_maps()] + [f.path for f in proc.open_files()]
        except psutil.Error:
            continue
        found |= {p for p in paths if p.endswith(WEIGHTS)}
    return found


def _export(page: Any, url: str, run_id: int) -> str:
    """Ask the run page's panel for a merged fp32 model and a GGUF f16, wait for both to end, then for a push of
    the bundle (the worker is offline: it refuses); the progress text of each. One after the other, as a person
    would: two clicks in a row may reach the server's queue in either order (seen under load: the push first, and
    its quick refusal no longer followed once the export was asked for)."""
    page.goto(f"{url}/?run={run_id}")
    page.get_by_text("Export: merged model, GGUF, push to the hub").click()
    page.locator("#export-dtype").get_by_text("fp32").click()
    page.locator("#export-gguf").get_by_text("f16").click()
    page.locator("#export-start").click()
    log = page.locator("#export-log textarea")
    ended = "el => {}.every(t => new RegExp(t + ': (done|failed|cancelled)').test(el.value))"
    page.wait_for_function(ended.format("['GGUF f16', 'merged fp32']"), arg=log.element_handle(), timeout=900_000)
    page.locator("#export-files").get_by_text(".gguf").first.wait_for(timeout=30_000)
    exported = log.input_value()
    page.get_by_label("Hub repository (--repo)").fill("alice/tag-adapter")
    page.locator("#push-start").click()
    pushed = "['push bundle to alice/tag-adapter']"
    page.wait_for_function(ended.format(pushed), arg=log.element_handle(), timeout=900_000)
    return exported + "\n" + log.input_value()


@pytest.mark.slow
def test_a_dashboard_without_models_chats_and_exports_through_a_separate_worker(
    tag_home: tuple[Path, dict[str, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.train.artifacts import sha256_of
    from storage.store import Store

    home, ids = tag_home
    run_id = ids["lora"]
    nothing = tmp_path / "no-models"
    nothing.mkdir()
    # The dashboard: no worker of its own, an empty model cache, no GPU.
    dashboard_env = {"TUNEDECK_MODELS_DIR": str(nothing), "CUDA_VISIBLE_DEVICES": ""}
    port = free_port()
    dashboard = start_server(home, port, tmp_path / "dashboard.log", extra_env=dashboard_env, args=["--no-worker"])
    worker = _worker(home, tmp_path / "worker.log")
    url = f"http://127.0.0.1:{port}"
    mapped: set[str] = set()
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    option = f"{run_id} · {store.get_run(run_id).name} (lora, sft)"
    prompts = [PROMPT, SECOND]
    expected = expected_answers(run_id, prompts, NEW_TOKENS)
    try:
        wait_for(store.chat_services, timeout=180, what="the worker's chat service")
        seen = conversation(url, option, prompts, NEW_TOKENS, "chat-tab.png")
        mapped |= _mapped_weights(dashboard.pid)
        with chromium() as browser:
            text = _export(browser.new_page(), url, run_id)
        mapped |= _mapped_weights(dashboard.pid)
        tasks = store.run_tasks(run_id)[:3]
        history = store.chat_history(store.latest_chat(run_id).id)
    finally:
        store.dispose()
        stop_server(worker)
        stop_server(dashboard)
    (base1, tuned1), (base2, tuned2) = seen["shown"]
    assert TAUGHT in expected["run"][0] and TAUGHT not in expected["base"][0], expected
    assert base1 == [shown(expected["base"][0])] and tuned1 == [shown(expected["run"][0])]
    assert base2 == [shown(a) for a in expected["base"]] and tuned2 == [shown(a) for a in expected["run"]]
    assert seen["reloaded"] == (base2, tuned2)  # the history is the store's: a reload shows it again
    assert seen["idle_requests"] == []  # nothing open: the tab makes no requests
    assert "merged fp32: done, checked" in text and "GGUF f16: done, checked" in text, text
    assert "push bundle to alice/tag-adapter: failed: exit code 2" in text and "HF_HUB_OFFLINE" in text, text
    files = [f for task in tasks if task.kind != "push" for f in task.result["files"] if Path(f["path"]).is_file()]
    assert {Path(f["path"]).suffix for f in files} >= {".zip", ".gguf"}, files
    for file in files:  # each file the worker wrote is the one its task recorded
        assert sha256_of(Path(file["path"])) == file["sha256"], file
    # Carried out by the worker process (its id is host:pid); the dashboard mapped no model weights.
    worker_id = f"{socket.gethostname()}:{worker.pid}"
    assert {t.worker_id for t in tasks} == {worker_id}
    assert {m.worker_id for m in history if m.role == "assistant"} == {worker_id}
    assert not mapped, mapped
