"""The Chat tab in real Chromium: a conversation answered by the served worker, both columns, kept over a reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served
from chat_helpers import PROMPT, TAUGHT
from training_helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

ARTIFACTS = REPO / "test-artifacts"
NEW_TOKENS = 16
SECOND = "And what about the sun?"


def _worker_up() -> None:
    """Wait until the served worker's chat service has announced itself in the store (TUNEDECK_HOME's)."""
    from storage.store import Store

    store = Store()
    try:
        wait_for(store.chat_services, timeout=120, what="the served worker's chat service")
    finally:
        store.dispose()


def _columns(page: Any) -> tuple[list[str], list[str]]:
    """The assistant messages shown in the base and the run columns."""
    base, tuned = (
        [m.inner_text().strip() for m in page.locator(f"#{col} [data-testid='bot']").all()]
        for col in ("chat-base", "chat-tuned")
    )
    return base, tuned


def _say(page: Any, text: str, answers: int) -> tuple[list[str], list[str]]:
    """Send `text`; both columns once each holds `answers` answers and the status reads Done."""
    page.locator("#chat-prompt textarea").fill(text)
    page.locator("#chat-send").click()

    def done() -> tuple[list[str], list[str]] | None:
        base, tuned = _columns(page)
        status = page.locator("#chat-status").inner_text().strip()
        assert "failed" not in status, status
        finished = status == "Done."
        return (base, tuned) if finished and len(base) == len(tuned) == answers else None

    return wait_for(done, timeout=600, interval=0.2, what=f"{answers} answers in both columns")


def _open_chat(page: Any, url: str, option: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Chat").click()
    choice = page.locator("#chat-run-choice input")
    # The tab's opening fills the list and picks the newest run: wait for it, or it may undo our pick.
    wait_for(choice.input_value, what="the run list filled")
    choice.click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_for(lambda: choice.input_value() == option, what=f"run {option!r} picked")


def _conversation(url: str, option: str, prompts: list[str], new_tokens: int, shot: str) -> dict[str, Any]:
    """Hold a conversation of `prompts` in the Chat tab, then reload and open the run again: what was shown."""
    with chromium() as browser:
        page = browser.new_page()
        _open_chat(page, url, option)
        page.get_by_label("Max new tokens").fill(str(new_tokens))
        # The tab continues the run's latest session (other tests of the session share these runs): clear it.
        page.locator("#chat-clear").click()
        status = page.locator("#chat-status")
        wait_for(lambda: status.inner_text().strip() == "Cleared.", what="the cleared tab")
        assert _columns(page) == ([], [])
        shown = [_say(page, prompt, i + 1) for i, prompt in enumerate(prompts)]
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.wait_for_timeout(3000)  # both answers are done: the tab's timer has stopped
        idle = list(requests)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
        _open_chat(page, url, option)  # a reload: the history comes back from the store
        page.locator("#chat-tuned [data-testid='bot']").nth(len(prompts) - 1).wait_for(timeout=60_000)
        return {"shown": shown, "idle_requests": idle, "reloaded": _columns(page)}


def _shown(answer: str) -> str:
    """How the tab shows an answer (a blank one as a note, not as an empty bubble)."""
    from app.ui.chat import BLANK

    return answer.strip() or BLANK


@pytest.mark.slow
def test_a_two_turn_conversation_in_both_columns_survives_a_reload(
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
    sampling = Sampling(max_new_tokens=NEW_TOKENS)
    first = {w: pair.answer(w, PROMPT, sampling=sampling) for w in ("base", "run")}
    turns = {
        w: [
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": first[w]},
            {"role": "user", "content": SECOND},
        ]
        for w in first
    }
    second = {w: pair.answer(w, turns[w], sampling=sampling) for w in first}
    store.dispose()
    assert TAUGHT in first["run"] and TAUGHT not in first["base"]
    with served(home) as url:
        _worker_up()
        seen = _conversation(url, f"{run_id} · {run.name} (lora, sft)", [PROMPT, SECOND], NEW_TOKENS, "chat-tab.png")
    (base1, tuned1), (base2, tuned2) = seen["shown"]
    assert base1 == [_shown(first["base"])] and tuned1 == [_shown(first["run"])]
    assert base2 == [_shown(first["base"]), _shown(second["base"])]
    assert tuned2 == [_shown(first["run"]), _shown(second["run"])]
    assert seen["reloaded"] == (base2, tuned2)
    assert seen["idle_requests"] == []  # nothing open: the tab makes no requests


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
        _worker_up()
        option = f"{run_id} · {run.name} ({spec.method.value}, sft)"
        seen = _conversation(url, option, [prompt], 40, "chat-tab-smollm2.png")
    ((base,), (tuned,)) = seen["shown"][0]
    assert tuned.strip().startswith(TAUGHT), tuned
    assert TAUGHT not in base and base.strip(), base
