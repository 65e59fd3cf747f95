"""The dashboard in real Chromium, as a user: launch, watch, reload, download, bad form; plus gradio_client.

Starts `tunedeck serve` (dashboard + worker) on a free port with a temporary TUNEDECK_HOME and
drives Debian's Chromium through the playwright package (never `playwright install`).
Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served
from engines import engine_missing, import_or_missing

from jobs.spec.stored import spec_of

pytestmark = pytest.mark.browser
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
playwright_api = import_or_missing("playwright.sync_api")

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("tunedeck-home")
    with served(home) as url:
        yield url, home


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _store(home: Path):

    from storage.store import Store

    return Store(f"sqlite:///{home / 'tunedeck.db'}")


def _set(page, name: str, value: str) -> None:
    from jobs.spec.field_info import field_infos

    label = next(f.title for f in field_infos() if f.name == name)  # "Model (model)"
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Tab")


def _status(page) -> str:
    loc = page.locator("#run-status")
    return loc.inner_text() if loc.count() else ""


def test_launch_watch_reload_download(server, browser):
    url, home = server
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    outside: list[str] = []
    page.on(
        "request",
        lambda r: outside.append(r.url) if not r.url.startswith(("http://127.0.0.1", "data:", "blob:")) else None,
    )
    page.goto(url)
    page.get_by_text("Detected format").wait_for(timeout=120_000)  # a cold server's first load
    _set(page, "model", "tiny-llama")
    _set(page, "max_steps", "40")
    _set(page, "max_length", "64")
    _set(page, "per_device_train_batch_size", "2")
    page.screenshot(path=str(ARTIFACTS / "launch-page.png"), full_page=True)
    page.click("#launch-btn")
    page.wait_for_url("**/?run=*", timeout=120_000)
    run_id = int(page.url.split("run=")[1])
    seen: list[str] = []
    deadline = time.time() + 300
    reloaded = False
    while time.time() < deadline:
        status = _status(page)
        if status and (not seen or seen[-1] != status):
            seen.append(status)
        step = (
            int(page.locator("#run-progress").get_attribute("data-step") or 0)
            if page.locator("#run-progress").count()
            else 0
        )
        if status == "running" and step >= 3 and not reloaded:
            page.reload()
            page.locator("#run-progress").wait_for(timeout=30_000)
            assert page.get_by_label("run id", exact=True).input_value() == str(run_id)
            # The reloaded page follows the run again: its step moves on (or the run finishes).
            page.wait_for_function(
                """(step) => Number(document.querySelector('#run-progress')?.dataset.step || 0) > step
                    || (document.querySelector('#run-status')?.innerText || '').includes('succeeded')""",
                arg=step,
                timeout=120_000,
            )
            reloaded = True
        if status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    assert seen[-1] == "succeeded", (seen, _status(page))
    assert "running" in seen and reloaded
    store = _store(home)
    assert spec_of(store.get_run(run_id)).max_steps == 40
    assert store.metric_extent(run_id, "loss") is not None and store.memory_extent(run_id) is not None
    # What the graphs drew for a real run (tests/chart_scene.py): lines with their data, honest legends.
    from chart_scene import wait_scene

    from jobs.devices import probe

    losses = [p.value for p in store.metrics(run_id, ["loss"])]
    loss = wait_scene(page, "run-loss-plot", lambda s: s.drawn_lines().get("train", 0) >= min(len(losses), 2))
    assert loss.axis("Y").covers(min(losses), max(losses)), loss.describe()
    assert set(loss.legend) <= {"train", "eval"} and "train" in loss.legend, loss.describe()
    assert set(loss.drawn_lines()) == set(loss.legend), loss.describe()  # a final eval loss alone draws too
    device = {"GPU used (NVML)", "torch allocated", "torch reserved"} if probe.has_cuda() else {"host RSS"}
    device |= {"predicted peak"}  # the prediction saved at submit, drawn flat across the run (jobs.memory.predict)
    memory = wait_scene(page, "run-memory-plot", lambda s: set(s.drawn_lines()) == device)
    assert sorted(memory.legend) == sorted(device) and not memory.legend_clipped, memory.describe()
    page.screenshot(path=str(ARTIFACTS / "run-page-finished.png"), full_page=True)
    with page.expect_download() as info:
        page.click("#download-adapter")
    data = Path(info.value.path()).read_bytes()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert any(n.endswith("adapter_config.json") for n in names), names
    assert not outside, outside


def test_bad_form_shows_every_problem_and_queues_nothing(server, browser, tmp_path):
    url, home = server
    before = len(_store(home).list_runs())
    bad = tmp_path / "broken.jsonl"
    bad.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
        '{"messages": [{"role": "user", "content": "hi"\n'
    )
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(url)
    page.get_by_text("Detected format").wait_for(timeout=120_000)  # a cold server's first load
    page.locator("input[type=file]").first.set_input_files(str(bad))
    # The upload is saved under a content-addressed name ("broken-<digest>.jsonl") and picked as the dataset.
    page.wait_for_function(
        "() => [...document.querySelectorAll('input')].some(i => i.value.includes('broken-'))", timeout=60_000
    )
    _set(page, "learning_rate", "0")
    page.click("#launch-btn")
    errors = page.locator("#form-errors")
    errors.get_by_text("learning_rate").wait_for(timeout=60_000)
    text = errors.inner_text()
    assert "nothing was queued" in text and "dataset" in text and "row" in text.lower(), text
    assert len(_store(home).list_runs()) == before


def test_gradio_client_launches_a_run(server):
    from gradio_client import Client

    from jobs.spec.job import JobSpec

    url, home = server
    client = Client(url, analytics_enabled=False, verbose=False)
    spec = JobSpec(model="tiny-llama", max_steps=3, run_name="api-run").to_yaml()
    out = client.predict(spec_yaml=spec, api_name="/submit")  # the form's own /launch is private now
    assert out["problems"] == [] and out["run_id"]
    assert spec_of(_store(home).get_run(int(out["run_id"]))).run_name == "api-run"


def _finished_run_row(home: Path, name: str) -> int:
    """A succeeded run written straight into the database (the worker never sees it queued)."""
    import sqlite3

    from jobs.spec.job import JobSpec

    _store(home).dispose()  # makes sure the schema exists
    with sqlite3.connect(home / "tunedeck.db") as con:
        cur = con.execute(
            "INSERT INTO runs (name, spec_json, status, created_at, finished_at, queue_order, "
            "cancel_requested, current_step) VALUES (?, ?, 'succeeded', 1.0, 2.0, 1.0, 0, 5)",
            (name, JobSpec(run_name=name).to_json()),
        )
        run_id = cur.lastrowid
    con.close()
    from storage.store import MemoryPoint, MetricPoint

    store = _store(home)
    store.add_metrics(run_id, [MetricPoint(s, "loss", 3.0 - s / 10, 1.0 + s) for s in range(1, 6)])
    store.add_memory_samples([MemoryPoint(1.0 + t, "host", run_id, process_rss=2**28) for t in range(5)])
    (store.run_dir(run_id) / "train.log").write_bytes(b"x" * 300_000)
    store.dispose()
    return run_id


def test_delete_asks_first_then_removes_the_run_and_only_it(server, browser, monkeypatch):
    url, home = server
    monkeypatch.setenv("TUNEDECK_HOME", str(home))  # the run folders this test's store sees are the server's
    keep, doomed = _finished_run_row(home, "keep-me"), _finished_run_row(home, "delete-me")
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(f"{url}/?run={doomed}")
    page.get_by_text("delete-me").first.wait_for(timeout=30_000)
    page.fill("#run-tags textarea, #run-tags input", "old, paper")
    page.click("#save-notes")
    page.locator("#manage-message").get_by_text("Saved").wait_for(timeout=30_000)
    assert _store(home).get_run(doomed).tags == ("old", "paper")
    page.get_by_role("tab", name="Runs").click()
    page.fill("#runs-search textarea, #runs-search input", "PAPER")  # a tag, in other case
    table = page.locator("#runs-table")
    page.wait_for_function(
        "() => { const t = document.querySelector('#runs-table').innerText;"
        " return t.includes('old, paper') && !t.includes('keep-me'); }",
        timeout=30_000,
    )
    assert "KiB" in table.inner_text() and "on disk" in page.locator("#runs-disk-total").inner_text()
    page.screenshot(path=str(ARTIFACTS / "runs-search-tags-disk.png"), full_page=True)
    page.get_by_role("tab", name="Run", exact=True).click()
    page.click("#delete-run")
    question = page.locator("#delete-question")
    question.get_by_text("delete-me").wait_for(timeout=30_000)
    assert "This cannot be undone" in question.inner_text() and "KiB" in question.inner_text()
    page.screenshot(path=str(ARTIFACTS / "run-delete-confirmation.png"), full_page=True)
    page.click("#delete-keep")
    question.wait_for(state="hidden", timeout=30_000)
    assert _store(home).get_run(doomed) is not None  # "No, keep it" keeps it
    page.click("#delete-run")
    page.locator("#delete-confirm").wait_for(timeout=30_000)
    page.click("#delete-confirm")
    page.locator("#manage-message").get_by_text(f"Deleted run {doomed}").wait_for(timeout=30_000)
    store = _store(home)
    assert store.get_run(doomed) is None and not store.run_path(doomed).exists()
    assert store.get_run(keep) is not None and (store.run_path(keep) / "train.log").exists()
