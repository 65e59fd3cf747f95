"""A throw-away local Ray cluster for tests: `ray start --head` with fake GPUs on free ports.

The head runs as `ray start --head --block` in a session of its own, so the fixture stops exactly
its own processes (a plain `ray stop` ends every Ray process on the machine). Every port is chosen
free (Ray's defaults, 8265, 6379, 10001, 52365, collide between clusters), the object store is
kept small (it reserves shared memory), and the head finds a dead node in ~2 s instead of Ray's ~15 s.
A worker node (`add_node`) is a second raylet on this machine; killing its process tree is a node lost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; its default is 30% of RAM in /dev/shm
# The GCS marks a node dead after this many missed health checks of this period (Ray: 3 s x 5).
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}


def ray_missing() -> str | None:
    """Why a Ray cluster cannot be started here (None when it can)."""
    try:
        import ray.job_submission  # noqa: F401
    except ImportError:
        return "ray[default] is not installed (pip install -e '.[ray]')"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray_cli() -> str:
    return str(Path(sys.executable).parent / "ray")


def _kill_tree(proc: subprocess.Popen, sig: int) -> None:
    """Signal the process and every descendant (a node's raylet, agents, workers, their jobs)."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


class RayNodeProcess:
    """One `ray start --block` process (head or worker) and its log."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [_ray_cli(), "start", "--block", "--disable-usage-stats", *args],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env},
        )

    def tree_rss(self) -> int:
        """Resident bytes of the node's processes (PSS where the kernel gives it: shared pages once)."""
        total = 0
        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        for p in procs:
            try:
                total += getattr(p.memory_full_info(), "pss", p.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total

    def lose(self) -> None:
        """The node dies at once, as on a power cut: SIGKILL to every process of it."""
        _kill_tree(self.proc, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (`ray start --block` then stops its node), SIGKILL what is left after 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        _kill_tree(self.proc, signal.SIGKILL)


class RayCluster:
    """A head with `gpus` fake GPUs; `address` is its dashboard (the Ray engine's address)."""

    def __init__(self, cpus: int = 2, gpus: int = 2) -> None:
        # Short: Ray puts unix sockets under it (108-byte limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.cpus, self.gpus = cpus, gpus
        self.dashboard_port = free_port()
        self.gcs_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.head: RayNodeProcess | None = None
        self.workers: list[RayNodeProcess] = []
        self.start_seconds = 0.0

    def _node_ports(self) -> list[str]:
        return [
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
        ]

    def start(self, timeout: float = 120) -> None:
        began = time.monotonic()
        self.head = RayNodeProcess(
            [
                "--head",
                f"--num-cpus={self.cpus}",
                f"--num-gpus={self.gpus}",
                f"--temp-dir={self.temp_dir}",
                f"--port={self.gcs_port}",
                f"--dashboard-port={self.dashboard_port}",
                "--dashboard-host=127.0.0.1",
                f"--ray-client-server-port={free_port()}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                "--include-dashboard=true",
                *self._node_ports(),
            ],
            self.temp_dir / "head.log",
            FAST_NODE_DEATH,
        )
        self._wait_nodes(1, timeout, self.head)
        self.start_seconds = time.monotonic() - began

    def live_nodes(self) -> list:
        from ray.util.state import list_nodes

        return [n for n in list_nodes(address=self.address) if n.state == "ALIVE"]

    def _wait_nodes(self, count: int, timeout: float, proc: RayNodeProcess) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {proc.proc.returncode}:\n{proc.log.read_text()[-4000:]}")
            try:
                if len(self.live_nodes()) >= count:
                    return
            except Exception:  # noqa: BLE001 - the dashboard is not up yet; its log is shown on timeout
                pass
            time.sleep(0.25)
        raise RuntimeError(f"Ray did not show {count} live node(s) in {timeout} s:\n{proc.log.read_text()[-4000:]}")

    def add_node(self, gpus: int, resources: dict[str, float], timeout: float = 60) -> RayNodeProcess:
        """A worker node on this machine with `gpus` fake GPUs and custom resources."""
        count = len(self.live_nodes()) + 1
        node = RayNodeProcess(
            [
                f"--address=127.0.0.1:{self.gcs_port}",
                "--num-cpus=1",
                f"--num-gpus={gpus}",
                f"--resources={json.dumps(resources)}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                *self._node_ports(),
            ],
            self.temp_dir / f"worker-{len(self.workers)}.log",
            {},
        )
        self.workers.append(node)
        self._wait_nodes(count, timeout, node)
        return node

    def ray(self, *args: str) -> str:
        """`ray <args>` against this cluster (the job CLI reads RAY_API_SERVER_ADDRESS)."""
        env = {**os.environ, "RAY_API_SERVER_ADDRESS": self.address}
        done = subprocess.run([_ray_cli(), *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"ray {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def stop_jobs(self) -> None:
        """Stop every job still running or waiting (the tests' leftovers), so the next test has the GPUs."""
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(self.address)
        for job in client.list_jobs():
            if not job.status.is_terminal() and job.submission_id:
                client.stop_job(job.submission_id)

    def stop(self) -> None:
        for node in self.workers:
            node.stop()
        if self.head is not None:
            self.head.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # session logs, sockets, spilled objects
