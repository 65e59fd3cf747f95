"""The Search tab in real Chromium (issue 47): a finished search's trials, its best and the importance plot.

The search is real (the store, Optuna's study in it, the driver's turns with the memory check); its runs'
metrics and ends are written as a worker and its training child write them, so the page has four finished
trials without training (tests/test_search_run.py trains a search for real). Then `tunedeck serve` shows it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served
from chart_scene import wait_scene
from engines import engine_missing, import_or_missing

from jobs.search.driver import advance, start_search
from jobs.search.plan import SearchPlan
from storage.records import MetricPoint
from storage.store import Store
from tests.training_helpers import claim_run, tiny_spec

pytestmark = pytest.mark.browser
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")

ARTIFACTS = REPO / "test-artifacts"
LOSSES = {0: [3.0, 2.5], 1: [2.8, 2.0], 2: [2.9, 2.6], 3: [2.7, 1.7]}  # trial 3 is the best


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    home = tmp_path_factory.mktemp("search-browser-home")
    saved = os.environ.get("TUNEDECK_HOME")
    os.environ["TUNEDECK_HOME"] = str(home)  # the driver saves each run's prediction in its run folder
    try:
        store = Store(f"sqlite:///{home / 'tunedeck.db'}")
        base = tiny_spec(tiny_model, max_steps=4, eval_split=0.25, eval_steps=2)
        plan = SearchPlan.build(
            base, ["learning_rate=loguniform(1e-4,1e-2)", "lora_r=[8,16]"], trials=4, parallel=4, sampler="random"
        )
        search = start_search(store, plan)
        studies: dict[int, Any] = {}
        advance(store, search.id, studies)
        for trial in store.search_trials(search.id):
            claim_run(store, trial.run_id, "here:1", "cpu")
            points = [MetricPoint(2 * (i + 1), "eval_loss", v, 0.0) for i, v in enumerate(LOSSES[trial.number])]
            store.add_metrics(trial.run_id, points)
            store.mark_succeeded(trial.run_id, {"eval_loss": LOSSES[trial.number][-1]})
            store.release_device("cpu", "here:1", run_id=trial.run_id)
        assert not advance(store, search.id, studies)
        assert store.get_search(search.id).state == "finished"
    finally:
        if saved is None:
            os.environ.pop("TUNEDECK_HOME", None)
        else:
            os.environ["TUNEDECK_HOME"] = saved
    return home


def test_the_search_page_shows_trials_best_and_importance(home: Path) -> None:
    with served(home) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.goto(url)
        page.get_by_role("tab", name="Search").click()
        page.wait_for_function(
            "() => (document.querySelector('#search-summary') || {innerText: ''}).innerText.includes('Best so far: trial 3')",
            timeout=60_000,
        )
        page.wait_for_function(
            "() => document.querySelector('#search-trials').innerText.split('complete').length - 1 === 4",
            timeout=30_000,
        )
        table = page.locator("#search-trials").inner_text()
        assert "learning_rate=" in table and "lora_r=" in table, table
        # The data is drawn first, its colour map and legend a step later (charts.redraw_after): wait for both.
        names = {"learning_rate", "lora_r"}
        imp = wait_scene(
            page, "search-importance", lambda s: len(s.lines_by_series()) == 2 and set(s.legend) == names, timeout=60
        )
        assert set(imp.legend) == names, imp.describe()
        par = wait_scene(page, "search-parallel", lambda s: len(s.drawn_lines()) == 4, timeout=60)
        assert all(n == 3 for n in par.drawn_lines().values()), par.describe()  # lr, rank, eval_loss
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator("#search-summary").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "search-page.png"), full_page=True)
        page.get_by_role("button", name="Launch the best settings in full").click()
        page.wait_for_function(
            "() => document.querySelector('#search-launched').innerText.includes('Queued run')", timeout=120_000
        )
