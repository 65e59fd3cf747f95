"""Which GPU a chat process may hold: the device lease rule shared by its manager and the process itself.

A training run's device lease (`Store.device_lease`) wins: the manager (`jobs.chat.process`)
refuses to start answering on a GPU a run holds, and a running chat process
(`jobs.chat.child`) leaves a GPU as soon as a run takes it.
"""

from __future__ import annotations

from jobs.errors import Problem
from storage.roles import ChatRuns

DEVICE_ENV = "TUNEDECK_CHAT_DEVICE"  # where the dashboard's chat answers: a GPU index or UUID, or cpu
GPU_ENV = "TUNEDECK_CHAT_GPU"  # set by the manager for its process: the GPU (as the lease names it) it is on


def busy_problem(store: ChatRuns, gpu: str, host: str | None = None) -> Problem | None:
    """A Problem when a training run holds GPU `gpu` on `host` (its device lease); None when it is free."""
    run_id = store.device_lease(gpu, host=host).get("run_id")
    if run_id is None:
        return None
    run = store.get_run(int(run_id))
    name = f" ({run.name})" if run is not None else ""
    return Problem(
        "device",
        f"GPU {gpu} is training run {run_id}{name}; answering there would take memory the run "
        "needs and could make it run out",
        f"wait for run {run_id} to finish or cancel it (`tunedeck cancel {run_id}`), or start tunedeck "
        f"with {DEVICE_ENV} set to a free GPU (or {DEVICE_ENV}=cpu to answer on the CPU)",
    )
