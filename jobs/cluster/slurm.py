"""The Slurm engine: runs go to `sbatch`, their state comes from `scontrol show job`, cancel is `scancel`.

    engine = SlurmEngine(partition="gpu", account="lab", time_limit="04:00:00", qos=None)
    job_id = engine.submit(submission)     # sbatch --parsable ... runs/<id>/engine.sh -> "1234"
    engine.state(job_id)                   # JobState(RUNNING, "RUNNING", node="node3")
    engine.cancel(job_id, "TERM")          # scancel --signal=TERM --full 1234

Each job is a script in the run's folder that `exec`s the submission's command (so the command is
the batch step's main process and gets Slurm's signals), with `--gres=gpu:N` (or `gpu:TYPE:N`),
the worker's partition/account/time limit/QoS, `--nodelist` for a run pinned to a host, its output
appended to the run's `engine.log`, and `--no-requeue`: tunedeck requeues a preempted run itself,
under the same run id, from its last checkpoint; Slurm requeueing it under the same job id would
hide the preemption. The state is read with `scontrol show job -o ID`, which knows finished jobs
for `MinJobAge` (300 s by default) and needs no accounting database (`sacct` does); after that the
job is GONE. Every command goes through one function (`run_command`; tests pass their own), and a
refusal carries the command's stderr and names the worker setting it is about.

The state names are Slurm's (`squeue --help`, "JOB STATE CODES"); `phase_of` maps them onto the
dispatcher's `Phase`s, and `state_of` words the reason: "TIMEOUT (time limit 00:01:00)".
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jobs.cluster.engine import EngineError, JobState, Phase, Submission

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 60.0  # slurmctld answers in milliseconds; a busy one in seconds

PHASES: dict[str, Phase] = {
    "PENDING": Phase.PENDING,
    "CONFIGURING": Phase.PENDING,
    "REQUEUE_HOLD": Phase.PENDING,
    "RESV_DEL_HOLD": Phase.PENDING,
    "RUNNING": Phase.RUNNING,
    "COMPLETING": Phase.RUNNING,
    "SUSPENDED": Phase.RUNNING,
    "STOPPED": Phase.RUNNING,
    "SIGNALING": Phase.RUNNING,
    "STAGE_OUT": Phase.RUNNING,
    "RESIZING": Phase.RUNNING,
    "COMPLETED": Phase.SUCCEEDED,
    "FAILED": Phase.FAILED,
    "OUT_OF_MEMORY": Phase.FAILED,
    "TIMEOUT": Phase.FAILED,
    "DEADLINE": Phase.FAILED,
    "BOOT_FAIL": Phase.FAILED,
    "SPECIAL_EXIT": Phase.FAILED,
    "CANCELLED": Phase.CANCELLED,
    "REVOKED": Phase.CANCELLED,
    "PREEMPTED": Phase.REQUEUE,
    "NODE_FAIL": Phase.REQUEUE,
    "REQUEUED": Phase.REQUEUE,
    "REQUEUE_FED": Phase.REQUEUE,
}

# What a job that ended this way was told, when Slurm's Reason field says nothing.
_WHY = {
    "OUT_OF_MEMORY": "the job went over its memory limit",
    "PREEMPTED": "preempted by a job of a higher-priority partition",
    "NODE_FAIL": "its node failed",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "it reached its deadline",
}

Runner = Callable[[list[str], "dict[str, str] | None"], "subprocess.CompletedProcess[str]"]


def run_command(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one Slurm client command, capturing its output (the one place this engine starts processes)."""
    try:
        return subprocess.run(
            argv,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except FileNotFoundError as exc:
        raise EngineError(
            f"{argv[0]} not found: run the slurm worker where Slurm's client commands are installed "
            "(a login node), or install them (Debian: apt-get install slurm-client)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"`{shlex.join(argv)}` did not answer within {COMMAND_TIMEOUT_S:g} s") from exc


def phase_of(raw: str) -> Phase:
    """The dispatcher's phase of a Slurm state ("CANCELLED by 0" counts as CANCELLED); unknown: RUNNING."""
    word = raw.split()[0].rstrip("+") if raw.strip() else ""
    phase = PHASES.get(word)
    if phase is None:
        log.warning("unknown Slurm job state %r: watched as running", raw)
        return Phase.RUNNING
    return phase


_FIELD = re.compile(r"(\S+?)=(.*?)(?=\s\S+?=|\s*$)")


def parse_job(line: str) -> dict[str, str]:
    """`scontrol show job -o` output (one line of Key=Value fields) as a dict."""
    return {key: value.strip() for key, value in _FIELD.findall(line.strip())}


def _given(value: str | None) -> str | None:
    return value if value and value not in ("(null)", "None", "N/A") else None


def state_of(fields: dict[str, str]) -> JobState:
    """A job's state from its `scontrol show job` fields, with Slurm's reason in words."""
    raw = fields.get("JobState", "UNKNOWN")
    phase = phase_of(raw)
    reason = _given(fields.get("Reason"))
    if raw == "TIMEOUT":
        reason = f"time limit {fields.get('TimeLimit', '?')}"
    elif raw == "FAILED" and fields.get("ExitCode"):
        code, _, sig = fields["ExitCode"].partition(":")
        reason = (
            f"exit code {code}"
            + (f", signal {sig}" if sig not in ("", "0") else "")
            + (f"; {reason}" if reason else "")
        )
    elif raw in _WHY and reason is None:
        reason = _WHY[raw]
    node = _given(fields.get("NodeList")) if phase is not Phase.PENDING else None
    return JobState(phase=phase, raw=raw, reason=reason, node=node)


def job_script(argv: list[str]) -> str:
    """The batch script: `exec` the command, so it is the step's main process and gets Slurm's signals."""
    return (
        "#!/bin/bash\n# written by tunedeck (jobs.cluster.slurm); Slurm runs it on the node\nexec "
        + shlex.join(argv)
        + "\n"
    )


@dataclass(frozen=True)
class SlurmSettings:
    """What the worker asks of every job (`tunedeck worker --executor slurm --partition ...`); None: the cluster's default."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # Slurm's forms: "MM", "HH:MM:SS", "D-HH:MM"
    qos: str | None = None

    def named(self, job: Submission) -> list[tuple[str, str, str]]:
        """(word in sbatch's messages, the setting's name, its value) of every setting given."""
        given = [
            ("partition", "--partition", self.partition),
            ("account", "--account", self.account),
            ("time", "--time-limit", self.time_limit),
            ("qos", "--qos", self.qos),
            ("gres", "--gpu-type", job.gpu_type),
            ("node", "the run's pin_host", job.node),
        ]
        return [(word, name, value) for word, name, value in given if value]


def sbatch_argv(job: Submission, settings: SlurmSettings, script: Path) -> list[str]:
    """The sbatch command line of one submission (pure: tested as a table)."""
    extra = dict(job.extra)
    argv = ["sbatch", "--parsable", f"--job-name={job.name}", f"--output={job.log_path}", "--open-mode=append"]
    argv += [f"--chdir={job.log_path.parent}", "--no-requeue", "--export=ALL"]
    if job.gpus:
        argv.append(f"--gres=gpu:{job.gpu_type}:{job.gpus}" if job.gpu_type else f"--gres=gpu:{job.gpus}")
    for option, value in (
        ("partition", extra.pop("partition", settings.partition)),
        ("account", extra.pop("account", settings.account)),
        ("time", extra.pop("time", settings.time_limit)),
        ("qos", extra.pop("qos", settings.qos)),
        ("nodelist", job.node),
    ):
        if value:
            argv.append(f"--{option}={value}")
    argv += [f"--{option}={value}" for option, value in sorted(extra.items())]
    return [*argv, str(script)]


class SlurmEngine:
    """`jobs.cluster.engine.Engine` on Slurm's client commands (see the module docstring)."""

    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None, runner: Runner | None = None) -> None:
        self.settings = settings or SlurmSettings()
        self.runner = runner or run_command

    def _call(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = self.runner(argv, env)
        log.debug("%s -> %s %s", shlex.join(argv), done.returncode, done.stdout.strip())
        return done

    def submit(self, job: Submission) -> str:
        script = job.log_path.with_name("engine.sh")
        script.write_text(job_script(job.argv))
        script.chmod(0o755)
        argv = sbatch_argv(job, self.settings, script)
        done = self._call(argv, job.env)
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            said = " ".join(ln.removeprefix("sbatch: error: ") for ln in done.stderr.strip().splitlines())
            said = said or done.stdout.strip() or f"exit code {done.returncode}"
            hints = [f"{name} {value}" for word, name, value in self.settings.named(job) if word in said.lower()]
            where = f" (check the worker's {', '.join(hints)})" if hints else ""
            raise EngineError(f"sbatch refused the job: {said}{where}\ncommand: {shlex.join(argv)}")
        return job_id

    def state(self, job_id: str) -> JobState:
        argv = ["scontrol", "show", "job", "-o", job_id]
        done = self._call(argv)
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                return JobState(Phase.GONE, "GONE", f"Slurm no longer knows job {job_id}")
            raise EngineError(f"`{shlex.join(argv)}` failed (exit code {done.returncode}): {done.stderr.strip()}")
        return state_of(parse_job(done.stdout.splitlines()[0] if done.stdout.strip() else ""))

    def cancel(self, job_id: str, signal: str = "KILL") -> None:
        # KILL: Slurm's own cancel (SIGTERM to every process, SIGKILL after KillWait); TERM: only the signal.
        argv = ["scancel", "--signal=TERM", "--full", job_id] if signal == "TERM" else ["scancel", job_id]
        done = self._call(argv)
        ended = ("already completing or completed", "invalid job id", "job is pending")
        if done.returncode != 0 and not any(words in done.stderr.lower() for words in ended):
            raise EngineError(f"`{shlex.join(argv)}` failed (exit code {done.returncode}): {done.stderr.strip()}")
