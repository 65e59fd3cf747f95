"""The generation process: holds one run's model pair and answers requests, until idle for too long.

Started by `jobs.chat.process.ChatProcess` as `python -m jobs.chat.child IDLE_SECONDS`, it reads
one JSON request per line on stdin and writes JSON events, one per line, on stdout:

    {"op": "load", "result": {...RunResult...}}      -> {"event": "loaded", "run_id": 3, "device": "cpu"}
    {"op": "generate", "which": "run", "prompt": "Hi", "system": "", "sampling": {...}}
        ("prompt" is one prompt, or the conversation so far: [{"role": "user", "content": "Hi"}, ...])
        (a user turn's content may be parts, an image file's and the text: `jobs.chat.images.user_turn`)
        -> {"event": "piece", "text": "He"} ... {"event": "done", "answer": "Hello"}
    any failure                                      -> {"event": "error", "problems": [[field, problem, fix], ...]}

A `load` of another run replaces the pair held (one pair at a time, its memory freed first).
With no request for IDLE_SECONDS it exits (code 0), so the memory it held is freed; the parent
starts a fresh one on the next request. On a GPU (`TUNEDECK_CHAT_GPU`, set by the parent) it
also looks every `CHECK_EVERY_S` seconds between requests whether a training run has taken that
GPU's lease, and exits at once if one has: the run gets the memory within seconds, while its
model is still loading, not at the chat's next request. Logs go to stderr (a file the parent names).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import select
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TextIO

from jobs.chat.device import GPU_ENV, busy_problem
from jobs.errors import ProblemError

log = logging.getLogger("jobs.chat.child")

CHECK_EVERY_S = 2.0  # how often an idle process on a GPU looks at that GPU's lease


def _send(out: TextIO, **event: Any) -> None:
    out.write(json.dumps(event) + "\n")
    out.flush()


def _error(out: TextIO, exc: BaseException) -> None:
    if isinstance(exc, ProblemError) and exc.problems:
        rows = [[p.field, p.problem, p.fix] for p in exc.problems]
    else:
        log.error("request failed:\n%s", traceback.format_exc())
        rows = [["chat", f"generation failed: {type(exc).__name__}: {exc}", "see the chat process log; try again"]]
    _send(out, event="error", problems=rows)


def _free(pair: Any) -> None:
    import torch

    del pair
    gc.collect()
    if torch.cuda.is_available():
        try:
            torch.cuda.empty_cache()
        except RuntimeError:  # a CUDA error (torch.AcceleratorError is one): the next load will meet it too
            log.warning("could not free the GPU's cached memory", exc_info=True)


def serve(
    idle_seconds: float,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    taken: Callable[[], str | None] | None = None,
    check_every: float = CHECK_EVERY_S,
) -> int:
    """Answer requests until stdin closes, nothing arrives for `idle_seconds`, or `taken()`
    (asked every `check_every` s between requests) says a training run needs the device."""
    from jobs.chat.generate import RunResult, Sampling, load

    pair = None
    last_request = time.monotonic()
    while True:
        left = idle_seconds - (time.monotonic() - last_request)
        if left <= 0:
            log.info("idle for %.0f s: exiting to free the model's memory", idle_seconds)
            return 0
        ready, _, _ = select.select([stdin], [], [], min(left, check_every) if taken is not None else left)
        if not ready:
            why = taken() if taken is not None else None
            if why:
                log.info("%s: exiting to free its memory", why)
                return 0
            continue
        line = stdin.readline()
        if not line:
            return 0
        try:
            request = json.loads(line)
            if request.get("op") == "load":
                result = RunResult.from_dict(request["result"])
                if pair is None or pair.result != result:
                    if pair is not None:
                        _free(pair)
                        pair = None
                    started = time.monotonic()
                    pair = load(result)
                    log.info("loaded run %s on %s in %.1f s", result.run_id, pair.device, time.monotonic() - started)
                _send(stdout, event="loaded", run_id=result.run_id, device=str(pair.device))
            elif request.get("op") == "generate":
                if pair is None:
                    raise RuntimeError("no run loaded")
                sampling = Sampling.from_dict(request.get("sampling") or {})
                pieces = []
                for piece in pair.stream(request["which"], request["prompt"], request.get("system") or "", sampling):
                    pieces.append(piece)
                    _send(stdout, event="piece", text=piece)
                _send(stdout, event="done", answer="".join(pieces))
            else:
                raise RuntimeError(f"unknown request {request.get('op')!r}")
        # A failed request is that request's answer: the parent shows it, and _error logs the traceback
        # of anything that is not a ProblemError. Broad, so one bad request does not end the process
        # (and with it the model the next request needs).
        except Exception as exc:  # noqa: BLE001 - answered to the parent and logged by _error
            _error(stdout, exc)
        last_request = time.monotonic()  # idle counts from the end of a request: a slow load is not idleness


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve(float(args[0]) if args else 300.0, taken=lease_watch(os.environ.get(GPU_ENV, "").strip()))


def lease_watch(gpu: str) -> Callable[[], str | None] | None:
    """For a process on GPU `gpu`: a check that names the training run holding that GPU's lease, if any."""
    if not gpu:
        return None
    from storage.errors import DatabaseUnavailable
    from storage.store import Store

    store = Store()

    def taken() -> str | None:
        try:
            problem = busy_problem(store, gpu)
        except DatabaseUnavailable as exc:  # the database is away or locked: keep answering, look again later
            log.warning("could not read GPU %s's lease (%s); looking again in %.0f s", gpu, exc, CHECK_EVERY_S)
            return None
        return problem.problem if problem is not None else None

    return taken


if __name__ == "__main__":
    sys.exit(main())
