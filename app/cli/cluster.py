"""`tunedeck worker --executor slurm|ray`: the worker options of a cluster dispatcher, checked, and the dispatcher.

    tunedeck worker --executor slurm --partition gpu --account lab --time-limit 04:00:00 --gpu-type a100 --max-jobs 8
    tunedeck worker --executor slurm --gpu-type t4=16GiB@7.5,a100=80GiB   # each run: the smallest type that fits it
    tunedeck worker --executor ray --ray-address http://head:8265   # the head's dashboard (Job API)

`local` (the default) is the worker of `jobs.worker.loop`; the others claim runs and hand them to
the cluster's scheduler (`jobs.cluster.dispatch`; docs/cluster.md). Every bad value is reported at
once, naming the option.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from app.cli.usage import EXIT_OK, UsageError
from jobs.errors import Problem

if TYPE_CHECKING:
    from storage.roles_worker import Dispatching

EXECUTORS = ("local", "slurm", "ray")
SLURM_OPTIONS = ("partition", "account", "time_limit", "qos")
CLUSTER_OPTIONS = (*SLURM_OPTIONS, "gpu_type", "ray_address")
# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; or UNLIMITED.
_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|INFINITE)$")
_NAME = re.compile(r"^[A-Za-z0-9_.,:-]+$")  # partition lists ("gpu,gpu2"), accounts and QoS


def add_options(s: argparse.ArgumentParser) -> None:
    """The worker's executor and cluster options."""
    s.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="local: train here (default); slurm / ray: hand each run to the cluster's scheduler (docs/cluster.md)",
    )
    s.add_argument("--partition", default=None, help="slurm: the partition(s) to submit to (sbatch --partition)")
    s.add_argument("--account", default=None, help="slurm: the account to charge (sbatch --account)")
    s.add_argument(
        "--time-limit", default=None, metavar="TIME", help="slurm: each job's time limit, e.g. 04:00:00 or 1-00:00"
    )
    s.add_argument("--qos", default=None, help="slurm: the quality of service (sbatch --qos)")
    s.add_argument(
        "--gpu-type",
        default=None,
        metavar="TYPE|NAME=SIZE,...",
        help="slurm/ray: the GPU type every run asks for (gres gpu:TYPE:1), or sized types (t4=16GiB@7.5,a100=80GiB): "
        "each run asks for the smallest its memory prediction fits",
    )
    s.add_argument(
        "--max-jobs",
        type=int,
        default=4,
        metavar="N",
        help="slurm/ray: at most N runs on the cluster at once (waiting or running; default 4)",
    )
    s.add_argument("--ray-address", default=None, metavar="ADDRESS", help="ray: the cluster to connect to")


def problems(args: argparse.Namespace) -> list[Problem]:
    """Every bad cluster option at once (nothing for a local worker that gives none)."""
    found = []
    given = [name for name in CLUSTER_OPTIONS if getattr(args, name, None) is not None]
    if args.executor == "local":
        return [
            Problem(f"--{name.replace('_', '-')}", "is an option of a cluster executor", "add --executor slurm or ray")
            for name in given
        ]
    if args.share != 1:
        found.append(Problem("--share", "is for --executor local", "drop --share: the cluster places each run"))
    if args.device:
        found.append(Problem("--device", "is for --executor local", "drop --device: the cluster hands out the GPUs"))
    if args.max_jobs < 1:
        found.append(Problem("--max-jobs", f"is {args.max_jobs}", "give 1 or more"))
    if args.executor == "ray":
        found += [
            Problem(f"--{name.replace('_', '-')}", "is a Slurm option", "drop it, or use --executor slurm")
            for name in SLURM_OPTIONS
            if getattr(args, name) is not None
        ]
    elif args.ray_address is not None:
        found.append(Problem("--ray-address", "is a Ray option", "drop it, or use --executor ray"))
    if args.time_limit is not None and not _TIME.match(args.time_limit):
        found.append(
            Problem("--time-limit", f"{args.time_limit!r} is not a Slurm time", "give MM, HH:MM:SS or D-HH:MM:SS")
        )
    from jobs.cluster.gpu_types import GpuTypeError, parse_gpu_types

    try:
        parse_gpu_types(args.gpu_type)
    except GpuTypeError as exc:
        found += exc.problems
    for name in ("partition", "account", "qos"):
        value = getattr(args, name)
        if value is not None and not _NAME.match(value):
            found.append(
                Problem(f"--{name.replace('_', '-')}", f"{value!r} is not a name", "letters, digits and _.,:- only")
            )
    return found


def engine_of(args: argparse.Namespace) -> Any:
    """The engine the options name (Ray's is imported only when asked for)."""
    if args.executor == "slurm":
        from jobs.cluster.slurm import SlurmEngine, SlurmSettings

        return SlurmEngine(SlurmSettings(args.partition, args.account, args.time_limit, args.qos))
    try:
        from jobs.cluster.ray_engine import RayEngine  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise UsageError(
            [Problem("--executor", f"ray is not available here ({exc})", "pip install ray, or use --executor slurm")]
        ) from exc
    from jobs.cluster.engine import EngineError

    try:
        return RayEngine(address=args.ray_address)
    except EngineError as exc:  # no head there, a ray:// address, ...: the engine's words, the option named
        fix = "give the head's dashboard address, e.g. --ray-address http://head:8265 (`ray start --head` there)"
        raise UsageError([Problem("--ray-address", str(exc), fix)]) from exc


def cmd_dispatch(store: Dispatching, args: argparse.Namespace) -> int:
    """`tunedeck worker --executor slurm|ray`: the dispatcher until SIGTERM (or, with --burst, until nothing is left)."""
    found = problems(args)
    if found:
        raise UsageError(found)
    from jobs.cluster.dispatch import Dispatcher

    dispatcher = Dispatcher(store, engine_of(args), max_jobs=args.max_jobs, gpu_type=args.gpu_type)
    done = dispatcher.work(burst=args.burst)
    if args.burst:
        print(f"worker: {done} run(s) submitted to {args.executor}", file=sys.stderr)
    return EXIT_OK
