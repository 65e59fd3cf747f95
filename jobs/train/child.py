"""The training child: one run, one process. The worker spawns it; it is also runnable by hand.

    python -m jobs.train.child --run-id 7        # reads the spec from the store, trains, records

It loads the run's `JobSpec` from the store (TUNEDECK_DATABASE_URL / TUNEDECK_HOME) once, parsed
strictly: a stored spec this version cannot read fails the run with the fields named, and nothing
is trained (after an OOM recovery, the spec that recovery recorded: `jobs.train.recipe.load_spec`).
Then the run's recipe (`jobs.train.recipe.Recipe`) sets up, trains, saves and cleans up: the metrics
sinks (the store, then each `report_to` tracker: one that cannot start fails the run before it trains),
the model, data and trl/peft/bitsandbytes configs mapped by the pure `jobs.config.mapping`, and the
trainer the spec's `trainer` names, each built from its record (`jobs.spec.trainer_records`), with
`StoreCallback` and `PhaseProbe` (memory at the points of the first optimizer step, kept as the run's
`phases.json`: `jobs.train.phases`); it trains, evaluates, answers a few held-out prompts with the base
(before training) and the result (after: `jobs.train.before_after`), writes the bundle
(`jobs.train.artifacts`) and marks the run succeeded; any exception marks it failed with a one-line
summary and the traceback (exit 1).
SIGTERM stops training at the next step boundary, saves a checkpoint there and marks the run
cancelled (exit 0); so does the death of the process that started it, where it was asked to watch
that one (`jobs.train.parent_watch`: a cluster job's child). A run put back in the
queue (`tunedeck resume`) continues from its last complete checkpoint (`storage.checkpoints`) with
optimizer, scheduler and RNG state; its metric rows after that step are deleted first, so none is
duplicated. A non-finite loss fails the run ("non-finite loss at step N") and keeps the last good
checkpoint; a full disk while saving fails it with the folder named and the half-written checkpoint
removed. A CUDA out-of-memory error in training, with `on_oom: recover`, records the next memory
trick as a run event and exits with `jobs.train.oom.EXIT_OOM_RECOVER`; the worker starts the run
again with that change (`jobs.train.oom`). On a shared device the child caps its CUDA memory at its
share; an OOM it cannot recover from there exits with `EXIT_OUTGREW_SHARE`, and the worker queues the
run to run alone (`jobs.train.share_cap`). Output goes to stdout, which the worker sends to the run's
train.log.

`run(run_id)` is the run with the store around it; `jobs.train.training.train_spec(spec, output_dir,
callbacks)` does the training without any store (tests, bench); `jobs.train.failure` words the errors.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from jobs.train.callbacks import STOP_REQUESTED
from jobs.train.parent_watch import stop_with_parent
from jobs.train.recipe import Recipe, load_spec, run_recipe, setup_logging
from storage.roles import TrainingRecord

log = logging.getLogger("jobs.train.child")  # named: run as `-m`, this module is __main__


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Ask the training loop to stop at the next step boundary."""
    log.warning("received signal %s: stopping at the next step", signum)
    STOP_REQUESTED.set()


def run(run_id: int, store: TrainingRecord | None = None, callbacks: Sequence[Any] = ()) -> int:
    """Train run `run_id` from the store; returns the process exit code.

    `callbacks`: extra trainer callbacks (tests inject faults through them)."""
    from storage.store import Store

    store = store or Store()
    spec = load_spec(store, run_id)
    return 1 if spec is None else run_recipe(Recipe(store, run_id, spec, callbacks))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `--run-id`, set up logging (`setup_logging`), install the SIGTERM handler, train."""
    parser = argparse.ArgumentParser(description="Train one tunedeck run (spawned by the worker).")
    parser.add_argument("--run-id", type=int, required=True)
    ns = parser.parse_args(argv)
    setup_logging()
    signal.signal(signal.SIGTERM, _on_sigterm)
    stop_with_parent(_on_sigterm)
    return run(ns.run_id)


if __name__ == "__main__":
    sys.exit(main())
