"""The training child's runtime baseline on this host: measured once, cached, published with the device.

    baseline(baseline_argv(), env)   # RuntimeBaseline(601595904, {"grpo": 56508416, ...}): cached, else measured

Measuring spawns `python -m jobs.train.baseline` (`jobs.worker.processes.baseline_argv`: the same
interpreter) with the environment the training child gets, and reads the RSS it prints and what each
trainer's own trl classes add to it (`trainer_bytes`). The figures are cached in
`$TUNEDECK_HOME/cache/runtime.json` (`jobs.devices.probe`, which also reads it for the checks) per
host and interpreter, keyed by the versions of python and the packages the child imports, so a
restarted worker does not pay again and an upgrade measures again (so does an entry cached before
the trainers were measured). A measurement that fails is logged with its traceback and gives None
(unknown): the worker trains without it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time

from jobs.devices import probe
from jobs.devices.facts import RuntimeBaseline

log = logging.getLogger(__name__)

TIMEOUT_S = 300.0  # importing torch, transformers and trl takes seconds; minutes from a cold disk
GIB = 1024**3
MIB = 1024**2


class BaselineError(RuntimeError):
    """The baseline process failed or printed no measurement."""


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


def measure(argv: list[str], env: dict[str, str], timeout: float = TIMEOUT_S) -> RuntimeBaseline:
    """Run the baseline process and return the baseline it printed last (runtime_bytes, trainer_bytes).

    Raises BaselineError (it failed, or printed no figure), OSError (it could not start) or
    subprocess.TimeoutExpired. Its own session, so a Ctrl-C meant for the worker does not kill it."""
    # run() reads both pipes to the end while it waits, so neither fills up and blocks the process.
    done = subprocess.run(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        start_new_session=True,
    )
    if done.returncode != 0:
        raise BaselineError(f"{' '.join(argv)} exited with code {done.returncode}:\n{_tail(done.stderr)}")
    lines = done.stdout.strip().splitlines()
    try:
        found = RuntimeBaseline.from_dict(json.loads(lines[-1])) if lines else None
    except ValueError:  # not JSON
        found = None
    if found is None:
        raise BaselineError(f"{' '.join(argv)} printed no runtime_bytes:\n{_tail(done.stdout)}")
    return found


def _described(found: RuntimeBaseline) -> str:
    """'1.11 GiB (grpo +53.9 MiB)'."""
    trainers = ", ".join(f"{name} +{n / MIB:.1f} MiB" for name, n in sorted(found.trainer_bytes.items()))
    return f"{found.runtime_bytes / GIB:.2f} GiB" + (f" ({trainers})" if trainers else "")


def baseline(argv: list[str], env: dict[str, str]) -> RuntimeBaseline | None:
    """This host's baseline: the cached one, else measured with `argv` and cached; None when measuring fails."""
    key = probe.runtime_key()
    cached = probe.cached_baseline(key)
    if cached is not None:
        log.info("runtime baseline %s (cached in %s)", _described(cached), probe.runtime_cache_path())
        return cached
    started = time.monotonic()
    try:
        found = measure(argv, env)
    except (BaselineError, OSError, subprocess.SubprocessError):
        log.exception("could not measure the training process's runtime baseline; runtime_bytes stays 0 (unknown)")
        return None
    log.info("runtime baseline measured: %s in %.1f s", _described(found), time.monotonic() - started)
    try:
        probe.remember_baseline(found, key)
    except OSError:  # a read-only data directory: published all the same, measured again next start
        log.exception("could not cache the runtime baseline in %s", probe.runtime_cache_path())
    return found
