"""The Chat tab driven in Chromium: pick a run, hold a conversation, read both columns (test_chat_browser,
test_split_browser)."""

from __future__ import annotations

from typing import Any

from browser_helpers import REPO, chromium
from training_helpers import wait_for

ARTIFACTS = REPO / "test-artifacts"


def worker_up() -> None:
    """Wait until the served worker's chat service has announced itself in the store (TUNEDECK_HOME's)."""
    from storage.store import Store

    store = Store()
    try:
        wait_for(store.chat_services, timeout=120, what="the served worker's chat service")
    finally:
        store.dispose()


def columns(page: Any) -> tuple[list[str], list[str]]:
    """The assistant messages shown in the base and the run columns."""
    base, tuned = (
        [m.inner_text().strip() for m in page.locator(f"#{col} [data-testid='bot']").all()]
        for col in ("chat-base", "chat-tuned")
    )
    return base, tuned


def say(page: Any, text: str, answers: int) -> tuple[list[str], list[str]]:
    """Send `text`; both columns once each holds `answers` answers and the status reads Done."""
    page.locator("#chat-prompt textarea").fill(text)
    page.locator("#chat-send").click()

    readings: list[tuple[list[str], list[str]]] = []

    def done() -> tuple[list[str], list[str]] | None:
        base, tuned = columns(page)
        status = page.locator("#chat-status").inner_text().strip()
        assert "failed" not in status, status
        finished = status == "Done."
        # The status line can be drawn before the columns: an answer can still show "" or "…" (an open reply's
        # mark), or the part of it streamed so far (seen under load: "a" for "assistant\n[tag] Over."). So the
        # columns count once five readings in a row after "Done." (about a second) are the same.
        drawn = all(answer.strip() not in ("", "…") for answer in base + tuned)
        if not (finished and drawn and len(base) == len(tuned) == answers):
            readings.clear()
            return None
        readings.append((base, tuned))
        settled = len(readings) >= 5 and all(r == readings[-1] for r in readings[-5:])
        return (base, tuned) if settled else None

    return wait_for(done, timeout=600, interval=0.25, what=f"{answers} answers in both columns")


def open_chat(page: Any, url: str, option: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Chat").click()
    choice = page.locator("#chat-run-choice input")
    # The tab's opening fills the list and picks the newest run: wait for it, or it may undo our pick.
    wait_for(choice.input_value, what="the run list filled")
    choice.click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_for(lambda: choice.input_value() == option, what=f"run {option!r} picked")


def conversation(url: str, option: str, prompts: list[str], new_tokens: int, shot: str) -> dict[str, Any]:
    """Hold a conversation of `prompts` in the Chat tab, then reload and open the run again: what was shown."""
    with chromium() as browser:
        page = browser.new_page()
        open_chat(page, url, option)
        # The tab continues the run's latest session (other tests of the session share these runs): clear it.
        page.locator("#chat-clear").click()
        status = page.locator("#chat-status")
        try:
            cleared = ("Cleared.", "Nothing to clear yet.")  # a run with or without a session of the test session's
            wait_for(lambda: status.inner_text().strip() in cleared, what="the cleared tab")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the tab's status reads {status.inner_text().strip()!r}") from None
        assert columns(page) == ([], [])
        # After the Clear has answered: the pick's load of the session's settings (queued before it) has landed
        # and cannot overwrite this.
        page.get_by_label("Max new tokens").fill(str(new_tokens))
        shown = [say(page, prompt, i + 1) for i, prompt in enumerate(prompts)]
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.wait_for_timeout(3000)  # both answers are done: the tab's timer has stopped
        idle = list(requests)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
        open_chat(page, url, option)  # a reload: the history comes back from the store
        page.locator("#chat-tuned [data-testid='bot']").nth(len(prompts) - 1).wait_for(timeout=60_000)
        return {"shown": shown, "idle_requests": idle, "reloaded": columns(page)}


def shown(answer: str) -> str:
    """How the tab shows an answer (a blank one as a note, not as an empty bubble)."""
    from app.ui.chat import BLANK

    return answer.strip() or BLANK


def expected_answers(run_id: int, prompts: list[str], new_tokens: int) -> dict[str, list[str]]:
    """What each side answers to `prompts` as one conversation, generated here (the store is TUNEDECK_HOME's)."""
    from jobs.chat.generate import Sampling, load, locate
    from storage.store import Store

    store = Store()
    try:
        pair = load(locate(store, run_id), "cpu")
    finally:
        store.dispose()
    sampling = Sampling(max_new_tokens=new_tokens)
    answers: dict[str, list[str]] = {}
    for side in ("base", "run"):
        turns: list[dict[str, str]] = []
        for prompt in prompts:
            turns.append({"role": "user", "content": prompt})
            asked: Any = prompt if len(turns) == 1 else list(turns)  # a first turn as the CLI asks it
            answer = pair.answer(side, asked, sampling=sampling)
            turns.append({"role": "assistant", "content": answer})
            answers.setdefault(side, []).append(answer)
    return answers
