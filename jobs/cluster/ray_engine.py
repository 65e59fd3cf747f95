"""The Ray engine: each run is a Ray Job, submitted to the head's job server (the dashboard).

    engine = RayEngine("http://head:8265")     # the address `ray start --head` prints for the dashboard
    job_id = engine.submit(submission)         # a Ray Job: entrypoint_num_gpus=gpus, on any node
    engine.state(job_id)                       # JobState(phase=Phase.RUNNING, raw="RUNNING", node="10.0.0.5")
    engine.cancel(job_id)                      # `ray job stop`: SIGTERM, SIGKILL after stop_wait_s

Needs `ray[default]` (`pip install 'tunedeck[ray]'`): the Job Submission API lives in the dashboard.
What a Submission becomes (`submit_args`, pure):
- the entrypoint is the argv, shell-quoted, `exec`'d with stdout and stderr appended to the run's log
  (Ray runs it under `sh -c` in a session of its own and keeps its own driver log besides);
- `entrypoint_num_gpus=gpus`: Ray reserves them and sets CUDA_VISIBLE_DEVICES for the command;
- a GPU type asks for Ray's accelerator resource `accelerator_type:<type>` (every GPU node carries
  one: `accelerator_type:A100`, `accelerator_type:H100`, ...; give a CPU-only test node
  `--resources '{"accelerator_type:FAKE": 1}'`);
- a pinned node (the spec's pin_host) asks for Ray's per-node resource `node:<ip>`; the host is
  looked up among the cluster's live nodes by hostname, IP or Ray node id at submit time;
- `runtime_env={"env_vars": env}` plus RAY_JOB_STOP_WAIT_TIME_S, read by the job's supervisor: how long
  `stop_job`'s SIGTERM may take before Ray sends SIGKILL. It covers the in-job command's own cancel
  grace and checkpoint save (TUNEDECK_CANCEL_GRACE_S + TUNEDECK_SAVE_GRACE_S in the job's env, which
  the dispatcher sets) with a margin; `stop_wait_s` when they are not given.

Ray's states map onto Phase in `job_state` (pure, tested as a table). Two Ray behaviours to know:
- a job Ray cannot place waits PENDING, and Ray fails it after RAY_JOB_START_TIMEOUT_SECONDS
  (15 min by default, set on the head): that comes back as REQUEUE, so the run returns to the queue;
- stopping a PENDING job takes effect when Ray places it: the command starts and gets SIGTERM at once.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jobs.cluster.engine import EngineError, JobState, Phase, Submission

DEFAULT_ADDRESS = "http://127.0.0.1:8265"  # Ray's dashboard port on the head
STOP_WAIT_S = 20 + 300 + 10  # the in-job command's cancel grace + checkpoint save grace + a margin
REASON_CHARS = 300  # Ray's failure messages carry 20,000 characters of log: the run page shows the gist

_PHASES = {
    "PENDING": Phase.PENDING,
    "RUNNING": Phase.RUNNING,
    "SUCCEEDED": Phase.SUCCEEDED,
    "FAILED": Phase.FAILED,
    "STOPPED": Phase.CANCELLED,
}
# The job never got a place (not within Ray's start timeout, or its node went away before it
# started): the run goes back to the queue, as a preempted one does.
_REQUEUE_ERRORS = {"JOB_SUPERVISOR_ACTOR_START_TIMEOUT", "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"}


@dataclass(frozen=True)
class RayNode:
    """A live node as Ray's state API and dashboard report it."""

    node_id: str
    ip: str
    hostname: str = ""
    name: str = ""  # `ray start --node-name` (the IP unless set)

    def names(self) -> set[str]:
        return {n for n in (self.node_id, self.ip, self.hostname, self.name) if n}


def entrypoint(job: Submission) -> str:
    """The shell command Ray runs: the argv, output appended to the run's log (its folder made first)."""
    log = shlex.quote(str(job.log_path))
    folder = shlex.quote(str(job.log_path.parent))
    return f"mkdir -p {folder} && exec {shlex.join(job.argv)} >> {log} 2>&1"


def stop_wait(env: dict[str, str], default: float) -> float:
    """How long Ray waits after SIGTERM: the job's own cancel and save graces (from the dispatcher) + 10 s."""
    try:
        return float(env["TUNEDECK_CANCEL_GRACE_S"]) + float(env["TUNEDECK_SAVE_GRACE_S"]) + 10
    except (KeyError, ValueError):
        return default


def submit_args(job: Submission, node_ip: str | None, stop_wait_s: float) -> dict[str, Any]:
    """The keyword arguments of JobSubmissionClient.submit_job for this job (without submission_id)."""
    resources: dict[str, float] = {}
    if job.gpu_type:
        resources[f"accelerator_type:{job.gpu_type}"] = 0.001
    if node_ip:
        resources[f"node:{node_ip}"] = 0.001
    env = {**job.env, "RAY_JOB_STOP_WAIT_TIME_S": str(int(stop_wait(job.env, stop_wait_s)))}
    return {
        "entrypoint": entrypoint(job),
        "entrypoint_num_gpus": job.gpus or None,
        "entrypoint_resources": resources or None,
        "runtime_env": {"env_vars": env},
        "metadata": {"tunedeck_run": str(job.run_id), "tunedeck_name": job.name},
    }


def pick_node(nodes: Iterable[RayNode], host: str) -> RayNode:
    """The live node named `host` (hostname, IP, node name or node id). Raises EngineError naming it."""
    nodes = list(nodes)
    wanted = {host}
    try:  # a name the nodes know by its address
        wanted |= {str(a[4][0]) for a in socket.getaddrinfo(host, None) if not str(a[4][0]).startswith("127.")}
    except OSError:
        pass  # not resolvable here: only the names Ray reports can match
    found = [n for n in nodes if n.names() & wanted]
    if not found:
        known = ", ".join(f"{n.hostname or '?'} ({n.ip})" for n in nodes) or "none"
        raise EngineError(
            f"pin_host {host!r}: no live node of the Ray cluster is called that (live nodes: {known}). "
            "Fix: set pin_host to one of those hostnames or IPs, or clear it to run on any node"
        )
    return found[0]


def exit_reason(exit_code: int) -> str:
    """'exit code 3' / 'killed by SIGKILL' for the command's exit status (negative: a signal)."""
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


def _gist(message: str | None) -> str | None:
    """The first line of a Ray message, cut to REASON_CHARS."""
    if not message:
        return None
    line = message.strip().splitlines()[0].strip()
    return line[:REASON_CHARS] or None


def node_of(driver_agent_http_address: str | None) -> str | None:
    """The node's address from the job's driver agent URL ('http://10.0.0.5:52365' -> '10.0.0.5')."""
    if not driver_agent_http_address:
        return None
    return urlsplit(driver_agent_http_address).hostname


def node_lost(message: str | None) -> bool:
    """Whether Ray's message says the job's node died (raylet gone, preempted, drained)."""
    return "node has died" in (message or "") or "node was terminated" in (message or "")


def job_state(
    status: str,
    error_type: str | None = None,
    message: str | None = None,
    exit_code: int | None = None,
    node: str | None = None,
    node_dead: bool = False,
) -> JobState:
    """Ray's job status and error, in the dispatcher's Phases. `node_dead`: the job's node is DEAD now."""
    raw = str(status)
    phase = _PHASES.get(raw)
    if phase is None:
        raise EngineError(f"Ray reported job status {raw!r}, which tunedeck does not know (a newer Ray?)")
    reason = _gist(message) if phase in (Phase.PENDING, Phase.FAILED) else None
    if phase is Phase.FAILED:
        kind = str(error_type or "")
        if kind == "JOB_ENTRYPOINT_COMMAND_ERROR" and exit_code is not None:
            reason = exit_reason(exit_code)
        elif kind == "JOB_SUPERVISOR_ACTOR_DIED" and (node_dead or node_lost(message)):
            phase, reason = Phase.REQUEUE, f"node lost: {reason}"
        elif kind in _REQUEUE_ERRORS:
            phase = Phase.REQUEUE
        if kind and reason and kind not in reason:
            reason = f"{reason} [{kind}]"
    return JobState(phase=phase, raw=raw, reason=reason, node=node)


def dashboard_url(address: str) -> str:
    """The dashboard's HTTP address; a bare 'host:port' gets http://. Raises EngineError for others."""
    address = address.strip()
    if "://" not in address:
        address = f"http://{address}"
    if urlsplit(address).scheme not in ("http", "https") or not urlsplit(address).hostname:
        raise EngineError(
            f"Ray address {address!r}: the Ray engine talks to the head's dashboard over HTTP. "
            "Fix: pass the dashboard address `ray start --head` prints, e.g. http://head:8265"
        )
    return address.rstrip("/")


class RayEngine:
    """Runs each Submission as a Ray Job on the cluster whose dashboard is at `address`."""

    name = "ray"

    def __init__(self, address: str | None = None, stop_wait_s: float = STOP_WAIT_S, client: Any = None) -> None:
        # As `ray job submit`: RAY_API_SERVER_ADDRESS, else the dashboard on this machine.
        self.address = dashboard_url(address or os.environ.get("RAY_API_SERVER_ADDRESS") or DEFAULT_ADDRESS)
        self.stop_wait_s = stop_wait_s
        if client is not None:  # a JobSubmissionClient made elsewhere (tests: a scripted one)
            self._client = client
            return
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as e:
            raise EngineError(
                f"the Ray engine needs Ray's job API ({e}). Fix: pip install 'tunedeck[ray]' (ray[default])"
            ) from e
        try:
            self._client = JobSubmissionClient(self.address)
        except (ConnectionError, RuntimeError) as e:
            raise EngineError(self._unreachable(e)) from e

    def _unreachable(self, e: BaseException) -> str:
        return (
            f"cannot reach the Ray dashboard at {self.address} ({e}). Fix: start the head with "
            "`ray start --head --include-dashboard=true` and pass the dashboard address it prints "
            "(http://<head>:8265 unless --dashboard-port says otherwise); `ray status` on the head shows it is up"
        )

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One request to the job server; its refusals become EngineError naming what was asked."""
        import requests

        try:
            return fn(*args, **kwargs)
        except (requests.RequestException, ConnectionError) as e:  # requests' errors are not the builtin's
            raise EngineError(self._unreachable(e)) from e
        except RuntimeError as e:
            raise EngineError(f"Ray at {self.address} refused to {what}: {e}") from e

    def nodes(self) -> list[RayNode]:
        """The cluster's live nodes, with hostnames (state API, plus the dashboard's node summary)."""
        import requests
        from ray.util.state import list_nodes
        from ray.util.state.exception import RayStateApiException

        try:
            listed = self._call("list its nodes", list_nodes, address=self.address)
        except RayStateApiException as e:
            raise EngineError(f"Ray at {self.address} refused to list its nodes: {e}") from e
        alive = [n for n in listed if n.state == "ALIVE"]  # (a state filter trips Ray's truncation check)
        try:  # hostnames: only the dashboard's node summary has them (the state API has IPs and ids)
            summary = requests.get(f"{self.address}/nodes?view=summary", timeout=10).json()["data"]["summary"]
            host = {s["raylet"]["nodeId"]: s.get("hostname", "") for s in summary}
        except (requests.RequestException, KeyError, TypeError, ValueError) as e:
            raise EngineError(f"Ray at {self.address}: cannot read its nodes' hostnames ({e})") from e
        return [RayNode(n.node_id, n.node_ip, host.get(n.node_id, ""), n.node_name or "") for n in alive]

    def submit(self, job: Submission) -> str:
        """Submit the job; its id is the run's name and a random suffix (Ray ids cannot be reused)."""
        node_ip = pick_node(self.nodes(), job.node).ip if job.node else None
        submission_id = f"{job.name}-{secrets.token_hex(4)}"
        kwargs = submit_args(job, node_ip, self.stop_wait_s)
        return str(self._call(f"submit {job.name}", self._client.submit_job, submission_id=submission_id, **kwargs))

    def state(self, job_id: str) -> JobState:
        """The job's state; GONE when Ray does not know the id."""
        try:
            info = self._call(f"read job {job_id}", self._client.get_job_info, job_id)
        except EngineError as e:
            if "status code 404" in str(e) or "does not exist" in str(e):
                return JobState(phase=Phase.GONE, raw="NOT_FOUND", reason=str(e.__cause__)[:REASON_CHARS])
            raise
        error_type = str(info.error_type) if info.error_type else None
        node_dead = False
        if error_type == "JOB_SUPERVISOR_ACTOR_DIED" and info.driver_node_id:
            node_dead = info.driver_node_id not in {n.node_id for n in self.nodes()}
        return job_state(
            str(info.status),
            error_type,
            info.message,
            info.driver_exit_code,
            node_of(info.driver_agent_http_address),
            node_dead,
        )

    def cancel(self, job_id: str, signal: str = "KILL") -> None:
        """`stop_job`: SIGTERM to the command and its children, SIGKILL after stop_wait_s (both signals).

        Ray has no immediate kill in its job API: "KILL" is the same stop, ended by Ray's SIGKILL at the
        latest stop_wait_s later (the in-job command answers SIGTERM by ending its own child first).
        """
        if self.state(job_id).phase.ended:
            return
        self._call(f"stop job {job_id}", self._client.stop_job, job_id)
