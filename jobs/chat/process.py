"""The generation process, managed by a worker's chat service (or the CLI): device rules, start, idle exit.

    chat = ChatProcess(store)                     # nothing started yet
    for piece in chat.stream(run_id, "run", "Hi", system="", sampling=Sampling()):
        ...                                       # starts `python -m jobs.chat.child` on first use
    chat.close()

Device rules, the same as training's: on a machine with a GPU, answers are generated on
`TUNEDECK_CHAT_DEVICE` (a GPU index or UUID, or `cpu`), else the worker's `TUNEDECK_DEVICE`,
else what CUDA_VISIBLE_DEVICES names (as the worker names it), else GPU 0, and never on a GPU
whose lease a training run holds: that is refused with the run's id and the fix (the check is
made before every request, and a process on a GPU whose lease a run has since taken exits
by itself within `jobs.chat.child.CHECK_EVERY_S`, freeing its memory while the run's model
loads). On a machine without a GPU it runs on the CPU.
The process exits after `TUNEDECK_CHAT_IDLE_SECONDS` (default 300) without a request,
freeing the model's memory; the next request starts a fresh one. One run's model pair is
loaded at a time; asking for another run reloads. Its log: `$TUNEDECK_HOME/logs/chat.log`.
A prompt longer than the run's model reads at once is refused before the child is given it
(`jobs.chat.limits`): one request cannot grow the child past its model's context.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from jobs.chat.device import DEVICE_ENV, GPU_ENV, busy_problem
from jobs.chat.generate import ChatError, Conversation, RunResult, Sampling, locate, refuse
from jobs.chat.images import text_of
from jobs.chat.limits import prompt_problem
from jobs.errors import Problem
from storage.roles import ChatRuns

log = logging.getLogger("jobs.chat.process")

IDLE_ENV = "TUNEDECK_CHAT_IDLE_SECONDS"
DEFAULT_IDLE_S = 300.0


def idle_seconds() -> float:
    """How long the generation process waits for a request before it exits (TUNEDECK_CHAT_IDLE_SECONDS)."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_IDLE_S
    except ValueError:
        raise refuse(
            f"{IDLE_ENV}={raw!r} is not a number of seconds", f"set {IDLE_ENV} to e.g. 300", IDLE_ENV
        ) from None
    if value <= 0:
        raise refuse(f"{IDLE_ENV}={raw} must be more than 0 seconds", f"set {IDLE_ENV} to e.g. 300", IDLE_ENV)
    return value


def choose_device(store: ChatRuns, facts: Any = None, host: str | None = None, wanted: str | None = None) -> str:
    """ "cpu" or the GPU (index or UUID) to answer on; raises ChatError when a training run holds it.

    `wanted`: the device asked for (a worker's own); None: TUNEDECK_CHAT_DEVICE, TUNEDECK_DEVICE, ..."""
    wanted = (wanted or os.environ.get(DEVICE_ENV) or os.environ.get("TUNEDECK_DEVICE") or "").strip()
    inherited = not wanted and "CUDA_VISIBLE_DEVICES" in os.environ
    if inherited:  # named as an unpinned worker names its device: the whole CUDA_VISIBLE_DEVICES value
        wanted = os.environ["CUDA_VISIBLE_DEVICES"].strip() or "cpu"
    if wanted.lower() == "cpu":
        return "cpu"
    if facts is None:
        from jobs.devices.probe import detect

        facts = detect(int(wanted) if wanted.isdigit() and not inherited else 0)
    if not facts.cuda:
        return "cpu"
    gpu = wanted or "0"
    problem = busy_problem(store, gpu, host)
    if problem is not None:
        raise ChatError([problem])
    return gpu


def log_path() -> Path:
    from storage.settings import data_dir

    folder = data_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "chat.log"


def prompt_texts(prompt: Conversation, system: str = "") -> list[str]:
    """The text of a prompt (one, or the turns so far) and its system prompt, as `prompt_problem` counts it."""
    turns = [prompt] if isinstance(prompt, str) else [text_of(t.get("content") or "") for t in prompt]
    return [system, *turns]


class ChatProcess:
    """One generation child at a time; requests are served one after another (a lock)."""

    def __init__(
        self,
        store: ChatRuns,
        idle_s: float | None = None,
        facts: Any = None,
        host: str | None = None,
        device: str | None = None,
    ):
        self.store = store
        self.idle_s = idle_s
        self.facts = facts  # tests pass fake device facts; None: detect this machine's
        self.host = host or socket.gethostname()
        self.device = device  # the device asked for (a worker's); None: the environment's (`choose_device`)
        self._held: int | None = None  # the run whose model pair the live child holds
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._device: str | None = None

    @property
    def pid(self) -> int | None:
        proc = self._live()
        return proc.pid if proc is not None else None

    def alive(self) -> bool:
        return self._live() is not None

    def _live(self) -> subprocess.Popen | None:
        """The child while it runs; None when there is none or it has exited."""
        proc = self._proc
        return proc if proc is not None and proc.poll() is None else None

    def holds(self, run_id: int) -> bool:
        """Whether a live child already holds run `run_id`'s models (its next answer starts warm)."""
        return self.alive() and self._held == run_id

    def _start(self, device: str) -> subprocess.Popen:
        from storage.settings import data_dir

        idle = self.idle_s if self.idle_s is not None else idle_seconds()
        env = dict(
            os.environ,
            TUNEDECK_HOME=str(data_dir()),
            PYTHONUNBUFFERED="1",
            CUDA_VISIBLE_DEVICES="" if device == "cpu" else device,
        )
        env.pop(GPU_ENV, None)
        if device != "cpu":
            env[GPU_ENV] = device  # the child watches this GPU's lease and leaves when a run takes it
        with open(log_path(), "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobs.chat.child", str(idle)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
        log.info("chat process %s started on %s (exits after %.0f s idle)", proc.pid, device, idle)
        self._proc, self._device = proc, device
        return proc

    def close(self) -> None:
        """Stop the generation process now (its memory is freed)."""
        proc, self._proc, self._held = self._proc, None, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout) if proc is not None else ():
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def _request(self, proc: subprocess.Popen, **request: Any) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()

    def _event(self, proc: subprocess.Popen) -> dict[str, Any]:
        out: IO[str] | None = proc.stdout
        assert out is not None
        line = out.readline()
        if not line:
            code = proc.wait()
            raise refuse(
                f"the chat process exited (code {code}) before answering",
                f"see its log {log_path()}; ask again to start a fresh one",
                "chat",
            )
        event = json.loads(line)
        if event.get("event") == "error":
            raise ChatError([Problem(*row) for row in event["problems"]])
        return event

    def _loaded(self, result: RunResult, device: str) -> subprocess.Popen:
        """A live child on `device` holding `result` (started or reloaded as needed)."""
        if self.alive() and self._device != device:
            self.close()
        for attempt in (1, 2):
            proc = self._live() or self._start(device)
            try:
                self._request(proc, op="load", result=result.to_dict())
                self._event(proc)
                self._held = result.run_id
                return proc
            except (BrokenPipeError, ChatError) as exc:
                exited = proc.poll() is not None
                if not exited or attempt == 2:  # a load error, or a child that failed twice
                    if exited:
                        self.close()
                    raise
                log.info("chat process had just exited (%s); starting a fresh one", exc)
                self.close()
        raise AssertionError("unreachable")

    def stream(
        self, run_id: int, which: str, prompt: Conversation, system: str = "", sampling: Sampling | None = None
    ) -> Iterator[str]:
        """Pieces of the answer of `which` ("base" or "run") of run `run_id`, as they are generated.

        `prompt`: one prompt, or the conversation so far (`jobs.chat.generate.Conversation`)."""
        sampling = (sampling or Sampling()).checked()
        with self._lock:
            try:
                device = choose_device(self.store, self.facts, self.host, self.device)
            except ChatError:
                self.close()  # a run started training on our GPU: free it
                raise
            result = locate(self.store, run_id)
            too_long = prompt_problem(result, prompt_texts(prompt, system))  # counted before the child is given it
            if too_long is not None:
                raise ChatError([too_long])
            proc = self._loaded(result, device)
            self._request(
                proc,
                op="generate",
                which=which,
                prompt=prompt,
                system=system,
                sampling={
                    "temperature": sampling.temperature,
                    "top_p": sampling.top_p,
                    "max_new_tokens": sampling.max_new_tokens,
                    "seed": sampling.seed,
                    "raw": sampling.raw,
                },
            )
            finished = False
            try:
                while True:
                    event = self._event(proc)
                    if event["event"] == "done":
                        finished = True
                        return
                    yield event["text"]
            except ChatError:
                finished = proc.poll() is None  # the child reported a problem and waits for the next request
                raise
            finally:
                if not finished:  # abandoned mid-answer (or failed): its late events must not reach the next request
                    self.close()

    def answer(
        self, run_id: int, which: str, prompt: Conversation, system: str = "", sampling: Sampling | None = None
    ) -> str:
        return "".join(self.stream(run_id, which, prompt, system, sampling))
