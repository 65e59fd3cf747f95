"""A chat turn with an image for a vision-language run: the tab keeps the image in the run's folder, a real
worker's chat service answers it on both sides with the run's processor, and a text-only run is refused.

One tiny LLaVA LoRA run is trained once for the module (through the worker, images drawn here with PIL)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from training_helpers import claim_run, wait_for

from jobs.spec.job import JobSpec
from storage.models import ReplyStatus

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 8, "seed": 0}
QUESTION = "What colour is it?"


def draw(path: Path, colour: tuple[int, int, int]) -> Path:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (48, 40), colour)
    ImageDraw.Draw(image).rectangle((8, 8, 24, 24), fill=(255, 255, 255))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def colour_rows(folder: Path, n: int = 6) -> Path:
    rows = []
    for i in range(n):
        name, colour = list(COLOURS.items())[i % len(COLOURS)]
        draw(folder / "pics" / f"{i}.png", colour)
        turns = [{"role": "user", "content": f"<image>{QUESTION}"}, {"role": "assistant", "content": name}]
        rows.append({"messages": turns, "images": [f"pics/{i}.png"]})
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


@pytest.fixture(scope="module")
def vlm_served(tmp_path_factory: pytest.TempPathFactory, tiny_vlm: Path):
    """(store, run id, service, folder): a tiny LLaVA LoRA run trained through the worker, and a chat service."""
    from jobs.chat.process import ChatProcess
    from jobs.worker.chat_service import ChatService
    from jobs.worker.loop import Worker
    from jobs.worker.services import Place
    from storage.models import RunStatus
    from storage.store import Store

    folder = tmp_path_factory.mktemp("vlm-chat")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_HOME", str(folder / "home"))
        mp.delenv("TUNEDECK_DATABASE_URL", raising=False)
        store = Store()
        spec = {"model": str(tiny_vlm), "dataset": str(colour_rows(folder)), "max_steps": 3, "learning_rate": 1e-2,
                "per_device_train_batch_size": 2, "sample_count": 0, "run_name": "colours"}  # fmt: skip
        run_id = store.create_run(JobSpec.from_dict(spec))
        Worker(store, poll_interval=0.1).work(burst=True)
        run = store.get_run(run_id)
        assert run.status is RunStatus.SUCCEEDED, run.error_detail
        host = socket.gethostname()
        chat = ChatProcess(store, idle_s=120, host=host, device="cpu")
        service = ChatService(Place(store, f"{host}:vlm-chat", host, "cpu", on_cpu=True, shared_data=False), chat)
        service.start()
        try:
            yield store, run_id, service, folder
        finally:
            service.stop()
            chat.close()
            store.dispose()


def _finished(store: Any, sid: int, turn: int) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        replies = {m.side: m for m in store.chat_history(sid) if m.turn == turn and m.role == "assistant"}
        return replies if all(r.status in (ReplyStatus.DONE, ReplyStatus.FAILED) for r in replies.values()) else None

    return wait_for(done, timeout=300, what=f"both replies of turn {turn}")


@pytest.mark.integration
def test_an_image_turn_is_answered_by_both_sides_with_the_images_pixels(vlm_served) -> None:
    import torch

    from app.ui.chat import IMAGE_MARK, send, tick
    from jobs.chat.generate import Sampling, load, locate
    from jobs.chat.images import user_turn

    store, run_id, _, folder = vlm_served
    picture = draw(folder / "upload" / "red.png", COLOURS["red"])
    store.update_chat(store.create_chat(run_id), "", SAMPLING)  # a fresh session: the tab continues the latest
    status, base, _, timer, prompt, image = send(store, None, run_id, "", 0.0, 1.0, 8, QUESTION, str(picture))
    assert timer.active and (prompt, image) == ("", None), status
    assert base[0] == {"role": "user", "content": IMAGE_MARK + QUESTION}
    sid = store.latest_chat(run_id).id
    (user,) = [m for m in store.chat_history(sid) if m.role == "user"]
    kept = Path(user.image)
    assert kept.is_file() and kept.parent == store.run_dir(run_id) / "chat", user.image  # a copy in the run's folder
    replies = _finished(store, sid, 0)
    assert {s: r.status for s, r in replies.items()} == {"base": ReplyStatus.DONE, "run": ReplyStatus.DONE}, {
        s: r.error for s, r in replies.items()
    }
    shown = wait_for(lambda: (lambda r: None if r[3].active else r)(tick(store, run_id)), timeout=60, what="done")
    assert shown[0] == "Done."
    # What the model read: the processor's pixels and 16 image tokens; they change the next-token scores.
    pair = load(locate(store, run_id), "cpu")
    turn = [{"role": "user", "content": [{"type": "image", "image": str(kept)}, {"type": "text", "text": QUESTION}]}]
    inputs = pair.inputs(turn)
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 32, 32)
    image_token = pair.processor.tokenizer.convert_tokens_to_ids("<image>")
    assert inputs["input_ids"][0].tolist().count(image_token) == 16  # 32x32 pixels in 8x8 patches
    blue = pair.inputs([user_turn(QUESTION, str(draw(folder / "upload" / "blue.png", COLOURS["blue"])))])
    with torch.no_grad():
        assert not torch.allclose(pair.tuned(**inputs).logits[0, -1], pair.tuned(**blue).logits[0, -1])
    # The worker's answers are the answers to the image turn, not to the text alone (greedy, so reproducible;
    # the tiny run answers them differently, so a worker that dropped the image would fail here).
    sampling = Sampling.from_dict(SAMPLING)
    with_image = {side: pair.answer(side, turn, sampling=sampling) for side in ("base", "run")}
    text_only = {side: pair.answer(side, QUESTION, sampling=sampling) for side in ("base", "run")}
    assert with_image != text_only, "the tiny run answers the same with and without the image: nothing to tell"
    assert {side: r.content for side, r in replies.items()} == with_image
    # The OpenAI-compatible API: the same picture as a data URL is the same kept file and the same answer.
    from app.openai_api import keep_images, parse

    body = {"model": str(run_id), "messages": [{"role": "user", "content": image_parts(picture)}], "max_tokens": 8}
    ask = keep_images(store, parse(store, body, True))
    assert ask.turns[0]["image"] == str(kept)
    sid, reply_id = store.ask_chat_reply(ask.run_id, ask.side, ask.turns, ask.system, ask.sampling)
    reply = wait_for(lambda: (lambda r: r if r.status in (ReplyStatus.DONE, ReplyStatus.FAILED) else None)(
        store.chat_message(reply_id)), timeout=300, what="the API's reply")  # fmt: skip
    assert (reply.status, reply.content) == (ReplyStatus.DONE, with_image["run"]), reply.error
    store.delete_chat(sid)


@pytest.mark.integration
def test_cli_generate_and_chat_send_a_picture_with_the_prompt(vlm_served, capsys: pytest.CaptureFixture) -> None:
    import os
    import subprocess
    import sys

    from app.cli.main import main
    from jobs.chat.generate import Sampling, load, locate
    from jobs.chat.images import user_turn

    store, run_id, _, folder = vlm_served
    pair = load(locate(store, run_id), "cpu")
    sampling = Sampling.from_dict(SAMPLING)
    text_only = pair.answer("run", QUESTION, sampling=sampling)
    answers = {}  # per colour: the answer to the picture and the question (the tiny run tells some apart)
    for name, colour in COLOURS.items():
        drawn = draw(folder / "terminal" / f"{name}.png", colour)
        answers[drawn] = pair.answer("run", [user_turn(QUESTION, str(drawn))], sampling=sampling)
    told = [p for p, answer in answers.items() if answer != text_only]
    assert told, f"the tiny run answers {text_only!r} with and without every picture: nothing to tell"
    picture = told[0]
    assert main(["generate", str(run_id), QUESTION, "--image", str(picture), "--max-new-tokens", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["image"], out["answer"]) == (str(picture), answers[picture])  # the picture was read
    kept = [p for p in (store.run_dir(run_id) / "chat").glob("*.png") if p.read_bytes() == _png_bytes(picture)]
    assert len(kept) == 1  # kept once in the run's chat folder, as a PNG
    # chat: the picture goes with each prompt (each answered on its own, so both answers are the same).
    done = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "chat", str(run_id), "--image", str(picture), "--max-new-tokens", "8"],
        input=f"{QUESTION}\n{QUESTION}\n/exit\n",
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{out['answer']}\n{out['answer']}\n", done.stdout  # the answer may be newlines
    assert f"about {picture}" in done.stderr


def _png_bytes(picture: Path) -> bytes:
    """The bytes `keep_image` writes for a picture (RGB, PNG)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    with Image.open(picture) as image:
        image.convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def test_cli_refuses_a_picture_for_a_text_only_run_or_a_broken_one_before_loading(
    store: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from app.cli.main import main

    run_id = store.create_run(JobSpec.from_dict({"model": "tiny-llama", "dataset": "sample:chat-format"}))
    claim_run(store, run_id, f"{socket.gethostname()}:1", "cpu")
    store.mark_succeeded(run_id, {})
    adapter = tmp_path / "adapter"  # a result to load: the refusals must come before any model would
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    store.add_artifact(run_id, "adapter", str(adapter), 2, "0" * 64)
    picture = draw(tmp_path / "red.png", COLOURS["red"])
    assert main(["generate", str(run_id), QUESTION, "--image", str(picture)]) == 2
    err = capsys.readouterr().err
    assert "image: run " in err and "a text-only model: it cannot read images" in err, err
    assert "send the message without the image" in err
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    assert main(["chat", str(run_id), "--image", str(broken)]) == 2
    assert "broken.png is not a readable image" in capsys.readouterr().err
    assert main(["generate", str(run_id), QUESTION, "--image", str(tmp_path / "gone.png")]) == 2
    assert "gone.png is not a file here" in capsys.readouterr().err
    assert not (store.run_dir(run_id) / "chat").exists()  # nothing kept, no model loaded


def test_an_image_for_a_text_only_run_is_refused_before_anything_is_written(store: Any, tmp_path: Path) -> None:
    from app.ui.chat import send

    run_id = store.create_run(JobSpec.from_dict({"model": "tiny-llama", "dataset": "sample:chat-format"}))
    claim_run(store, run_id, f"{socket.gethostname()}:1", "cpu")
    store.mark_succeeded(run_id, {})
    store.chat_service_beat("w:1", socket.gethostname(), False)  # a live worker reaches it: only the image is wrong
    picture = draw(tmp_path / "red.png", COLOURS["red"])
    status, _, _, timer, prompt, image = send(store, None, run_id, "", 0.0, 1.0, 8, QUESTION, str(picture))
    assert status.startswith("**image**: run ") and "a text-only model: it cannot read images" in status, status
    assert "Fix: send the message without the image, or chat with a run of a vision-language model" in status
    assert not timer.active and store.latest_chat(run_id) is None  # nothing written; the prompt and image kept
    assert not (store.run_dir(run_id) / "chat").exists()
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    status = send(store, None, run_id, "", 0.0, 1.0, 8, QUESTION, str(broken))[0]
    assert "**image**: broken.png is not a readable image" in status, status


def test_the_generation_side_refuses_an_image_for_a_text_only_run_too(tmp_path: Path) -> None:
    """A run whose base config was not on the dashboard's machine: the worker's pair refuses the same way."""
    from jobs.chat.conversation import conversation
    from jobs.chat.generate import ChatError, LoadedPair, RunResult
    from storage.store_chat import ChatMessageRecord

    picture = str(draw(tmp_path / "blue.png", COLOURS["blue"]))

    def message(turn: int, role: str, side: str | None, content: str, image: str | None = None) -> ChatMessageRecord:
        return ChatMessageRecord(
            turn, 1, 1, turn, role, side, content, ReplyStatus.DONE, None, None, None, 0.0, None, None, image
        )

    history = [
        message(0, "user", None, "Hi"),
        message(0, "assistant", "run", "Hello"),
        message(1, "user", None, QUESTION, picture),
    ]
    turns = conversation(history, 1, "run")
    image_part = {"type": "image", "image": picture}
    assert turns == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [image_part, {"type": "text", "text": QUESTION}]},
    ]
    text_only = LoadedPair(RunResult(7, "notes", "tiny-llama", str(tmp_path), "lora", False), None, None, None)
    with pytest.raises(ChatError) as caught:
        text_only.inputs(turns)
    (problem,) = caught.value.problems
    assert problem.field == "image" and "run 7 (notes) fine-tuned tiny-llama, a text-only model" in problem.problem


def image_parts(picture: Path, text: str = QUESTION) -> list[dict[str, Any]]:
    import base64

    url = "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]


def test_the_apis_image_parts_are_data_urls_one_a_turn_and_refused_for_a_text_only_run(
    store: Any, tmp_path: Path
) -> None:
    from app.openai_api import ApiError, chat_turns, keep_images, parse

    picture = draw(tmp_path / "red.png", COLOURS["red"])
    system, turns = chat_turns([{"role": "user", "content": image_parts(picture)}])
    assert turns[0]["content"] == QUESTION and turns[0]["image_bytes"] == picture.read_bytes()
    web = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    for content, words in (
        (web, "web URLs are not fetched"),
        (image_parts(picture) + image_parts(picture), "one `image_url` part per user message"),
    ):
        with pytest.raises(ApiError) as caught:
            chat_turns([{"role": "user", "content": content}])
        assert words in caught.value.message and caught.value.param == "messages"
    run_id = store.create_run(JobSpec.from_dict({"model": "tiny-llama", "dataset": "sample:chat-format"}))
    claim_run(store, run_id, f"{socket.gethostname()}:1", "cpu")
    store.mark_succeeded(run_id, {})
    body = {"model": str(run_id), "messages": [{"role": "user", "content": image_parts(picture)}]}
    with pytest.raises(ApiError) as caught:
        keep_images(store, parse(store, body, True))
    assert "a text-only model: it cannot read images. Fix: send the message without the image" in caught.value.message
    assert caught.value.status == 400 and not (store.run_dir(run_id) / "chat").exists()


def test_schema_10_database_gains_the_turns_image_column(data_home: Path) -> None:
    import sqlite3

    from storage import models as m
    from storage.store import Store

    path = data_home / "v10.db"
    Store(f"sqlite:///{path}").dispose()
    with sqlite3.connect(path) as con:  # as schema 10 left it: chat messages without an image column
        con.execute("ALTER TABLE chat_messages DROP COLUMN image_path")
        con.execute("UPDATE meta SET value = '10' WHERE key = 'schema_version'")
    con.close()
    store = Store(f"sqlite:///{path}")
    try:
        assert store.schema_version == m.SCHEMA_VERSION >= 11
        run_id = store.create_run(JobSpec())
        sid = store.create_chat(run_id)
        store.add_chat_turn(sid, "plain")
        store.add_chat_turn(sid, "with a picture", "/data/runs/x/chat/ab.png")
        users = [(u.content, u.image) for u in store.chat_history(sid) if u.role == "user"]
        assert users == [("plain", None), ("with a picture", "/data/runs/x/chat/ab.png")]
    finally:
        store.dispose()


@pytest.mark.browser
@pytest.mark.integration
def test_the_chat_tab_in_chromium_sends_an_image_with_a_turn(vlm_served) -> None:
    """As a user: pick the run, attach a picture beside the message, send; both columns answer the image turn."""
    from browser_helpers import CHROMIUM, chromium, served
    from chat_browser_helpers import open_chat, say, worker_up
    from engines import engine_missing, import_or_missing

    from app.ui.chat import BLANK

    if not Path(CHROMIUM).exists():
        engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium")
    import_or_missing("playwright.sync_api")
    store, run_id, _, folder = vlm_served
    picture = draw(folder / "upload" / "green.png", COLOURS["green"])
    store.update_chat(store.create_chat(run_id), "", SAMPLING)  # a fresh session: the tab continues the latest
    with served(folder / "home") as url, chromium() as browser:
        worker_up()
        page = browser.new_page()
        open_chat(page, url, f"{run_id} · colours (lora, sft)")
        page.locator("#chat-image input[type=file]").set_input_files(str(picture))
        wait_for(lambda: page.locator("#chat-image img").count() > 0, what="the picture's preview")
        base, tuned = say(page, QUESTION, answers=1)
        shown = page.locator("#chat-tuned [data-testid='user']").first.inner_text().strip()
        assert shown == f"[image] {QUESTION}", shown
        assert page.locator("#chat-image img").count() == 0  # the image went with the turn: the box is empty
    sid = store.latest_chat(run_id).id
    (user,) = [m for m in store.chat_history(sid) if m.role == "user"]
    assert user.image and Path(user.image).parent == store.run_dir(run_id) / "chat"
    replies = _finished(store, sid, 0)
    assert {s: r.status for s, r in replies.items()} == {"base": ReplyStatus.DONE, "run": ReplyStatus.DONE}
    shown_answers = ([replies["base"].content.strip() or BLANK], [replies["run"].content.strip() or BLANK])
    assert (base, tuned) == shown_answers  # what the worker wrote, as the columns show it
