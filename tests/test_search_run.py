"""Issue 47's done-when, with real processes: a search of 8 trials over learning rate and rank on the tiny
model, started with `tunedeck search`, driven by the dashboard's worker, which is killed (dashboard, worker
and all, SIGKILL) mid-search and started again. It ends with its best eval loss below the default spec's, a
trial pruned early, the points that cannot fit refused without being queued, no trial run twice, none lost.

The grid sampler makes the 8 points certain (4 learning rates x ranks 8 and 4096): the first is the default
spec's own values; rank 4096 will not fit the CPU worker's memory (TUNEDECK_CPU_MEMORY: the runtime baseline
+ 110 MiB, where rank 8 predicts ~12 MiB and rank 4096 ~210 MiB over it); learning rate 1e-5 barely trains,
so at its first evaluation it is worse than the median of the trials before it and the median pruner stops it.
Module-scoped: the search runs once; each test reads what it left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from storage.models import RunStatus
from storage.store import Store
from tests.browser_helpers import REPO, free_port, start_server, stop_server, tunedeck_command
from tests.training_helpers import tiny_spec, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~4 min on a quiet machine, 15 on a loaded one

MIB = 1024**2
STEPS = 240  # so a trial pruned at its first evaluations is stopped before its end: with one thread the tiny model
# trains ~50 steps a second, and 48 steps raced the search's 2-second turn (a full two-worker run saw no trial pruned)
SPACE = ["learning_rate=[1e-3, 5e-3, 2e-3, 1e-5]", "lora_r=[8, 4096]"]


def _measure_runtime(env: dict[str, str]) -> int:
    """The training child's runtime baseline, measured as the worker measures it, and cached where its worker
    reads it back."""
    code = (
        "from jobs.worker import processes, runtime; import os; "
        "print(runtime.baseline(processes.baseline_argv(), dict(os.environ)).runtime_bytes)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    value = int(done.stdout.strip().splitlines()[-1])
    assert value > 0, done.stderr[-4000:]
    return value


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("search-home")
    env = dict(os.environ, TUNEDECK_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("TUNEDECK_DATABASE_URL", None)
    budget = _measure_runtime(env) + 110 * MIB
    spec = home / "spec.yaml"
    base = tiny_spec(tiny_model, max_steps=STEPS, eval_split=0.25, eval_steps=2, learning_rate=1e-3, lora_r=8)
    spec.write_text(base.to_yaml())
    args = ["search", str(spec), "--trials", "8", "--sampler", "grid", "--objective", "eval_loss"]
    for item in SPACE:
        args += ["--space", item]
    started = subprocess.run(tunedeck_command() + args, env=env, cwd=REPO, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    store = Store(f"sqlite:///{home / 'tunedeck.db'}")
    [search] = store.list_searches()
    extra = {"TUNEDECK_CPU_MEMORY": f"{budget}B"}
    server = start_server(home, free_port(), home / "server.log", extra_env=extra)
    try:

        def mid_search() -> bool:
            trials = store.search_trials(search.id)
            done = [t for t in trials if t.state in ("complete", "pruned")]
            training = [t for t in trials if t.state == "running" and (r := store.get_run(t.run_id)) and r.current_step]
            return bool(done and training)

        wait_for(mid_search, timeout=600, interval=0.5, what="a trial done and another training")
        os.killpg(server.pid, signal.SIGKILL)  # the dashboard and its worker, no cleanup of any kind
        server.wait(30)
        at_kill = store.search_trials(search.id)
        server = start_server(home, free_port(), home / "server2.log", extra_env=extra)
        wait_for(lambda: store.get_search(search.id).state == "finished", timeout=900, interval=1.0, what="the end")
    finally:
        stop_server(server)
    return {"store": store, "search": search, "base": base, "at_kill": at_kill, "home": home}


def test_the_search_ends_better_than_the_default_with_a_pruned_trial(searched: dict[str, Any]) -> None:
    from jobs.search.report import search_report

    store, search = searched["store"], searched["search"]
    report = search_report(store, search.id)
    rows = report.rows
    assert len(rows) == 8, rows
    default = rows[0]
    assert default["params"] == {"learning_rate": 1e-3, "lora_r": 8} and default["state"] == "complete", rows
    assert report.best is not None and report.best["value"] < default["value"], rows
    pruned = [r for r in rows if r["state"] == "pruned"]
    assert pruned, rows
    for row in pruned:
        run = store.get_run(row["run_id"])
        assert run.status is RunStatus.CANCELLED and run.current_step < STEPS, row  # stopped early, by the cancel path
        assert "pruned at step" in row["reason"]


def test_points_that_cannot_fit_are_refused_without_being_queued(searched: dict[str, Any]) -> None:
    store, search = searched["store"], searched["search"]
    refused = [t for t in store.search_trials(search.id) if t.params["lora_r"] == 4096]
    assert len(refused) == 4
    for trial in refused:
        assert trial.state == "infeasible" and trial.run_id is None and "Will not fit" in (trial.reason or ""), trial
    tagged = store.list_runs(tag=f"search-{search.id}")
    assert all(spec_rank(r.spec_json) == 8 for r in tagged)  # no run of rank 4096 was ever queued


def spec_rank(spec_json: str) -> int:
    import json

    return int(json.loads(spec_json)["lora_r"])


def test_a_killed_dashboard_and_worker_resume_with_no_trial_twice_and_none_lost(searched: dict[str, Any]) -> None:
    from jobs.search.study import study_trials

    store, search = searched["store"], searched["search"]
    assert sum(t.state in ("complete", "pruned", "failed", "infeasible") for t in searched["at_kill"]) < 8  # mid-search
    trials = store.search_trials(search.id)
    assert sorted(t.number for t in trials) == list(range(8))  # none lost, none added
    assert all(t.state in ("complete", "pruned", "infeasible") for t in trials), [
        (t.number, t.state, t.reason) for t in trials
    ]
    run_ids = [t.run_id for t in trials if t.run_id is not None]
    assert len(run_ids) == len(set(run_ids)) == 4  # one run per trained trial
    assert sorted(r.id for r in store.list_runs(tag=f"search-{search.id}")) == sorted(run_ids)  # no stray run
    told = study_trials(store, store.get_search(search.id))
    assert len(told) == 8 and all(t.state.is_finished() for t in told)
