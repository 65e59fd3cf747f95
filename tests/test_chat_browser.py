"""The Chat tab in real Chromium on `tunedeck serve` (dashboard and worker in one process tree): the default
SmolLM2 example answers in its taught format. The two-turn conversation on a split deployment is
test_split_browser's."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, served
from chat_browser_helpers import conversation, worker_up
from chat_helpers import TAUGHT
from engines import engine_missing, import_or_missing

pytestmark = [pytest.mark.browser, pytest.mark.integration]
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")


@pytest.mark.smollm2
@pytest.mark.slow
def test_default_smollm2_run_answers_in_the_taught_format(
    smollm2_run: tuple[Path, int], smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default example (examples/smollm2-tag-format.yaml, trained through the worker: conftest
    `smollm2_run`), then the Chat tab."""
    from storage.models import RunStatus
    from storage.store import Store

    home, run_id = smollm2_run
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    run = store.get_run(run_id)
    store.dispose()
    assert run.status is RunStatus.SUCCEEDED, run.error_detail
    prompt = "What is interesting about the moon?"
    with served(home) as url:
        worker_up()
        option = f"{run_id} · {run.name} (lora, sft)"
        seen = conversation(url, option, [prompt], 40, "chat-tab-smollm2.png")
    ((base,), (tuned,)) = seen["shown"][0]
    assert tuned.strip().startswith(TAUGHT), tuned
    assert TAUGHT not in base and base.strip(), base
