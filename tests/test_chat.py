"""Chat with a finished run beside its base: the engine, the generation process, the CLI, the tab's handler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import PROMPT, TAUGHT
from training_helpers import claim_run, greedy_answer, tiny_spec, wait_for

from jobs.chat.generate import ChatError, Sampling, load, locate
from jobs.chat.process import ChatProcess, choose_device
from jobs.devices.facts import DeviceFacts

pytestmark = pytest.mark.integration

SHORT = Sampling(max_new_tokens=16)
GPU = DeviceFacts(kind="cuda", name="Fake GPU", total_bytes=80 * 1024**3, compute_capability="9.0", bf16=True, index=0)


@pytest.fixture(scope="module")
def home(tag_store):
    """(folder, store, ids): the session's tag-format runs (conftest): LoRA, prompt tuning, full."""
    return tag_store


@pytest.fixture(scope="module")
def lora_pair(home):
    _, store, ids = home
    return load(locate(store, ids["lora"]), "cpu")


def test_run_answers_in_the_taught_format_and_the_base_does_not(home, lora_pair, tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    run = lora_pair.answer("run", PROMPT, sampling=SHORT)
    base = lora_pair.answer("base", PROMPT, sampling=SHORT)
    assert TAUGHT in run and TAUGHT not in base and run != base
    # Greedy by default: asked again, the same answers.
    assert lora_pair.answer("run", PROMPT, sampling=SHORT) == run
    assert lora_pair.answer("base", PROMPT, sampling=SHORT) == base
    # "base" is the untouched base model (the adapter switched off), not something in between.
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    assert greedy_answer(plain, lora_pair.tokenizer, PROMPT, 16) == base.strip()


def test_streamed_pieces_join_to_the_whole_answer(lora_pair) -> None:
    for which in ("base", "run"):
        pieces = list(lora_pair.stream(which, PROMPT, sampling=SHORT))
        assert len(pieces) > 1, pieces  # streamed, not one block at the end
        assert "".join(pieces) == lora_pair.answer(which, PROMPT, sampling=SHORT)


def test_system_prompt_goes_through_the_chat_template(lora_pair) -> None:
    ids = lora_pair.inputs(PROMPT, system="Answer like a pirate.")["input_ids"][0].tolist()
    text = lora_pair.tokenizer.decode(ids)
    assert "Answer like a pirate." in text and text.index("Answer like a pirate.") < text.index(PROMPT)
    assert lora_pair.tokenizer.decode(lora_pair.inputs(PROMPT)["input_ids"][0]).count("system") == 0


def test_sampling_is_reproducible_with_its_seed_and_checked(lora_pair) -> None:
    hot = Sampling(temperature=1.5, top_p=0.95, max_new_tokens=16, seed=7)
    assert lora_pair.answer("base", PROMPT, sampling=hot) == lora_pair.answer("base", PROMPT, sampling=hot)
    # the tab's Regenerate moves the session to the next seed: a different draw
    assert lora_pair.answer("base", PROMPT, sampling=replace(hot, seed=8)) != lora_pair.answer(
        "base", PROMPT, sampling=hot
    )
    assert Sampling().generate_kwargs()["do_sample"] is False and hot.generate_kwargs()["do_sample"] is True
    with pytest.raises(ChatError) as err:
        Sampling(temperature=-1, top_p=0, max_new_tokens=0).checked()
    assert {p.field for p in err.value.problems} == {"temperature", "top_p", "max_new_tokens"}


def test_prompt_tuning_and_full_runs_answer_beside_the_same_base(home, lora_pair) -> None:
    import torch

    _, store, ids = home
    base = lora_pair.answer("base", PROMPT, sampling=SHORT)
    for method in ("prompt_tuning", "full"):
        pair = load(locate(store, ids[method]), "cpu")
        assert pair.answer("base", PROMPT, sampling=SHORT) == base, method
        # The run's model is the trained one: its next-token scores differ from the base's.
        inputs = pair.inputs(PROMPT)
        with torch.no_grad():
            tuned = pair.tuned(**inputs).logits[0, -1]
            plain = lora_pair.tuned.get_base_model()
            with lora_pair.tuned.disable_adapter():
                untouched = plain(**inputs).logits[0, -1]
        assert not torch.allclose(tuned, untouched), method


def test_runs_that_cannot_answer_are_refused_with_the_fix(store, tiny_model: Path) -> None:
    # A store of its own: a claim takes the oldest queued run, and the session's shared store may hold
    # one queued by another module (seen in a random-order run).
    queued = store.create_run(tiny_spec(tiny_model, run_name="still-queued"))
    reward = store.create_run(tiny_spec(tiny_model, trainer="reward", dataset="sample:preference-format"))
    cases = {999: "does not exist", queued: "is queued"}
    for run_id, words in cases.items():
        with pytest.raises(ChatError) as err:
            locate(store, run_id)
        assert words in str(err.value) and "tunedeck runs --status succeeded" in str(err.value)
    # A "succeeded" run without its result folder, and a reward model (claimed and finished by hand).
    for run_id in (queued, reward):
        claim_run(store, run_id, "test-worker", f"fake-{run_id}")
        store.mark_succeeded(run_id, {})
    with pytest.raises(ChatError, match="no saved adapter folder"):
        locate(store, queued)
    with pytest.raises(ChatError, match="reward model"):
        locate(store, reward)


def test_busy_gpu_is_refused_naming_the_run_and_the_fix(
    store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TUNEDECK_CHAT_DEVICE", raising=False)
    monkeypatch.delenv("TUNEDECK_DEVICE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run_id = store.create_run(tiny_spec(tiny_model, run_name="training-now"))
    claim_run(store, run_id, "w1", "0", host="gpu-box")  # run is training on GPU 0
    with pytest.raises(ChatError) as err:
        choose_device(store, GPU, host="gpu-box")
    text = str(err.value)
    assert f"GPU 0 is training run {run_id} (training-now)" in text and f"tunedeck cancel {run_id}" in text
    assert "TUNEDECK_CHAT_DEVICE" in text
    # Another GPU, the CPU on request, or a machine without a GPU: answered there.
    monkeypatch.setenv("TUNEDECK_CHAT_DEVICE", "1")
    assert choose_device(store, GPU, host="gpu-box") == "1"
    monkeypatch.setenv("TUNEDECK_CHAT_DEVICE", "cpu")
    assert choose_device(store, GPU, host="gpu-box") == "cpu"
    monkeypatch.delenv("TUNEDECK_CHAT_DEVICE")
    assert choose_device(store, DeviceFacts(kind="cpu", name="cpu", total_bytes=1), host="gpu-box") == "cpu"
    # Without a device setting, CUDA_VISIBLE_DEVICES names it as it names the worker's ("" hides the GPUs).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert choose_device(store, GPU, host="gpu-box") == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ChatError, match=f"GPU 0 is training run {run_id}"):
        choose_device(store, GPU, host="gpu-box")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # The process manager refuses before starting anything.
    chat = ChatProcess(store, facts=GPU, host="gpu-box")
    with pytest.raises(ChatError, match="GPU 0 is training run"):
        chat.answer(run_id, "run", PROMPT)
    assert not chat.alive()
    # Once the run's worker releases the GPU, the device check passes.
    store.release_device("0", "w1", host="gpu-box")
    assert choose_device(store, GPU, host="gpu-box") == "0"


def test_a_load_slower_than_the_idle_time_is_not_idleness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle time counts from the end of a request: a model load that takes longer than the idle
    timeout is followed by the answer, not by an exit (found by CI on a loaded machine)."""
    import threading
    import time

    import jobs.chat.generate
    from jobs.chat.child import serve
    from jobs.chat.generate import RunResult

    class FakePair:
        def __init__(self, result: RunResult) -> None:
            self.result, self.device = result, "cpu"

        def stream(self, which: str, prompt: str, system: str, sampling: Any) -> Any:
            yield from ("Hel", "lo")

    def slow_load(result: RunResult) -> FakePair:
        time.sleep(3.0)  # longer than the 2 s idle timeout below
        return FakePair(result)

    monkeypatch.setattr(jobs.chat.generate, "load", slow_load)
    requests_r, requests_w = os.pipe()
    events_r, events_w = os.pipe()
    stdin, to_child = os.fdopen(requests_r, "r"), os.fdopen(requests_w, "w")
    from_child, stdout = os.fdopen(events_r, "r"), os.fdopen(events_w, "w")
    code: list[int] = []

    def run() -> None:
        code.append(serve(2.0, stdin, stdout))
        stdout.close()  # the process has ended: the reader sees end of output, as from a real child

    server = threading.Thread(target=run, daemon=True)
    server.start()
    result = RunResult(1, "r", "tiny", "/nowhere", "lora", False)
    to_child.write(json.dumps({"op": "load", "result": result.to_dict()}) + "\n")
    to_child.flush()
    assert json.loads(from_child.readline())["event"] == "loaded"
    to_child.write(json.dumps({"op": "generate", "which": "run", "prompt": "Hi"}) + "\n")
    to_child.flush()
    lines = [from_child.readline() for _ in range(3)]
    assert lines[-1] and json.loads(lines[-1]) == {"event": "done", "answer": "Hello"}, f"no answer: {lines}"
    to_child.close()  # end of input: the process ends
    server.join(timeout=60)
    assert code == [0]


def test_a_chat_process_leaves_its_gpu_as_soon_as_a_run_takes_it(store, tiny_model: Path, tmp_path: Path) -> None:
    """An idle generation process on GPU 0 exits within a couple of seconds of a run claiming GPU 0
    (so the run's model loads into freed memory); one on GPU 1 stays."""
    from jobs.chat.device import GPU_ENV

    procs = {}
    for gpu in ("0", "1"):
        with open(tmp_path / f"chat-{gpu}.log", "wb") as err:
            procs[gpu] = subprocess.Popen(
                [sys.executable, "-m", "jobs.chat.child", "600"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=dict(os.environ, **{GPU_ENV: gpu}),
            )
    try:
        log0 = tmp_path / "chat-0.log"
        # Up and watching: it has looked at the lease at least once and is still there.
        wait_for(lambda: procs["0"].poll() is None and procs["1"].poll() is None, what="chat processes started")
        run_id = store.create_run(tiny_spec(tiny_model, run_name="needs-the-gpu"))
        claim_run(store, run_id, "w1", "0")
        wait_for(lambda: procs["0"].poll() is not None, timeout=60, what="the chat process on GPU 0 to exit")
        assert procs["0"].returncode == 0
        assert f"GPU 0 is training run {run_id} (needs-the-gpu)" in log0.read_text()
        assert procs["1"].poll() is None  # GPU 1 is nobody's: that process keeps its model
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_generation_process_answers_switches_runs_and_exits_when_idle(home, lora_pair) -> None:
    _, store, ids = home
    other = load(locate(store, ids["full"]), "cpu").answer("run", PROMPT, sampling=SHORT)
    chat = ChatProcess(store, idle_s=1.0)
    try:
        pieces = list(chat.stream(ids["lora"], "run", PROMPT, sampling=SHORT))
        assert "".join(pieces) == lora_pair.answer("run", PROMPT, sampling=SHORT) and len(pieces) > 1
        assert chat.answer(ids["lora"], "base", PROMPT, sampling=SHORT) == lora_pair.answer(
            "base", PROMPT, sampling=SHORT
        )
        # Another run: the same process loads it instead.
        pid = chat.pid
        assert chat.answer(ids["full"], "run", PROMPT, sampling=SHORT) == other and chat.pid == pid
        # Idle for 1 s: it exits by itself (code 0), freeing its memory; the next question starts a fresh one.
        proc = chat._proc
        wait_for(lambda: not chat.alive(), timeout=60, what="the idle generation process to exit")
        assert proc.returncode == 0
        assert chat.answer(ids["lora"], "run", PROMPT, sampling=SHORT) == "".join(pieces)
        assert chat.pid not in (None, pid)
    finally:
        chat.close()


@pytest.mark.slow
def test_cli_generate_and_chat(home, lora_pair, capsys: pytest.CaptureFixture) -> None:
    from app.cli.main import main

    folder, _, ids = home
    run_answer = lora_pair.answer("run", PROMPT, sampling=Sampling(max_new_tokens=12))
    base_answer = lora_pair.answer("base", PROMPT, sampling=Sampling(max_new_tokens=12))
    assert main(["generate", str(ids["lora"]), PROMPT, "--max-new-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run"] == ids["lora"] and out["model"] == "run" and out["prompt"] == PROMPT
    assert out["answer"] == run_answer
    assert main(["generate", str(ids["lora"]), PROMPT, "--max-new-tokens", "12", "--base"]) == 0
    assert capsys.readouterr().out == base_answer + "\n"
    # Bad ids and unfinished runs: the problem and the fix, exit code 2.
    assert main(["generate", "999", PROMPT]) == 2
    assert "run 999 does not exist" in capsys.readouterr().err
    # chat: prompts on stdin, answers streamed to stdout; /exit ends before the last line.
    env = {**os.environ, "TUNEDECK_HOME": str(folder)}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "chat", str(ids["lora"]), "--max-new-tokens", "12"],
        input=f"{PROMPT}\n\n{PROMPT}\n/exit\nnot asked\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == f"{run_answer}\n{run_answer}\n"


def test_a_message_past_the_context_is_refused_before_it_is_written_or_a_child_is_given_it(home) -> None:
    """The tab refuses it with the limit and writes nothing; a worker's ChatProcess refuses it before starting
    (or feeding) its generation process, so one message cannot grow the child past its model's context."""
    from app.ui.chat import send

    _, store, ids = home
    run_id = ids["full"]
    session = store.latest_chat(run_id)
    before = len(store.chat_history(session.id)) if session is not None else 0
    long = "the moon " * 300  # about 2,700 tokens of the tiny tokenizer: the model reads 1,024
    status = send(store, None, run_id, "", 0.0, 1.0, 16, long)[0]
    assert "context of 1,024 tokens (the model's max_position_embeddings)" in status and "Fix:" in status
    session = store.latest_chat(run_id)
    assert (len(store.chat_history(session.id)) if session is not None else 0) == before
    chat = ChatProcess(store, idle_s=30)
    try:
        with pytest.raises(ChatError, match="over run .*'s context of 1,024 tokens"):
            list(chat.stream(run_id, "run", [{"role": "user", "content": long}], sampling=SHORT))
        assert chat.pid is None  # no generation process was started for it
    finally:
        chat.close()


def test_no_finished_runs_message(store) -> None:
    from app.ui.chat import NO_RUNS, run_choices, send

    assert run_choices(store) == []
    status, base, tuned, *_ = send(store, None, None, "", 0.0, 1.0, 16, PROMPT)
    assert (status, base, tuned) == (NO_RUNS, [], [])


@pytest.mark.gpu
def test_on_a_gpu_answers_come_from_the_gpu_and_a_training_run_keeps_it(home, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _, store, ids = home
    pair = load(locate(store, ids["lora"]))
    assert pair.device.type == "cuda" and TAUGHT in pair.answer("run", PROMPT, sampling=SHORT)
    monkeypatch.delenv("TUNEDECK_CHAT_DEVICE", raising=False)
    monkeypatch.setenv("TUNEDECK_DEVICE", "0")
    assert choose_device(store) == "0"  # this machine's real device facts
    holder = store.create_run(tiny_spec(Path(locate(store, ids["lora"]).base), run_name="holder"))
    claim_run(store, holder, "gpu-test", "0")
    with pytest.raises(ChatError, match=f"GPU 0 is training run {holder}"):
        ChatProcess(store).answer(ids["lora"], "run", PROMPT, sampling=SHORT)
    store.release_device("0", "gpu-test")
    store.mark_cancelled(holder)
