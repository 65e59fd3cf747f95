"""The launch form's data panels in real Chromium (issue 43): on the default example (the form at its defaults:
SmolLM2 on the bundled chat sample) the token panel highlights exactly the tokens the trainer trains on, a row
picked by number shows alone, and the audit panel draws the histogram and finds nothing.

Starts `tunedeck serve --no-worker` with a temporary TUNEDECK_HOME and the shared model cache (tests/conftest.py's
`smollm2_cache`, where SmolLM2's tokenizer is converted once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, chromium, free_port, start_server, stop_server
from engines import engine_missing, import_or_missing

pytestmark = pytest.mark.browser
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")


@pytest.fixture(scope="module")
def models(smollm2_cache: Path) -> Path:
    """The model cache with SmolLM2 converted (its tokenizer is what the default form shows)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
        from jobs.models.embedded import ensure_smollm2

        ensure_smollm2()
    return smollm2_cache


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models: Path):
    home = tmp_path_factory.mktemp("tunedeck-home")
    port = free_port()
    proc = start_server(home, port, home / "server.log", extra_env={"TUNEDECK_MODELS_DIR": str(models)},
                        args=["--no-worker"])  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


def expected_rows(models: Path, monkeypatch: pytest.MonkeyPatch, row: int = 0) -> list[dict]:
    """The token view of the form's default spec, computed here as the API computes it."""
    from jobs.checks.shown_data import tokens_record
    from jobs.spec.job import JobSpec

    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(models))
    return tokens_record(JobSpec(), [row] if row else ())["rows"]


def open_panels(page) -> None:
    """Open the panels' accordion: a click the page takes while it settles after its first fill is lost, so
    click its toggle until the accordion says it is open (its `open` class)."""
    toggle = page.locator("#data-panels > button.label-wrap")
    for _ in range(20):
        if "open" in (toggle.get_attribute("class") or "").split():
            break
        toggle.click()
        try:
            page.locator("#data-panels > button.label-wrap.open").wait_for(timeout=3_000)
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: the click was lost, click again
            continue
    page.locator("#tokens-btn").wait_for(state="visible", timeout=30_000)


def test_the_default_example_s_trained_tokens_are_highlighted(server: str, models: Path, monkeypatch) -> None:
    expected = expected_rows(models, monkeypatch)
    assert expected and all(r["trained"] for r in expected)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server)
        page.get_by_text("Detected format").wait_for(timeout=120_000)  # the form's first fill is done
        open_panels(page)
        page.locator("#tokens-btn").click()
        page.locator("#token-view .tok-row").nth(len(expected) - 1).wait_for(timeout=120_000)
        rows = page.locator("#token-view .tok-row")
        assert rows.count() == len(expected)
        for k, want in enumerate(expected):
            trained = rows.nth(k).locator(".tok-trained")
            assert trained.count() == want["trained"] == sum(t["trained"] for t in want["sequences"][0]["tokens"])
            masked = sum(not t["trained"] and not t["cut"] for t in want["sequences"][0]["tokens"])
            assert rows.nth(k).locator(".tok-masked").count() == masked  # all of a chat row trains by default
            assert rows.nth(k).locator(".tok-trained.tok-special").count() >= 1  # the end of turn is trained
        assert page.locator("#token-view .trained-count").first.inner_text() == str(expected[0]["trained"])

        second = expected_rows(models, monkeypatch, row=5)
        page.locator("#token-row input").fill("5")
        page.locator("#tokens-btn").click()
        page.locator("#token-view .tok-head", has_text="row 5 of").wait_for(timeout=120_000)
        assert page.locator("#token-view .tok-row").count() == 1
        assert page.locator("#token-view .tok-trained").count() == second[0]["trained"]

        page.locator("#audit-btn").click()
        page.locator("#audit-view").wait_for(timeout=120_000)
        assert page.locator("#audit-view .audit-none").inner_text() == "No finding."
        assert page.locator("#audit-view .audit-bar").count() >= 1
        page.close()
