"""What the Slurm and Ray end-to-end tests share: the quick spec, what a failed assertion shows, and waiting
for runs to run on the cluster at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from training_helpers import tiny_spec, wait_for


def quick_spec(model: Path, **changes: Any) -> Any:
    """The suite's quick tiny-model spec without the before/after samples (seconds of generation per run)."""
    return tiny_spec(model, sample_count=0, **changes)


def explain(store: Any, run_id: int) -> str:
    """What a failed assertion shows: the run's status and error, and the end of its job's and child's logs."""
    run = store.get_run(run_id)
    logs = [
        f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
        for name in ("engine.log", "train.log")
        if (path := store.run_path(run_id) / name).is_file()
    ]
    return "\n".join([f"run {run_id}: {run.status.value}: {run.error_summary} [{run.engine_state}]", *logs])


def all_running(store: Any, ids: list[int], engine: str, timeout: float = 120) -> list[Any]:
    """The runs once the engine reports every one RUNNING at the same time (asserted: not one ended first)."""
    runs = wait_for(
        lambda: (
            (s := [store.get_run(i) for i in ids])
            and (all((r.engine_state or "").startswith("RUNNING") for r in s) or any(r.status.finished for r in s))
            and s
        ),
        timeout=timeout,
        interval=0.1,
        what=f"every run RUNNING on {engine} at once",
    )
    assert all(r.engine_state.startswith("RUNNING") for r in runs), [explain(store, i) for i in ids]
    return runs


@contextmanager
def dispatchers(store: Any, engine: Any) -> Iterator[Callable[..., Any]]:
    """`start(max_jobs=2)` starts a quick-polling dispatcher on a thread (save grace 30 s); each is stopped at the end."""
    from jobs.cluster.dispatch import Dispatcher

    started: list[tuple[Any, threading.Thread]] = []

    def start(**kw: Any) -> Any:
        d = Dispatcher(store, engine, poll_interval=0.3, heartbeat_interval=1.0, save_grace=30.0, **kw)
        thread = threading.Thread(target=d.work, daemon=True)
        thread.start()
        started.append((d, thread))
        return d

    try:
        yield start
    finally:
        for d, thread in started:
            d.stop()
            thread.join(timeout=30)
