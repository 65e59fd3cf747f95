"""What a cluster job runs: one run, already claimed by a dispatcher, run as a local worker runs it.

    python -m jobs.worker.engine_job --run-id 7      # in a Slurm batch script or a Ray task (jobs.cluster.dispatch)

The dispatcher (`jobs.cluster.dispatch`) claimed the run and handed it to the cluster; on the node
this process runs it through `jobs.worker.loop.Worker.execute`, as a local worker would: the
training child (`python -m jobs.train.child`, output in `runs/<id>/train.log`), heartbeats, the
memory sampler, the store's cancel flag (SIGTERM to the child, SIGKILL after the grace period),
out-of-memory recovery and how the child ended. It takes no device lease: the cluster gave the
job its GPU. Where the cluster names the GPU only in SLURM_STEP_GPUS / SLURM_JOB_GPUS (and leaves
CUDA_VISIBLE_DEVICES empty), the child is shown that GPU.

SIGTERM from the cluster (a preemption, a time limit, a cancel from outside) stops the run warm:
the run is marked interrupted, the child saves a checkpoint at its next step and stops, and the
dispatcher, which reads the job's end from the cluster, gives the run its final status (requeued
after a preemption, failed with the cluster's reason otherwise, cancelled after a tunedeck cancel).
Exit code 0 unless the run failed (1), so the cluster's own state agrees with the run's.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from types import FrameType

from jobs.devices.sampler import GpuProbe, Sampler
from jobs.train.parent_watch import STOP_WITH_PARENT_ENV
from jobs.worker.loop import Worker
from jobs.worker.outcome import quietly
from storage.checkpoints import last_complete
from storage.models import RunStatus
from storage.store import Store

log = logging.getLogger("jobs.worker.engine_job")  # named: run as `-m`, this module is __main__

GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")  # the GPUs Slurm gave the job, as indices


def gpu_environment(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES from the cluster's own variables when it is unset or empty ({} when nothing changes)."""
    if env.get("CUDA_VISIBLE_DEVICES"):
        return {}
    for name in GPU_VARIABLES:
        if env.get(name):
            return {"CUDA_VISIBLE_DEVICES": env[name]}
    return {}


def engine_label() -> str:
    return (os.environ.get("TUNEDECK_ENGINE") or "cluster").capitalize()


def run_job(run_id: int, store: Store | None = None) -> int:
    """Run the claimed run `run_id` here; returns the exit code (0 unless it failed)."""
    store = store or Store()
    run = store.get_run(run_id)
    if run is None or run.status is not RunStatus.RUNNING:
        log.warning("run %s is %s: nothing to do", run_id, run.status.value if run else "gone")
        return 0
    os.environ.update(gpu_environment(os.environ))
    os.environ[STOP_WITH_PARENT_ENV] = str(os.getpid())  # the child stops if this process is killed
    host = socket.gethostname()
    label = engine_label()
    worker = Worker(store, worker_id=f"{label.lower()}-job@{host}:{os.getpid()}", sample=False)
    from jobs.devices.probe import nvml_facts

    worker.trains_on_cpu = nvml_facts(0) is None  # the child's allocator settings follow (Worker.child_env)

    def on_sigterm(signum: int, _frame: FrameType | None) -> None:
        # Marked interrupted (not cancelled) by the worker; the dispatcher settles it from the cluster's state.
        worker.stop(f"the {label} job received {signal.Signals(signum).name} (preempted, out of time or cancelled)")

    previous = {sig: signal.signal(sig, on_sigterm) for sig in (signal.SIGTERM, signal.SIGINT)}
    where = f" on {host}" + (
        f", GPU {os.environ['CUDA_VISIBLE_DEVICES']}" if os.environ.get("CUDA_VISIBLE_DEVICES") else ""
    )
    last = last_complete(store.run_dir(run_id) / "output")
    resumes = f"; it resumes from checkpoint-{last[0]}" if last else ""
    quietly(store.add_run_event, run_id, "engine", f"{label} job {run.engine_job_id or '?'} started{where}{resumes}")
    log.info("run %s: starting%s%s", run_id, where, resumes)
    sampler = Sampler(store, GpuProbe(), worker_id=worker.worker_id)
    sampler.start()
    worker.sampler = sampler
    try:
        status = worker.execute(run)
    finally:
        sampler.stop()
        quietly(store.worker_gone, worker.worker_id)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("run %s: %s", run_id, status.value)
    return 1 if status is RunStatus.FAILED else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run one claimed tunedeck run on a cluster node (the dispatcher submits it)."
    )
    parser.add_argument("--run-id", type=int, required=True)
    ns = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_job(ns.run_id)


if __name__ == "__main__":
    sys.exit(main())
