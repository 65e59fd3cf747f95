"""Preference data made in the Chat tab (`jobs.data.preferences`, `app.ui.chat_preferences`, `tunedeck pairs`).

Fast: a session's last turn becomes a DPO pair (the conversation so far as the run's column shows it) or a KTO row,
in files the data checks read as dpo / kto data; what cannot make a row is refused with the fix. Browser: three
picks in the Chat tab of a served dashboard become a set that a DPO run then trains on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served
from chat_browser_helpers import open_chat, say, worker_up
from training_helpers import tiny_spec, wait_for

from app.ui.chat import BLANK
from app.ui.chat_preferences import last_turn, pick
from jobs.data import preferences
from jobs.data.preferences import Turn
from jobs.errors import ProblemError

# The browser test's messages, in order; it needs three pairs and asks again while a sampled turn cannot make one.
TEMPERATURE = 0.1  # the browser test's sampling (see there)
PROMPTS = ("Tell me about the moon.", "And the sea?", "And the sky?", "And the stars?", "And the wind?", "And rain?")


def _answered(store: Any, run_id: int, prompt: str, base: str, run: str, system: str = "") -> int:
    """A chat turn of `run_id` answered by both sides, as a worker would have answered it."""
    session = store.latest_chat(run_id)
    sid = session.id if session is not None else store.create_chat(run_id, system, {})
    store.add_chat_turn(sid, prompt)
    for reply in store.pending_chat_replies():
        if reply.session_id == sid:
            assert store.claim_chat_reply(reply.id, "w1")
            assert store.finish_chat_reply(reply.id, "w1", base if reply.side == "base" else run)
    return sid


@pytest.fixture
def chat_run(store: Any, tiny_model: Path) -> int:
    run_id = store.create_run(tiny_spec(tiny_model, run_name="prefs"))
    assert store.claim_next_on_device("w1", "0").id == run_id
    store.mark_succeeded(run_id, {})
    return run_id


def test_a_pick_is_a_pair_on_the_conversation_as_the_runs_column_shows_it(store: Any, chat_run: int) -> None:
    _answered(store, chat_run, "Hi", "base hello", "[tag] hello", system="Be brief.")
    _answered(store, chat_run, "And the moon?", "base moon", "[tag] moon")
    turns, base, run = last_turn(store, chat_run)
    assert [(t.role, t.content) for t in turns] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "[tag] hello"),  # the run's earlier answer, never the base's
        ("user", "And the moon?"),
    ]
    assert (base, run) == ("base moon", "[tag] moon")
    line, shown = pick(store, chat_run, "my-set", "run")
    assert "holds 1 pair" in line and shown == str(preferences.path_of("my-set", "dpo"))
    row = json.loads(Path(shown).read_text())
    assert row["chosen"] == [{"role": "assistant", "content": "[tag] moon"}]
    assert row["rejected"] == [{"role": "assistant", "content": "base moon"}]
    assert row["prompt"][-1] == {"role": "user", "content": "And the moon?"}
    assert "holds 2 pairs" in pick(store, chat_run, "my-set", "base")[0]
    second = json.loads(Path(shown).read_text().splitlines()[1])
    assert second["chosen"][0]["content"] == "base moon" and second["rejected"][0]["content"] == "[tag] moon"
    assert "holds 1 judged answer" in pick(store, chat_run, "my-set", "down")[0]
    kto = json.loads(preferences.path_of("my-set", "kto").read_text())
    assert kto["label"] is False and kto["completion"][0]["content"] == "[tag] moon"
    (found,) = preferences.sets()
    assert (found.name, found.pairs, found.judged) == ("my-set", 2, 1)


def test_the_files_are_dpo_and_kto_data_as_the_checks_read_them(store: Any, chat_run: int, tiny_model: Path) -> None:
    from jobs.checks.pipeline import check

    for i in range(3):
        _answered(store, chat_run, f"Question {i}?", f"base answer {i}", f"[tag] answer {i}")
        assert "Saved" in pick(store, chat_run, "checked", "run")[0]
        pick(store, chat_run, "checked", "up" if i % 2 else "down")
    for trainer, kind in (("dpo", "dpo"), ("kto", "kto")):
        spec = tiny_spec(tiny_model, trainer=trainer, dataset=str(preferences.path_of("checked", kind)))
        problems = [p for p in check(spec, store=store).problems if p.field.startswith("dataset")]
        assert problems == [], problems
    from app.ui.data import dataset_choices

    assert {str(preferences.path_of("checked", k)) for k in ("dpo", "kto")} <= set(dataset_choices())


def test_what_cannot_make_a_row_is_refused_with_the_fix(store: Any, chat_run: int) -> None:
    line, shown = pick(store, chat_run, "set", "run")
    assert "send a message first" in line and shown is not preferences.path_of("set", "dpo")
    _answered(store, chat_run, "Empty?", "base text", " ")  # the data checks refuse a row with an empty turn
    assert "**chosen**: the answer is empty" in pick(store, chat_run, "set", "run")[0]
    assert "**rejected**: the answer is empty" in pick(store, chat_run, "set", "base")[0]
    _answered(store, chat_run, "Same?", "same text", "same text")
    assert "both answers are the same text" in pick(store, chat_run, "set", "run")[0]
    assert "is not a data set name" in pick(store, chat_run, "../etc", "run")[0]
    sid = store.latest_chat(chat_run).id
    store.add_chat_turn(sid, "Still thinking?")  # replies pending
    assert "has not finished" in pick(store, chat_run, "set", "up")[0]
    with pytest.raises(ProblemError, match="image"):
        preferences.add_pair("set", [Turn("user", "look", image=True)], "a", "b")
    assert preferences.sets() == []  # nothing written by any of them


def test_tunedeck_pairs_lists_and_exports_the_sets(store: Any, chat_run: int, tmp_path: Path, data_home: Path) -> None:
    _answered(store, chat_run, "Hi", "base", "[tag] hi")
    pick(store, chat_run, "cli-set", "run")
    env = {"TUNEDECK_HOME": str(data_home), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    listed = subprocess.run([sys.executable, "-m", "app.cli.main", "pairs"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0 and "cli-set" in listed.stdout and " 1 " in listed.stdout, listed
    out = tmp_path / "pairs.jsonl"
    exported = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "pairs", "export", "cli-set", "-o", str(out)], env=env, text=True
    )
    assert exported.returncode == 0 and out.read_text() == preferences.path_of("cli-set", "dpo").read_text()
    missing = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "pairs", "export", "no-such"], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no dpo rows in a set named `no-such`" in missing.stdout + missing.stderr


@pytest.mark.browser
@pytest.mark.integration
def test_three_picks_in_the_chat_tab_become_a_set_a_dpo_run_trains_on(
    tag_home: tuple[Path, dict[str, int]], tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from jobs.queue.submit import submit
    from storage.models import RunStatus
    from storage.store import Store

    home, ids = tag_home
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    try:
        lora = store.get_run(ids["lora"])
        assert lora is not None
        option = f"{lora.id} · {lora.name} (lora, sft)"
        with served(home) as url, chromium() as browser:
            worker_up()
            page = browser.new_page()
            open_chat(page, url, option)
            # The pick loads the run's latest session's settings (an earlier test's greedy one) into the sliders.
            # Events run one at a time in order, so once the Clear after it has answered, that load has landed:
            # only then set the sampling, or the load could put temperature 0 back (a blank base every turn).
            page.locator("#chat-clear").click()
            cleared = ("Cleared.", "Nothing to clear yet.")
            wait_for(lambda: page.locator("#chat-status").inner_text().strip() in cleared, what="the cleared tab")
            assert page.locator("#chat-run-choice input").input_value() == option  # no late load moved the pick
            page.get_by_label("Max new tokens").fill("12")
            # The tiny base answers greedily with whitespace only, which no pair can hold: sample instead, but
            # cold. Its random logits are nearly flat, so from 0.3 up every turn is the same draw (the seed is the
            # session's), the base's and the run's alike but for a token or two (or none, on another run). At
            # 0.1 the base says "\n\n\nepep..." and the run its learned "[tag] ...".
            temperature = page.get_by_label("number input for Temperature (0 = greedy)")
            temperature.fill(str(TEMPERATURE))
            temperature.press("Enter")
            wait_for(lambda: float(temperature.input_value() or 0) == TEMPERATURE, what="the temperature in the tab")
            page.locator("#chat-pref").get_by_text("Make preference data").click()
            page.locator("#chat-pref-set textarea").fill("browser-picks")
            status = page.locator("#chat-pref-status")
            # A sampled tiny random base can answer with whitespace only, or both columns with the same text: the
            # product refuses such a pair (the fast tests above check that). A user asks again; so does the test.
            asked: list[str] = []
            picked: list[int] = []  # the indices in `asked` of the turns a pair was saved from
            unpicked: list[tuple[str, str]] = []  # (base, run) answers of the turns that could not make a pair
            while len(picked) < 3:
                assert len(asked) < len(PROMPTS), (
                    f"only {len(picked)} of {len(asked)} turns could be picked: {unpicked}"
                )
                asked.append(PROMPTS[len(asked)])
                base, tuned = say(page, asked[-1], len(asked))
                session = store.latest_chat(lora.id)
                assert session is not None and session.sampling["temperature"] == TEMPERATURE, session
                if BLANK in (base[-1], tuned[-1]) or base[-1] == tuned[-1]:
                    unpicked.append((base[-1], tuned[-1]))
                    continue
                page.locator("#chat-pref-run").click()
                saved = f"holds {len(picked) + 1} pair"
                try:
                    wait_for(lambda: saved in status.inner_text(), what=f"pick {len(picked) + 1} saved")  # noqa: B023
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; the status reads {status.inner_text()!r}") from None
                picked.append(len(asked) - 1)
            path = preferences.path_of("browser-picks", "dpo")
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            assert [r["prompt"][-1]["content"] for r in rows] == [asked[i] for i in picked]
            session = store.latest_chat(lora.id)
            assert session is not None and session.sampling["temperature"] == TEMPERATURE
            runs_answers = [m.content for m in store.chat_history(session.id) if m.side == "run"]
            assert len(runs_answers) == len(asked)
            # "Run is better": each pair's chosen answer is the run's answer to its turn
            assert [r["chosen"][0]["content"] for r in rows] == [runs_answers[i] for i in picked]
            spec = tiny_spec(tiny_model, trainer="dpo", dataset=str(path), max_steps=2, per_device_train_batch_size=2)
            run_id = submit(store, spec.to_dict())

            def ended() -> Any:
                found = store.get_run(run_id)
                return found if found is not None and found.status.finished else None

            done = wait_for(ended, timeout=900, what="the dpo run's end")
            assert done.status is RunStatus.SUCCEEDED, done.error_detail
            assert store.metrics(run_id, ["loss"])
    finally:
        session = store.latest_chat(ids["lora"])
        if session is not None:  # the run's sampled session would be the next Chat tab test's settings
            store.delete_chat(session.id)
        store.dispose()
