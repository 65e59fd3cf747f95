"""A throw-away single-node Slurm for tests: munged, slurmctld and slurmd on this machine, two fake GPUs.

    cluster = SlurmCluster(); cluster.start()     # SLURM_CONF points at it; the node is idle
    cluster.stop()                                # the daemons it started end; the folder goes

Debian's `slurm-wlm` and `munge` packages provide the binaries (`./dev.sh test` installs them when
root); without them the Slurm tests skip with the reason. Everything lives in a temp folder: the
config (`slurm.conf`, `gres.conf` naming two empty files as the GPUs: Slurm needs a file per GPU,
and leaves CUDA_VISIBLE_DEVICES empty for them, so jobs read SLURM_JOB_GPUS), spool, state and
logs, and a munged of its own on its own socket (run as the `munge` user, which owns the key).
Two partitions share the node: `low` (the default) and `high`, whose jobs preempt `low`'s
(`PreemptType=preempt/partition_prio`, `PreemptMode=CANCEL`): a real preemption for the requeue test.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
MUNGE_KEY = Path("/etc/munge/munge.key")


def slurm_missing() -> str | None:
    """Why a Slurm cannot be started here (None when it can)."""
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return f"Slurm/munge binaries not found ({', '.join(missing)}): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user and needs root here"
    if not MUNGE_KEY.exists():
        return f"{MUNGE_KEY} is missing (installing the munge package creates it)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


SLURM_CONF = """\
ClusterName=tunedeck
SlurmctldHost={host}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait={kill_wait}
MinJobAge=300
SchedulerParameters=sched_interval=1
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 Gres=gpu:2 State=UNKNOWN
PartitionName=low Nodes={host} Default=YES PriorityTier=1 MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=high Nodes={host} PriorityTier=2 MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class SlurmCluster:
    """One single-node Slurm in a fresh temp folder; `env` is what a client needs (SLURM_CONF)."""

    def __init__(self, kill_wait: int = 10) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tunedeck-slurm-"))
        self.host = socket.gethostname()
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge" / "munge.socket"
        self.kill_wait = kill_wait
        self.procs: list[subprocess.Popen] = []
        self.env = {"SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60.0) -> None:
        (self.folder / "state").mkdir()
        (self.folder / "spool").mkdir()
        for i, minor in enumerate((3, 5)):  # character devices (null, zero): slurmd then hands out their indices
            try:
                os.mknod(self.folder / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, minor))
            except OSError as exc:  # plain files would do for slurmd, but it would set no SLURM_JOB_GPUS
                raise RuntimeError(f"cannot create the fake GPU devices (mknod: {exc}): this needs CAP_MKNOD") from exc
        self.conf.write_text(
            SLURM_CONF.format(
                host=self.host,
                folder=self.folder,
                munge_socket=self.munge_socket,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                kill_wait=self.kill_wait,
                cpus=max(2, os.cpu_count() or 2),
            )
        )
        (self.folder / "gres.conf").write_text(f"Name=gpu File={self.folder}/gpu[0-1]\n")
        self._start_munge()
        env = {**os.environ, **self.env}
        # -D: in the foreground, as our children (stopped by pid); -i: ignore state saved by an earlier start
        self.procs.append(self._spawn([_bin("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out", env))
        self.procs.append(self._spawn([_bin("slurmd"), "-D", "-f", str(self.conf)], "slurmd.out", env))
        self.wait_idle(timeout)

    def _spawn(self, argv: list[str], out: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.folder / out, "ab") as f:
            return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        folder = self.munge_socket.parent
        folder.mkdir()
        os.chown(folder, munge.pw_uid, munge.pw_gid)
        os.chmod(self.folder, 0o755)
        argv = [
            "runuser",
            "-u",
            "munge",
            "--",
            _bin("munged"),
            "--foreground",
            f"--socket={self.munge_socket}",
            f"--pid-file={folder}/munged.pid",
            f"--log-file={folder}/munged.log",
            f"--seed-file={folder}/munged.seed",
            f"--key-file={MUNGE_KEY}",
        ]
        self.procs.append(self._spawn(argv, "munged.out"))
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self.logs()}")
            time.sleep(0.05)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            list(argv), env={**os.environ, **self.env}, capture_output=True, text=True, check=check, timeout=30
        )

    def wait_idle(self, timeout: float) -> None:
        """Until the node is idle (slurmd registered with its GPUs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args} exited with {proc.returncode}:\n{self.logs()}")
            done = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            if done.returncode == 0 and done.stdout.strip().startswith("idle"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Slurm node did not turn idle within {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        """The end of every daemon log (for a failure message)."""
        parts = []
        for path in sorted(self.folder.rglob("*.log")) + sorted(self.folder.glob("*.out")):
            text = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """End the daemons this cluster started (by pid: slurmd, slurmctld, munged), then remove its folder."""
        self.run("scancel", "--full", "--user=root", check=False)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
