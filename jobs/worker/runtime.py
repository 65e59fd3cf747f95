"""The training child's runtime baseline on this host: measured once, cached, published with the device.

    runtime_bytes(baseline_argv(), env)      # 1187000320: from the cache, else measured (seconds) and cached

Measuring spawns `python -m jobs.train.baseline` (`jobs.worker.processes.baseline_argv`: the same
interpreter) with the environment the training child gets, and reads the RSS it prints. The figure
is cached in `$TUNEDECK_HOME/cache/runtime.json` (`jobs.devices.probe`, which also reads it for the
checks) per host and interpreter, keyed by the versions of python and the packages the child
imports, so a restarted worker does not pay again and an upgrade measures again. A measurement that
fails is logged with its traceback and gives 0 (unknown): the worker trains without it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time

from jobs.devices import probe

log = logging.getLogger(__name__)

TIMEOUT_S = 300.0  # importing torch, transformers and trl takes seconds; minutes from a cold disk
GIB = 1024**3


class BaselineError(RuntimeError):
    """The baseline process failed or printed no measurement."""


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


def measure(argv: list[str], env: dict[str, str], timeout: float = TIMEOUT_S) -> int:
    """Run the baseline process and return the runtime_bytes it printed last.

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
        value = json.loads(lines[-1])["runtime_bytes"] if lines else None
    except (ValueError, KeyError, TypeError):  # not JSON, or not the object the baseline prints
        value = None
    if not isinstance(value, int) or value <= 0:
        raise BaselineError(f"{' '.join(argv)} printed no runtime_bytes:\n{_tail(done.stdout)}")
    return value


def runtime_bytes(argv: list[str], env: dict[str, str]) -> int:
    """This host's baseline: the cached figure, else measured with `argv` and cached; 0 when measuring fails."""
    key = probe.runtime_key()
    cached = probe.cached_runtime_bytes(key)
    if cached:
        log.info("runtime baseline %.2f GiB (cached in %s)", cached / GIB, probe.runtime_cache_path())
        return cached
    started = time.monotonic()
    try:
        value = measure(argv, env)
    except (BaselineError, OSError, subprocess.SubprocessError):
        log.exception("could not measure the training process's runtime baseline; runtime_bytes stays 0 (unknown)")
        return 0
    log.info("runtime baseline measured: %.2f GiB in %.1f s", value / GIB, time.monotonic() - started)
    try:
        probe.remember_runtime_bytes(value, key)
    except OSError:  # a read-only data directory: published all the same, measured again next start
        log.exception("could not cache the runtime baseline in %s", probe.runtime_cache_path())
    return value
