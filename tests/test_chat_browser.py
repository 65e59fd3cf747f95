"""The Chat tab in real Chromium: a finished run answers in its taught format, its base model does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served
from chat_helpers import PROMPT, TAUGHT

pytestmark = [pytest.mark.browser, pytest.mark.integration]
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

ARTIFACTS = REPO / "test-artifacts"
NEW_TOKENS = 16


def _ask_in_browser(url: str, option: str, prompt: str, new_tokens: int, shot: str) -> tuple[str, str, str]:
    """Open the Chat tab, pick `option`, ask `prompt`; (status, base column, run column) once done."""
    with chromium() as browser:
        page = browser.new_page()
        page.goto(url)
        page.get_by_role("tab", name="Chat").click()
        page.locator("#chat-run-choice input").click()
        page.get_by_role("option", name=option, exact=True).click()
        page.get_by_label("Max new tokens").fill(str(new_tokens))
        page.locator("#chat-prompt textarea").fill(prompt)
        page.locator("#chat-ask").click()
        page.locator("#chat-status").get_by_text("Done").wait_for(timeout=600_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
        return (
            page.locator("#chat-status").inner_text(),
            page.locator("#chat-base textarea").input_value(),
            page.locator("#chat-tuned textarea").input_value(),
        )


@pytest.mark.slow
def test_chat_tab_shows_the_run_and_its_base_side_by_side(
    tag_home: tuple[Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.chat.generate import Sampling, load, locate
    from storage.store import Store

    home, ids = tag_home  # the session's tag-format runs (conftest)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    run_id = ids["lora"]
    run = store.get_run(run_id)
    pair = load(locate(store, run_id), "cpu")
    expected = {w: pair.answer(w, PROMPT, sampling=Sampling(max_new_tokens=NEW_TOKENS)) for w in ("base", "run")}
    store.dispose()
    assert TAUGHT in expected["run"] and TAUGHT not in expected["base"]
    with served(home) as url:
        status, base, tuned = _ask_in_browser(
            url, f"{run_id} · {run.name} (lora, sft)", PROMPT, NEW_TOKENS, "chat-tab.png"
        )
    assert "greedy" in status
    assert tuned == expected["run"] and TAUGHT in tuned
    assert base == expected["base"] and TAUGHT not in base


@pytest.mark.smollm2
@pytest.mark.slow
def test_default_smollm2_run_answers_in_the_taught_format(
    tmp_path: Path, smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default example (examples/smollm2-tag-format.yaml) through the worker, then the Chat tab."""
    from app.cli.usage import load_spec
    from jobs.worker.loop import Worker
    from storage.models import RunStatus
    from storage.store import Store

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    spec = load_spec(str(REPO / "examples" / "smollm2-tag-format.yaml"))
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_detail
    store.dispose()
    prompt = "What is interesting about the moon?"
    with served(home) as url:
        status, base, tuned = _ask_in_browser(
            url, f"{run_id} · {run.name} ({spec.method.value}, sft)", prompt, 40, "chat-tab-smollm2.png"
        )
    assert tuned.strip().startswith(TAUGHT), tuned
    assert TAUGHT not in base and base.strip(), base
