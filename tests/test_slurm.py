"""The Slurm executor (issue 25): the state mapping and sbatch arguments as tables, the dispatcher's
decisions against a scripted engine, and real runs through a single-node Slurm with two fake GPUs.

The real-Slurm tests (`integration`) start munged, slurmctld and slurmd once for the module
(`slurm_helpers.SlurmCluster`) and skip only where the binaries are missing (`./dev.sh test`
installs them when root). They train the suite's tiny model through `tunedeck`'s dispatcher:
submit -> running -> succeeded on two GPUs at once; a dispatcher restart that adopts its job,
then a cancel from tunedeck; scancel from outside; a real preemption by a job of the `high`
partition, after which the run is requeued and resumes from its checkpoint.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import all_running, dispatchers, explain, quick_spec
from engines import engine_missing
from slurm_helpers import SlurmCluster, slurm_missing
from training_helpers import LONG, tiny_spec, wait_for

from jobs.cluster.dispatch import Dispatcher
from jobs.cluster.engine import EngineError, JobState, Phase, Submission
from jobs.cluster.slurm import SlurmEngine, SlurmSettings, parse_job, phase_of, sbatch_argv, state_of
from jobs.worker.engine_job import gpu_environment
from storage.checkpoints import last_complete
from storage.models import RunStatus
from storage.store import Store

# The dispatcher's store calls run on both databases (a cluster's store is PostgreSQL); the real-Slurm
# tests, whose SQL those cover, on SQLite only.
BACKENDS = ("sqlite", "postgresql")

# ---------------------------------------------------------------------- pure: states and arguments


@pytest.mark.parametrize(
    ("raw", "phase"),
    [
        ("PENDING", Phase.PENDING),
        ("CONFIGURING", Phase.PENDING),
        ("RUNNING", Phase.RUNNING),
        ("COMPLETING", Phase.RUNNING),
        ("COMPLETED", Phase.SUCCEEDED),
        ("FAILED", Phase.FAILED),
        ("OUT_OF_MEMORY", Phase.FAILED),
        ("TIMEOUT", Phase.FAILED),
        ("DEADLINE", Phase.FAILED),
        ("BOOT_FAIL", Phase.FAILED),
        ("CANCELLED", Phase.CANCELLED),
        ("CANCELLED by 0", Phase.CANCELLED),
        ("PREEMPTED", Phase.REQUEUE),
        ("NODE_FAIL", Phase.REQUEUE),
        ("REQUEUED", Phase.REQUEUE),
        ("SOMETHING_NEW", Phase.RUNNING),  # watched on, never ended by a guess
    ],
)
def test_phase_of_slurm_states(raw: str, phase: Phase) -> None:
    assert phase_of(raw) is phase


SCONTROL_TIMEOUT = (
    "JobId=12 JobName=tunedeck-run-3 UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
    "Requeue=0 Restarts=0 BatchFlag=1 ExitCode=0:15 RunTime=00:01:01 TimeLimit=00:01:00 TimeMin=N/A "
    "Partition=low AllocNode:Sid=vm:1 NodeList=node3 BatchHost=node3 TresPerNode=gres:gpu:1 Command=/x/engine.sh"
)


def test_scontrol_line_parses_and_words_the_reason() -> None:
    fields = parse_job(SCONTROL_TIMEOUT)
    assert fields["JobState"] == "TIMEOUT" and fields["NodeList"] == "node3" and fields["AllocNode:Sid"] == "vm:1"
    state = state_of(fields)
    assert state == JobState(Phase.FAILED, "TIMEOUT", "time limit 00:01:00", "node3")
    assert state.describe() == "TIMEOUT (time limit 00:01:00) on node3"


@pytest.mark.parametrize(
    ("fields", "phase", "reason", "node"),
    [
        ({"JobState": "PENDING", "Reason": "Resources", "NodeList": "(null)"}, Phase.PENDING, "Resources", None),
        ({"JobState": "RUNNING", "Reason": "None", "NodeList": "n1"}, Phase.RUNNING, None, "n1"),
        (
            {"JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "1:0"},
            Phase.FAILED,
            "exit code 1; NonZeroExitCode",
            None,
        ),
        ({"JobState": "OUT_OF_MEMORY", "Reason": "OutOfMemory"}, Phase.FAILED, "OutOfMemory", None),
        (
            {"JobState": "PREEMPTED", "Reason": "None"},
            Phase.REQUEUE,
            "preempted by a job of a higher-priority partition",
            None,
        ),
        ({"JobState": "NODE_FAIL", "Reason": "NodeDown"}, Phase.REQUEUE, "NodeDown", None),
    ],
)
def test_state_of(fields: dict[str, str], phase: Phase, reason: str | None, node: str | None) -> None:
    state = state_of(fields)
    assert (state.phase, state.reason, state.node) == (phase, reason, node)


def _job(tmp_path: Path, **kw) -> Submission:
    base = dict(run_id=7, name="tunedeck-run-7", argv=["python", "-m", "x"], env={}, log_path=tmp_path / "engine.log")
    return Submission(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "job", "expected"),
    [
        (SlurmSettings(), {}, ["--gres=gpu:1"]),
        (SlurmSettings(), {"gpu_type": "a100", "gpus": 2}, ["--gres=gpu:a100:2"]),
        (SlurmSettings(), {"gpus": 0}, []),
        (
            SlurmSettings("gpu", "lab", "04:00:00", "high"),
            {"node": "node3"},
            ["--gres=gpu:1", "--partition=gpu", "--account=lab", "--time=04:00:00", "--qos=high", "--nodelist=node3"],
        ),
        (
            SlurmSettings("gpu"),
            {"extra": {"partition": "debug", "mem": "16G"}},
            ["--gres=gpu:1", "--partition=debug", "--mem=16G"],
        ),
    ],
)
def test_sbatch_argv(tmp_path: Path, settings: SlurmSettings, job: dict, expected: list[str]) -> None:
    argv = sbatch_argv(_job(tmp_path, **job), settings, tmp_path / "engine.sh")
    common = [
        "sbatch",
        "--parsable",
        "--job-name=tunedeck-run-7",
        f"--output={tmp_path / 'engine.log'}",
        "--open-mode=append",
        f"--chdir={tmp_path}",
        "--no-requeue",
        "--export=ALL",
    ]
    assert argv == [*common, *expected, str(tmp_path / "engine.sh")]


class Recorder:
    """A stand-in for the Slurm commands: records what was asked, answers as told."""

    def __init__(self, *answers: tuple[int, str, str]) -> None:
        self.calls: list[list[str]] = []
        self.answers = list(answers)

    def __call__(self, argv: list[str], env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        code, out, err = self.answers.pop(0) if self.answers else (0, "", "")
        return subprocess.CompletedProcess(argv, code, out, err)


def test_submit_writes_an_exec_script_and_returns_the_job_id(tmp_path: Path) -> None:
    runner = Recorder((0, "4242;cluster\n", ""))
    assert SlurmEngine(runner=runner).submit(_job(tmp_path)) == "4242"
    assert (tmp_path / "engine.sh").read_text().splitlines()[-1] == "exec python -m x"


def test_sbatch_refusal_carries_its_message_and_names_the_setting(tmp_path: Path) -> None:
    err = "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid partition name specified\n"
    engine = SlurmEngine(SlurmSettings(partition="nope", account="lab"), runner=Recorder((1, "", err)))
    with pytest.raises(EngineError) as caught:
        engine.submit(_job(tmp_path))
    message = str(caught.value)
    assert "invalid partition specified: nope" in message and "--partition nope" in message
    assert "--account" not in message.splitlines()[0]  # only the setting sbatch complained about


def test_state_and_cancel_commands(tmp_path: Path) -> None:
    runner = Recorder((0, SCONTROL_TIMEOUT, ""), (1, "", "slurm_load_jobs error: Invalid job id specified"))
    engine = SlurmEngine(runner=runner)
    assert engine.state("12").raw == "TIMEOUT"
    assert engine.state("13").phase is Phase.GONE
    engine.cancel("12", "TERM")
    engine.cancel("12")
    assert runner.calls[2:] == [["scancel", "--signal=TERM", "--full", "12"], ["scancel", "12"]]
    failing = SlurmEngine(runner=Recorder((1, "", "scancel: error: Unable to contact slurm controller")))
    with pytest.raises(EngineError, match="Unable to contact"):
        failing.cancel("12")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_JOB_GPUS": "1"}, {"CUDA_VISIBLE_DEVICES": "1"}),
        ({"SLURM_STEP_GPUS": "0", "SLURM_JOB_GPUS": "0,1"}, {"CUDA_VISIBLE_DEVICES": "0"}),
        ({"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_GPUS": "1"}, {"CUDA_VISIBLE_DEVICES": "1"}),
        ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "1"}, {}),
        ({}, {}),
    ],
)
def test_gpu_environment(env: dict[str, str], expected: dict[str, str]) -> None:
    assert gpu_environment(env) == expected


# ---------------------------------------------------------------------- the dispatcher against a scripted engine


class ScriptedEngine:
    """An engine whose jobs are in whatever state the test sets."""

    name = "slurm"

    def __init__(self, refuse: str | None = None) -> None:
        self.states: dict[str, JobState] = {}
        self.submitted: list[Submission] = []
        self.cancels: list[tuple[str, str]] = []
        self.refuse = refuse

    def submit(self, job: Submission) -> str:
        if self.refuse:
            raise EngineError(self.refuse)
        self.submitted.append(job)
        job_id = str(100 + len(self.submitted))
        self.states[job_id] = JobState(Phase.PENDING, "PENDING", "Resources")
        return job_id

    def state(self, job_id: str) -> JobState:
        return self.states.get(job_id, JobState(Phase.GONE, "GONE"))

    def cancel(self, job_id: str, signal: str = "KILL") -> None:
        self.cancels.append((job_id, signal))


def _queued(store: Store, tiny: str = "/nonexistent/model", **kw) -> int:
    return store.create_run_unchecked(tiny_spec(Path(tiny), **kw).to_json(), "r", kw.get("pin_host"))


def test_dispatcher_submits_follows_and_requeues_a_preempted_run(store: Store) -> None:
    engine = ScriptedEngine()
    first, second = _queued(store), _queued(store)
    d = Dispatcher(store, engine, max_jobs=1, poll_interval=0.01)
    assert d.submit_next() and not (len(d.tracked) < d.max_jobs)  # one at a time
    job = engine.submitted[0]
    assert job.run_id == first and job.argv[-3:] == ["jobs.worker.engine_job", "--run-id", str(first)]
    assert job.env["TUNEDECK_DATABASE_URL"] == store.url and job.log_path.name == "engine.log"
    run = store.get_run(first)
    assert (run.status, run.engine, run.engine_job_id, run.worker_pid) == (RunStatus.RUNNING, "slurm", "101", None)
    d.poll()
    assert store.get_run(first).engine_state == "PENDING (Resources)"
    engine.states["101"] = JobState(Phase.RUNNING, "RUNNING", node="n1")
    d.poll()
    assert store.get_run(first).engine_state == "RUNNING on n1"
    store.mark_cancelled(first)  # the training child's answer to the engine's SIGTERM
    engine.states["101"] = JobState(Phase.REQUEUE, "PREEMPTED", "preempted")
    d.poll()
    run = store.get_run(first)
    assert run.status is RunStatus.QUEUED and [r.id for r in store.queued()] == [first, second]  # at the head
    messages = [e["message"] for e in store.run_events(first)]
    assert messages[0] == "submitted to Slurm as job 101"
    assert messages[-1] == "Slurm: PREEMPTED (preempted): queued again; it resumes from its last checkpoint"
    assert d.submit_next() and store.get_run(first).engine_job_id == "102"  # submitted again, same run


@pytest.mark.parametrize(
    ("state", "summary"),
    [
        (JobState(Phase.CANCELLED, "CANCELLED"), "cancelled outside tunedeck (Slurm: CANCELLED, e.g. scancel)"),
        (JobState(Phase.FAILED, "TIMEOUT", "time limit 00:01:00"), "Slurm: TIMEOUT (time limit 00:01:00)"),
        (JobState(Phase.FAILED, "OUT_OF_MEMORY", "OutOfMemory"), "Slurm: OUT_OF_MEMORY (OutOfMemory)"),
        (JobState(Phase.GONE, "GONE", "Slurm no longer knows job 101"), "Slurm: GONE (Slurm no longer knows job 101)"),
    ],
)
def test_an_engine_end_fails_the_run_with_the_engines_reason(store: Store, state: JobState, summary: str) -> None:
    engine = ScriptedEngine()
    run_id = _queued(store)
    d = Dispatcher(store, engine)
    d.submit_next()
    store.mark_interrupted(run_id, "the Slurm job received SIGTERM")  # what the job's side writes first
    engine.states["101"] = state
    d.poll()
    run = store.get_run(run_id)
    assert (run.status, run.error_summary) == (RunStatus.FAILED, summary) and not d.tracked


def test_a_run_failed_by_its_job_gains_the_engines_reason(store: Store) -> None:
    engine = ScriptedEngine()
    run_id = _queued(store)
    d = Dispatcher(store, engine)
    d.submit_next()
    store.mark_failed(run_id, "training process killed by signal SIGKILL (9)")  # the job's worker, on an OOM kill
    engine.states["101"] = JobState(Phase.FAILED, "OUT_OF_MEMORY", "OutOfMemory")
    d.poll()
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert run.error_summary == "Slurm: OUT_OF_MEMORY (OutOfMemory); training process killed by signal SIGKILL (9)"
    other = _queued(store)
    d.submit_next()
    store.mark_failed(other, "non-finite loss at step 3")  # the run's own failure: its job exits 1
    engine.states["102"] = JobState(Phase.FAILED, "FAILED", "exit code 1")
    d.poll()
    assert store.get_run(other).error_summary == "non-finite loss at step 3"


def test_a_run_that_reported_itself_keeps_its_status(store: Store) -> None:
    engine = ScriptedEngine()
    run_id = _queued(store)
    d = Dispatcher(store, engine)
    d.submit_next()
    store.mark_succeeded(run_id, {"train_loss": 1.0})
    engine.states["101"] = JobState(Phase.CANCELLED, "CANCELLED")  # a late scancel changes nothing
    d.poll()
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED


def test_cancel_pending_at_once_running_warm_then_kill(store: Store) -> None:
    engine = ScriptedEngine()
    pending, running = _queued(store), _queued(store)
    d = Dispatcher(store, engine, grace_period=0.0, save_grace=0.0)
    d.submit_next(), d.submit_next()
    engine.states["102"] = JobState(Phase.RUNNING, "RUNNING", node="n1")
    store.request_cancel(pending), store.request_cancel(running)
    d.poll()
    assert store.get_run(pending).status is RunStatus.CANCELLED
    assert engine.cancels == [("101", "KILL"), ("102", "TERM")]
    time.sleep(0.01)
    d.poll()
    assert engine.cancels[-1] == ("102", "KILL")
    store.mark_interrupted(running, "the Slurm job received SIGTERM")
    engine.states["102"] = JobState(Phase.CANCELLED, "CANCELLED")
    d.poll()
    assert store.get_run(running).status is RunStatus.CANCELLED  # the user's cancel, not "cancelled outside"


def test_refused_submission_fails_the_run_with_the_engines_message(store: Store) -> None:
    run_id = _queued(store)
    d = Dispatcher(store, ScriptedEngine(refuse="sbatch refused the job: invalid partition (check --partition x)"))
    assert d.submit_next()
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert run.error_summary == "Slurm: sbatch refused the job: invalid partition (check --partition x)"


def test_pin_host_becomes_the_node_and_pin_device_stays_local(store: Store) -> None:
    engine = ScriptedEngine()
    local = store.create_run_unchecked(tiny_spec(Path("/m")).to_json(), "local", None, "0")
    pinned = _queued(store, pin_host="node7")
    d = Dispatcher(store, engine)
    d.submit_next()
    assert engine.submitted[0].run_id == pinned and engine.submitted[0].node == "node7"
    assert not d.submit_next() and store.get_run(local).status is RunStatus.QUEUED


def test_sized_gpu_types_are_published_and_each_run_asks_for_the_smallest_that_fits(store: Store) -> None:
    import json

    from jobs.devices.target import target
    from jobs.queue.saved_prediction import PREDICTION_FILE

    small, large, unknown = _queued(store), _queued(store), _queued(store)
    for run_id, gib in ((small, 10), (large, 30)):
        (store.run_dir(run_id) / PREDICTION_FILE).write_text(json.dumps({"data_bytes": gib * 2**30}))
    engine = ScriptedEngine()
    d = Dispatcher(store, engine, gpu_type="t4=16GiB@7.5,a100=80GiB")
    d.publish_device()  # as `work` does first
    assert d.submit_next() and d.submit_next() and d.submit_next() and not d.submit_next()
    asked = {job.run_id: job.gpu_type for job in engine.submitted}
    assert asked == {small: "t4", large: "a100", unknown: "a100"}
    said = {r: store.run_events(r)[0]["message"] for r in (small, large, unknown)}
    assert said[small].endswith("for GPU type t4 (16.0 GiB): predicted 10.0 GiB")
    assert said[large].endswith("for GPU type a100 (80.0 GiB): predicted 30.0 GiB; t4 (16.0 GiB) leaves too little")
    assert said[unknown].endswith("the largest type")
    store.worker_beat(d.worker_id, 1, d.host)  # while the dispatcher runs, submit checks against its GPU
    chosen = target(store).facts
    assert (chosen.kind, chosen.name, chosen.total_bytes) == ("cuda", "a100 (cluster GPU type)", 80 * 2**30)


def test_a_run_predicted_on_the_dashboards_cpu_is_predicted_again_for_the_clusters_gpus(
    store: Store, tmp_path: Path
) -> None:
    """Submitted before the dispatcher published its GPU: the saved CPU figure (fp32, resident) would ask for
    the largest type; predicted again per type, the run fits the middle one."""
    from test_gpu_types import lora_on_llama_3b

    from jobs.checks.memory import predict_memory
    from jobs.devices.facts import DeviceFacts
    from jobs.queue.saved_prediction import save_prediction

    spec = lora_on_llama_3b(tmp_path)
    run_id = store.create_run_unchecked(spec.to_json(), "r", None)
    cpu = predict_memory(spec, DeviceFacts(kind="cpu", name="cpu", total_bytes=64 * 2**30)).prediction
    save_prediction(store, run_id, cpu)
    engine = ScriptedEngine()
    assert Dispatcher(store, engine, gpu_type="t4=16GiB@7.5,l4=24GiB@8.9,a100=80GiB").submit_next()
    assert engine.submitted[0].gpu_type == "l4"
    said = store.run_events(run_id)[0]["message"]
    assert "for GPU type l4 (24.0 GiB): predicted " in said and "on l4 (saved at submit: " in said


def test_a_restarted_dispatcher_adopts_instead_of_submitting_again(store: Store) -> None:
    engine = ScriptedEngine()
    run_id = _queued(store)
    never = _queued(store)
    first = Dispatcher(store, engine, worker_id="d1")
    first.submit_next()
    store.claim_for_engine("d1", "slurm")  # claimed, then the dispatcher died before submitting it
    second = Dispatcher(store, engine, worker_id="d2")
    assert second.adopt() == [run_id] and len(engine.submitted) == 1
    assert store.get_run(run_id).worker_id == "d2" and store.get_run(never).status is RunStatus.QUEUED
    store.worker_beat("d2", 1, "h")
    assert Dispatcher(store, engine, worker_id="d3").adopt() == []  # d2 is alive: its runs stay its own


def test_a_requeued_cluster_run_taken_by_a_local_worker_is_not_adopted(store: Store) -> None:
    engine = ScriptedEngine()
    run_id = _queued(store)
    d = Dispatcher(store, engine, worker_id="d1")
    d.submit_next()
    store.mark_interrupted(run_id, "the Slurm job received SIGTERM")
    store.requeue(run_id)
    assert store.get_run(run_id).engine is None  # forgotten: the next claim runs it afresh
    assert store.claim_next_on_device("host:1", "0", host="host") is not None
    assert Dispatcher(store, engine, worker_id="d2").adopt() == []


def test_a_version_9_database_gains_the_engine_columns(data_home: Path) -> None:
    import sqlite3

    from storage import models as m

    path = data_home / "old.db"
    store = Store(f"sqlite:///{path}")
    old = store.create_run_unchecked(tiny_spec(Path("/m")).to_json())
    store.dispose()
    with sqlite3.connect(path) as con:  # back to schema 9: the three columns gone
        for column in ("engine", "engine_job_id", "engine_state"):
            con.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        con.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    store = Store(f"sqlite:///{path}")
    assert store.schema_version == m.SCHEMA_VERSION >= 10  # migrated to today's version, past the engine's 10
    assert store.get_run(old).engine is None
    claimed = store.claim_for_engine("d", "slurm")
    assert claimed is not None and (claimed.id, claimed.engine, claimed.engine_state) == (old, "slurm", "submitting")
    store.dispose()


# ---------------------------------------------------------------------- what a user sees: run page, show, CLI


def test_run_page_and_show_name_the_engine_its_job_and_state(store: Store) -> None:
    from app.cli.show import sharing, show_text
    from app.ui.run_text import header_markdown

    ids = [_queued(store), _queued(store)]
    d = Dispatcher(store, ScriptedEngine())
    d.submit_next(), d.submit_next()
    store.set_engine_state(ids[0], "RUNNING on n1")
    run = store.get_run(ids[0])
    assert "engine:   slurm job 101: RUNNING on n1" in show_text(store, run).splitlines()
    assert " · Slurm job 101: <span id='run-engine'>RUNNING on n1</span>" in header_markdown(run)
    assert sharing(store) == {}  # one dispatcher's runs do not share a device
    local = store.get_run(store.create_run_unchecked(tiny_spec(Path("/m")).to_json()))
    assert "engine:" not in show_text(store, local) and "run-engine" not in header_markdown(local)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--partition", "gpu"], "--partition: is an option of a cluster executor"),
        (["--executor", "slurm", "--time-limit", "1h"], "--time-limit: '1h' is not a Slurm time"),
        (["--executor", "slurm", "--max-jobs", "0"], "--max-jobs: is 0"),
        (["--executor", "slurm", "--share", "2"], "--share: is for --executor local"),
        (["--executor", "ray", "--qos", "high"], "--qos: is a Slurm option"),
        (["--executor", "slurm", "--gpu-type", "a100=lots"], "--gpu-type: 'a100=lots': 'lots' is not a memory size"),
        (["--gpu-type", "a100"], "--gpu-type: is an option of a cluster executor"),
    ],
)
def test_worker_cluster_options_are_checked(
    data_home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    from app.cli.main import main

    assert main(["worker", *argv]) == 2
    assert said in capsys.readouterr().err


# ---------------------------------------------------------------------- real Slurm


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    why = slurm_missing()
    if why:
        engine_missing(why)
    cluster = SlurmCluster(kill_wait=15)
    with pytest.MonkeyPatch.context() as mp:
        cluster.start()
        mp.setenv("SLURM_CONF", str(cluster.conf))
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def dispatch(store: Store, slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch):
    """Start a dispatcher on a thread: `dispatch(max_jobs=2)`; every one started is stopped at the end."""
    monkeypatch.setenv("TUNEDECK_CANCEL_GRACE_S", "10")
    with dispatchers(store, SlurmEngine()) as start:
        yield start
    slurm.run("scancel", "--user=root", check=False)


def _started_gpu(store: Store, run_id: int) -> str:
    found = [e["message"] for e in store.run_events(run_id) if " started on " in e["message"]]
    return found[0].rsplit("GPU ", 1)[-1] if found else ""


def _training(store: Store, run_id: int, steps: int = 2) -> None:
    wait_for(
        lambda: store.get_run(run_id).current_step >= steps, timeout=180, interval=0.1, what=f"run {run_id} training"
    )


def _resumed_from(store: Store, run_id: int) -> int:
    """The checkpoint step the run's latest start resumed from (its run event), checked against the child's log."""
    messages = [e["message"] for e in store.run_events(run_id)]
    restart = [m for m in messages if " started on " in m][-1]
    assert "resumes from checkpoint-" in restart, messages
    step = int(restart.rsplit("checkpoint-", 1)[1])
    log = (store.run_dir(run_id) / "train.log").read_text()
    assert f"checkpoint-{step} (step {step})" in log, explain(store, run_id)  # the training child resumed there
    return step


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_two_runs_on_two_gpus_preempted_requeued_resumed_succeed(
    store: Store, tiny_model: Path, dispatch, slurm: SlurmCluster
) -> None:
    """Two runs RUNNING at once, each on its own GPU; a job of the `high` partition that needs both GPUs
    preempts them (Slurm's own preemption); both go back to the queue, are submitted again, resume from
    the checkpoint each saved on Slurm's SIGTERM, and succeed with every step's metrics and their bundle.

    The runs are long (a short one may finish before a loaded slurmctld gets round to preempting it), and
    the high job holds both GPUs until the test has seen both runs queued again and shortened them to end
    four steps after their checkpoint (a test shortcut: users resume the spec they launched)."""
    started = time.monotonic()
    spec = quick_spec(tiny_model, max_steps=100000, save_steps=4)
    ids = [store.create_run(spec) for _ in range(2)]
    d = dispatch(max_jobs=2)
    all_running(store, ids, "Slurm")
    wait_for(lambda: all(_started_gpu(store, i) for i in ids), timeout=60, what="both jobs' workers started")
    assert sorted(_started_gpu(store, i) for i in ids) == ["0", "1"]  # each its own SLURM_JOB_GPUS
    for i in ids:
        _training(store, i, steps=2)
    first_jobs = {i: store.get_run(i).engine_job_id for i in ids}
    go = slurm.folder / "high.go"
    hold = f"while [ ! -e {go} ]; do sleep 0.2; done"
    slurm.run("sbatch", "--partition=high", "--gres=gpu:2", f"--output={slurm.folder}/high.out", "--wrap", hold)
    requeued = lambda i: any("queued again" in e["message"] for e in store.run_events(i))  # noqa: E731
    wait_for(lambda: all(requeued(i) for i in ids), timeout=300, interval=0.2, what="both runs preempted")
    ends = {}
    for i in ids:
        saved = last_complete(store.run_dir(i) / "output")
        assert saved is not None, explain(store, i)
        ends[i] = saved[0] + 4
        store._set(i, spec_json=spec.replace(max_steps=ends[i]).to_json())
    go.touch()
    wait_for(lambda: not d.tracked and not store.queued(), timeout=300, interval=0.2, what="both jobs ended on Slurm")
    print(f"two runs, preempted once, submitted -> succeeded through Slurm in {time.monotonic() - started:.1f} s")
    for i in ids:
        run = store.get_run(i)
        assert run.status is RunStatus.SUCCEEDED, explain(store, i)
        assert run.engine == "slurm" and run.engine_job_id != first_jobs[i]
        assert run.engine_state.startswith("COMPLETED")
        messages = [e["message"] for e in store.run_events(i)]
        assert any(f"job {first_jobs[i]}: PREEMPTED" in m for m in messages), messages
        assert any(m.startswith("Slurm: PREEMPTED") and "queued again" in m for m in messages), messages
        assert _resumed_from(store, i) == ends[i] - 4 >= 2
        assert run.current_step == ends[i]
        assert len(store.metrics(i, ["loss"])) == ends[i]  # every step once: the resumed part replaced the rest
        assert {a.kind for a in store.artifacts(i)} >= {"bundle"}


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_restart_adopts_jobs_then_cancel_and_scancel_from_outside(
    store: Store, tiny_model: Path, dispatch, slurm: SlurmCluster
) -> None:
    """A restarted dispatcher follows the jobs it finds instead of submitting them again; then one run is
    cancelled from tunedeck (cancelled) and the other's job is scancelled from outside (failed, saying so)."""
    cancelled, scancelled = (store.create_run(quick_spec(tiny_model, max_steps=LONG)) for _ in range(2))
    first = dispatch(max_jobs=2)
    for i in (cancelled, scancelled):
        _training(store, i)
    jobs = {i: store.get_run(i).engine_job_id for i in (cancelled, scancelled)}
    first.stop()
    live = lambda: {w["worker_id"] for w in store.live_workers(within_s=60)}  # noqa: E731
    wait_for(lambda: first.worker_id not in live(), timeout=30, what="the first dispatcher gone")
    second = dispatch(max_jobs=2)
    wait_for(lambda: len(second.tracked) == 2, timeout=60, what="both jobs adopted")
    for i in (cancelled, scancelled):
        run = store.get_run(i)
        assert run.status is RunStatus.RUNNING and run.engine_job_id == jobs[i] and run.worker_id == second.worker_id
        submitted = [e for e in store.run_events(i) if e["message"].startswith("submitted to Slurm")]
        assert len(submitted) == 1  # followed, not submitted again
    store.request_cancel(cancelled)
    slurm.run("scancel", jobs[scancelled])
    # The job's side marks a run interrupted on Slurm's SIGTERM; the dispatcher's word, once the job has ended, is final.
    wait_for(lambda: not second.tracked, timeout=120, interval=0.2, what="both jobs ended on Slurm")
    run = store.get_run(cancelled)
    assert run.status is RunStatus.CANCELLED, explain(store, cancelled)
    run = store.get_run(scancelled)
    assert run.status is RunStatus.FAILED, explain(store, scancelled)
    assert run.error_summary.startswith("cancelled outside tunedeck (Slurm: CANCELLED"), run.error_summary
