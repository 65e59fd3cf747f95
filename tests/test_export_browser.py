"""The Export panel in real Chromium: `tunedeck serve` (dashboard + its worker process) on the session's tag runs; the
panel asks, the worker exports, the progress and the checked files come back into the page."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served

pytestmark = [pytest.mark.browser, pytest.mark.integration]
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

ARTIFACTS = REPO / "test-artifacts"


@pytest.mark.slow
def test_the_export_panel_has_the_worker_export_and_lists_the_checked_file(
    tag_home: tuple[Path, dict[str, int]],
) -> None:
    home, ids = tag_home
    run_id = ids["lora"]
    with served(home) as url, chromium() as browser:
        page = browser.new_page()
        page.goto(f"{url}/?run={run_id}")
        page.get_by_text("Export: merged model and GGUF").click()
        page.locator("#export-dtype").get_by_text("fp32").click()
        log = page.locator("#export-log textarea")
        deadline = time.monotonic() + 120
        while True:  # the served worker announces itself a few seconds after the dashboard is up
            page.locator("#export-start").click()
            page.wait_for_function("el => el.value.length > 0", arg=log.element_handle(), timeout=30_000)
            if "no worker is running" not in log.input_value() or time.monotonic() > deadline:
                break
            time.sleep(1)
        page.wait_for_function(
            "el => /merged fp32: (done|failed|cancelled)/.test(el.value)", arg=log.element_handle(), timeout=600_000
        )
        text = log.input_value()
        files = page.locator("#export-files")
        files.get_by_text(".zip").first.wait_for(timeout=30_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "export-panel.png"), full_page=True)
    assert "merged fp32: done, checked" in text, text
    assert f"$ tunedeck export {run_id} --merged --dtype fp32" in text and "greedy answers equal: passed" in text
    assert "sha256" in text
