"""The training doctor in real Chromium: a run with a finding shows its banner, and "Clone with fix" opens the
Launch form with the finding's spec change applied; launching it queues a run whose spec carries the change.

The dashboard runs without a worker (`tunedeck serve --no-worker`): the launched run stays queued, to be read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, free_port, start_server, stop_server
from engines import engine_missing, import_or_missing

pytestmark = pytest.mark.browser
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")

ARTIFACTS = REPO / "test-artifacts"


def _spiked_run(home: Path) -> tuple[int, float]:
    """A finished run whose loss spiked at step 40, its finding stored by the worker's doctor; (id, its lr)."""
    from test_doctor_watch import losses

    from jobs.doctor.watch import Doctor
    from jobs.spec.job import JobSpec
    from storage.store import Store

    store = Store(f"sqlite:///{home / 'tunedeck.db'}")
    spec = JobSpec(run_name="spiky", model="tiny-llama", max_steps=60, max_length=64, per_device_train_batch_size=2)
    run_id = store.create_run(spec)
    claimed = store.claim_next_on_device("test", "0")
    assert claimed is not None and claimed.id == run_id
    store.add_metrics(run_id, losses(1, 60, spike_at=40))
    (found,) = Doctor(store, run_id, spec, interval_s=0.0).check()
    assert found.spec_change["learning_rate"] == spec.learning_rate / 2
    store.mark_succeeded(run_id, {})
    store.dispose()
    return run_id, spec.learning_rate


@pytest.mark.browser
def test_clone_with_fix_opens_the_form_with_the_change_and_the_queued_run_carries_it(tmp_path: Path) -> None:
    from jobs.spec.field_info import field_infos
    from jobs.spec.stored import spec_of
    from storage.store import Store

    home = tmp_path / "home"
    home.mkdir()
    run_id, lr = _spiked_run(home)
    port = free_port()
    server = start_server(home, port, home / "server.log", args=["--no-worker"])
    try:
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(f"http://127.0.0.1:{port}/?run={run_id}")
            banner = page.locator("#run-findings-banner")
            banner.wait_for(timeout=120_000)
            assert "Training doctor: 1 finding" in banner.inner_text()
            assert "loss_spike" in page.locator("#run-findings li").first.inner_text()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "run-doctor-finding.png"), full_page=True)
            page.click("#clone-with-fix")
            title = next(f.title for f in field_infos() if f.name == "learning_rate")
            box = page.get_by_label(title, exact=True)
            page.wait_for_function(
                "([label, want]) => [...document.querySelectorAll('input')].some("
                "i => i.getAttribute('aria-label') === label && Number(i.value) === want)",
                arg=[title, lr / 2],
                timeout=60_000,
            )
            assert float(box.input_value()) == pytest.approx(lr / 2)
            page.click("#launch-btn")
            # the new run's page: its id in the address, no longer the cloned run's
            page.wait_for_url(lambda u: "run=" in u and not u.endswith(f"run={run_id}"), timeout=120_000)
    finally:
        stop_server(server)
    store = Store(f"sqlite:///{home / 'tunedeck.db'}")
    queued = [r for r in store.list_runs(limit=10) if r.id != run_id]
    assert len(queued) == 1 and queued[0].status.value == "queued"
    assert spec_of(queued[0]).learning_rate == pytest.approx(lr / 2) and spec_of(queued[0]).max_grad_norm == 1.0
    assert spec_of(queued[0]).max_steps == 60  # the rest as the run was
    store.dispose()
