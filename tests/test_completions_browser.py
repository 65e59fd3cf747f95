"""The run page's completions inspector in real Chromium: a GRPO run's stored step, its completions and each
reward's score, and the step slider moving to another stored step. The run and its completion files are seeded
straight into the store and the run's folder (as trl's GRPOTrainer writes them); nothing trains."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, chromium, served
from engines import engine_missing, import_or_missing
from test_completions import write_step
from training_helpers import claim_run

pytestmark = pytest.mark.browser
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")


def test_the_inspector_shows_a_stored_step_s_completions_and_scores(tmp_path: Path, monkeypatch) -> None:
    from jobs.spec.job import JobSpec
    from storage.store import Store

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TUNEDECK_HOME", str(home))  # the run's folder where the server looks for it
    store = Store(f"sqlite:///{home / 'tunedeck.db'}")
    spec = {"trainer": "grpo", "dataset": "sample:prompt-format", "rewards": "repetition", "model": "tiny-llama"}
    run_id = store.create_run(JobSpec.from_dict(spec))
    claim_run(store, run_id, "seed", "1", host="elsewhere")  # trained elsewhere: the dashboard's worker leaves it
    store.mark_succeeded(run_id, {})
    folder = store.run_path(run_id) / "output" / "completions"
    write_step(folder, 2, {"format": [0.25, 0.0]})
    write_step(folder, 6, {"format": [1.0, 0.5]})
    store.dispose()
    with served(home) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/?run={run_id}")
        table = page.locator("#completions-table")
        table.get_by_text("Answer: 4 (step 6)").wait_for(timeout=60_000)  # the last stored step, shown first
        assert "format" in table.inner_text() and "1.000" in table.inner_text() and "0.707" in table.inner_text()
        assert "Step 6" in page.locator("#completions-summary").inner_text()
        box = page.locator("#completions-step input[type=number]")
        box.fill("2")
        box.press("Enter")
        table.get_by_text("Answer: 4 (step 2)").wait_for(timeout=60_000)  # the slider moved to the other step
        assert "0.250" in table.inner_text() and "Step 2" in page.locator("#completions-summary").inner_text()
        page.close()
