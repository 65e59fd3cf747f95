"""The Ray engine (jobs/cluster/ray_engine.py): Ray's states as Phases (fast), and real Ray Jobs on a
local cluster with two fake GPUs (integration: `pytest -m "" tests/test_ray.py`).

The cluster is one `ray start --head` for the module (tests/ray_helpers.py); the tests wait for
states, never for time. Without ray[default] installed the integration tests skip, except on CI
(`CI=true`), where `./dev.sh test` installs the test extra and a missing Ray is a failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from cluster_helpers import all_running, dispatchers, explain, quick_spec
from engines import engine_missing
from ray_helpers import RayCluster, free_port, ray_missing
from training_helpers import LONG

from jobs.cluster.engine import EngineError, JobState, Phase, Submission
from jobs.cluster.ray_engine import (
    RayNode,
    dashboard_url,
    entrypoint,
    exit_reason,
    job_state,
    pick_node,
    submit_args,
)

# --- fast: the pure mappings -------------------------------------------------------------------

NODE_DIED = (
    "Job supervisor actor died: The actor died unexpectedly before finishing this task.\n\tclass_name: "
    "JobSupervisor\nThe actor died because its node has died. Node Id: 18a6f1c2\n\tthe actor's node was "
    "terminated unexpectedly: health check failed due to missing too many heartbeats"
)


@pytest.mark.parametrize(
    ("status", "error_type", "message", "exit_code", "node_dead", "phase", "reason"),
    [
        (
            "PENDING",
            None,
            "Job has not started yet. It may be waiting for resources",
            None,
            False,
            Phase.PENDING,
            "Job has not started yet. It may be waiting for resources",
        ),
        ("RUNNING", None, "Job is currently running.", None, False, Phase.RUNNING, None),
        ("SUCCEEDED", None, "Job finished successfully.", 0, False, Phase.SUCCEEDED, None),
        ("STOPPED", None, "Job was intentionally stopped.", None, False, Phase.CANCELLED, None),
        (
            "FAILED",
            "JOB_ENTRYPOINT_COMMAND_ERROR",
            "Job entrypoint command failed with exit code 3, last...\nlog",
            3,
            False,
            Phase.FAILED,
            "exit code 3 [JOB_ENTRYPOINT_COMMAND_ERROR]",
        ),
        (
            "FAILED",
            "JOB_ENTRYPOINT_COMMAND_ERROR",
            "failed with exit code -9",
            -9,
            False,
            Phase.FAILED,
            "killed by SIGKILL [JOB_ENTRYPOINT_COMMAND_ERROR]",
        ),
        (
            "FAILED",
            "JOB_SUPERVISOR_ACTOR_DIED",
            NODE_DIED,
            None,
            False,
            Phase.REQUEUE,
            "node lost: Job supervisor actor died: The actor died unexpectedly before finishing this task. "
            "[JOB_SUPERVISOR_ACTOR_DIED]",
        ),
        (
            "FAILED",
            "JOB_SUPERVISOR_ACTOR_DIED",
            "Job supervisor actor died: killed",
            None,
            True,
            Phase.REQUEUE,
            "node lost: Job supervisor actor died: killed [JOB_SUPERVISOR_ACTOR_DIED]",
        ),
        (
            "FAILED",
            "JOB_SUPERVISOR_ACTOR_DIED",
            "Job supervisor actor died: killed",
            None,
            False,
            Phase.FAILED,
            "Job supervisor actor died: killed [JOB_SUPERVISOR_ACTOR_DIED]",
        ),
        (
            "FAILED",
            "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
            "Job supervisor actor failed to start within 900.0 seconds.",
            None,
            False,
            Phase.REQUEUE,
            "Job supervisor actor failed to start within 900.0 seconds. [JOB_SUPERVISOR_ACTOR_START_TIMEOUT]",
        ),
        (
            "FAILED",
            "RUNTIME_ENV_SETUP_FAILURE",
            "runtime_env setup failed: no pip",
            None,
            False,
            Phase.FAILED,
            "runtime_env setup failed: no pip [RUNTIME_ENV_SETUP_FAILURE]",
        ),
    ],
)
def test_ray_states_map_to_phases(status, error_type, message, exit_code, node_dead, phase, reason) -> None:
    state = job_state(status, error_type, message, exit_code, "10.0.0.5", node_dead)
    assert (state.phase, state.raw, state.reason, state.node) == (phase, status, reason, "10.0.0.5")


def test_an_unknown_ray_status_is_an_error_not_a_guess() -> None:
    with pytest.raises(EngineError, match="'DRAINING'"):
        job_state("DRAINING")


def test_exit_reasons() -> None:
    assert [exit_reason(c) for c in (1, -15, -9, -200)] == [
        "exit code 1",
        "killed by SIGTERM",
        "killed by SIGKILL",
        "killed by signal 200",
    ]


def _job(tmp_path: Path, argv: list[str], **kw) -> Submission:
    return Submission(
        run_id=7, name="tunedeck-run-7", argv=argv, env={"A": "1"}, log_path=tmp_path / "r 7" / "log.txt", **kw
    )


def test_submit_args_ask_for_gpus_type_node_and_stop_wait(tmp_path: Path) -> None:
    args = submit_args(_job(tmp_path, ["python", "-m", "x"], gpus=2, gpu_type="A100"), "10.0.0.5", 330)
    assert args["entrypoint_num_gpus"] == 2
    assert args["entrypoint_resources"] == {"accelerator_type:A100": 0.001, "node:10.0.0.5": 0.001}
    assert args["runtime_env"] == {"env_vars": {"A": "1", "RAY_JOB_STOP_WAIT_TIME_S": "330"}}
    assert args["metadata"] == {"tunedeck_run": "7", "tunedeck_name": "tunedeck-run-7"}
    graces = {"TUNEDECK_CANCEL_GRACE_S": "10", "TUNEDECK_SAVE_GRACE_S": "30"}
    job = Submission(1, "r", ["x"], graces, tmp_path / "log")
    assert submit_args(job, None, 330)["runtime_env"]["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] == "50"
    plain = submit_args(_job(tmp_path, ["true"], gpus=0), None, 5)
    assert (plain["entrypoint_num_gpus"], plain["entrypoint_resources"]) == (None, None)


def test_the_entrypoint_runs_the_argv_verbatim_into_the_log(tmp_path: Path) -> None:
    """Quoting survives `sh -c` (as Ray runs it): spaces, quotes and $ reach the program unchanged."""
    job = _job(tmp_path, [sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "it's", "$HOME"])
    subprocess.run(["sh", "-c", entrypoint(job)], check=True)
    subprocess.run(["sh", "-c", entrypoint(job)], check=True)  # appended, not overwritten
    assert job.log_path.read_text() == "['a b', \"it's\", '$HOME']\n" * 2


def test_pick_node_by_hostname_ip_or_id() -> None:
    nodes = [RayNode("id-a", "10.0.0.5", "gpu-a", "10.0.0.5"), RayNode("id-b", "10.0.0.6", "gpu-b", "10.0.0.6")]
    assert [pick_node(nodes, h).node_id for h in ("gpu-b", "10.0.0.5", "id-b")] == ["id-b", "id-a", "id-b"]
    with pytest.raises(EngineError) as e:
        pick_node(nodes, "gpu-z.invalid")
    assert "pin_host 'gpu-z.invalid'" in str(e.value) and "gpu-a (10.0.0.5), gpu-b (10.0.0.6)" in str(e.value)


def test_dashboard_address() -> None:
    assert dashboard_url("head:8265") == "http://head:8265"
    assert dashboard_url("https://head:8265/") == "https://head:8265"
    with pytest.raises(EngineError, match="'ray://head:10001'.*http://head:8265"):
        dashboard_url("ray://head:10001")


def test_describe() -> None:
    state = job_state("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", "x", -9, "10.0.0.5")
    assert state.describe() == "FAILED (killed by SIGKILL [JOB_ENTRYPOINT_COMMAND_ERROR]) on 10.0.0.5"


class ScriptedClient:
    """A JobSubmissionClient that answers each call with the next scripted answer (an exception is raised)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)

    def get_job_info(self, job_id: str):
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_an_unreachable_head_and_an_unknown_job_are_told_apart() -> None:
    """The dispatcher catches EngineError only: requests' ConnectionError must not escape as itself."""
    import requests

    from jobs.cluster.ray_engine import RayEngine

    engine = RayEngine(
        "head:8265",
        client=ScriptedClient(
            requests.ConnectionError("Connection refused"),
            RuntimeError("Request failed with status code 404: Job tunedeck-run-1-ab does not exist."),
            RuntimeError("Request failed with status code 500: boom"),
        ),
    )
    with pytest.raises(EngineError, match=r"cannot reach the Ray dashboard at http://head:8265 \(Connection refused\)"):
        engine.state("tunedeck-run-1-ab")
    gone = engine.state("tunedeck-run-1-ab")
    assert (gone.phase, gone.raw) == (Phase.GONE, "NOT_FOUND") and "does not exist" in gone.reason
    with pytest.raises(EngineError, match="refused to read job tunedeck-run-1-ab: .*500: boom"):
        engine.state("tunedeck-run-1-ab")


# --- integration: a real local Ray cluster ----------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    why = ray_missing()
    if why:
        engine_missing(f"{why} (./dev.sh test installs the test extra)")
    cluster = RayCluster(cpus=2, gpus=2)
    try:
        cluster.start()
        print(f"ray head: up in {cluster.start_seconds:.1f} s, {cluster.head.tree_rss() / 2**20:.0f} MiB PSS")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def engine(ray_cluster):
    from jobs.cluster.ray_engine import RayEngine

    return RayEngine(ray_cluster.address, stop_wait_s=10)


def wait_phase(engine, job_id: str, phases: set[Phase], timeout: float = 90) -> JobState:
    """Poll until the job is in one of `phases`; fails with the last state seen."""
    deadline = time.monotonic() + timeout
    state = engine.state(job_id)
    while state.phase not in phases:
        assert time.monotonic() < deadline, f"job {job_id} still {state.describe()}, waited for {phases}"
        time.sleep(0.2)
        state = engine.state(job_id)
    return state


def wait_file(path: Path, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.1)
    return path.read_text()


def held_job(tmp_path: Path, tag: str, **kw) -> tuple[Submission, Path, Path]:
    """A job that writes its pid to `started`, answers SIGTERM by logging it, and ends when `release` exists."""
    started, release = tmp_path / f"{tag}.started", tmp_path / f"{tag}.release"
    code = (
        "import os, signal, sys, time, pathlib\n"
        "def term(*_):\n    print('got SIGTERM', flush=True); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        f"pathlib.Path({str(started)!r}).write_text(f\"{{os.getpid()}} {{os.environ.get('CUDA_VISIBLE_DEVICES')}}\")\n"
        f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.1)\n"
        "print('released', flush=True)\n"
    )
    job = Submission(
        run_id=1,
        name=f"tunedeck-test-{tag}",
        argv=[sys.executable, "-c", code],
        env={},
        log_path=tmp_path / tag / "log.txt",
        **kw,
    )
    return job, started, release


@pytest.mark.integration
def test_a_job_runs_with_its_env_and_gpu_and_writes_its_log(engine, tmp_path: Path) -> None:
    code = "import os; print('hello', os.environ['GREETING'], 'gpu', os.environ['CUDA_VISIBLE_DEVICES'])"
    job = Submission(
        run_id=1,
        name="tunedeck-test-hello",
        argv=[sys.executable, "-c", code],
        env={"GREETING": "from the env"},
        log_path=tmp_path / "run 1" / "log.txt",
        gpus=1,
    )
    job_id = engine.submit(job)
    assert job_id.startswith("tunedeck-test-hello-")
    state = wait_phase(engine, job_id, {Phase.SUCCEEDED, Phase.FAILED})
    assert state.phase is Phase.SUCCEEDED, state.describe()
    assert state.node  # where it ran
    words = job.log_path.read_text().split()
    assert words[:4] == ["hello", "from", "the", "env"] and words[4] == "gpu" and words[5] in ("0", "1")


@pytest.mark.integration
def test_two_one_gpu_jobs_run_at_once_and_a_third_waits(engine, tmp_path: Path) -> None:
    jobs = [held_job(tmp_path, f"g{i}", gpus=1) for i in range(3)]
    ids = [engine.submit(job) for job, _, _ in jobs[:2]]
    pids_gpus = [wait_file(started).split() for _, started, _ in jobs[:2]]
    assert sorted(g for _, g in pids_gpus) == ["0", "1"]  # each has a GPU of its own
    ids.append(engine.submit(jobs[2][0]))
    # A job that needs no GPU, submitted after the third, runs to the end while the third waits.
    no_gpu = Submission(run_id=1, name="tunedeck-test-cpu", argv=["true"], env={}, log_path=tmp_path / "cpu", gpus=0)
    assert wait_phase(engine, engine.submit(no_gpu), {Phase.SUCCEEDED, Phase.FAILED}).phase is Phase.SUCCEEDED
    third = engine.state(ids[2])
    assert third.phase is Phase.PENDING and third.reason, third.describe()  # both GPUs are taken
    assert not jobs[2][1].exists()
    jobs[0][2].touch()  # the first ends: its GPU goes to the third
    assert wait_phase(engine, ids[0], {Phase.SUCCEEDED, Phase.FAILED}).phase is Phase.SUCCEEDED
    assert wait_file(jobs[2][1]).split()[1] == pids_gpus[0][1]
    assert engine.state(ids[1]).phase is Phase.RUNNING
    for _, _, release in jobs[1:]:
        release.touch()
    assert [wait_phase(engine, i, {Phase.SUCCEEDED, Phase.FAILED}).phase for i in ids[1:]] == [Phase.SUCCEEDED] * 2


@pytest.mark.integration
def test_cancel_sends_sigterm_and_ends_cancelled(engine, tmp_path: Path) -> None:
    job, started, _ = held_job(tmp_path, "c", gpus=1)
    job_id = engine.submit(job)
    wait_file(started)
    engine.cancel(job_id, "TERM")
    state = wait_phase(engine, job_id, {Phase.CANCELLED, Phase.FAILED, Phase.SUCCEEDED})
    assert (state.phase, state.raw) == (Phase.CANCELLED, "STOPPED")
    assert "got SIGTERM" in job.log_path.read_text()  # warm stop first: the command could save
    engine.cancel(job_id, "KILL")  # an ended job: no error


@pytest.mark.integration
def test_a_job_killed_from_outside_fails_with_the_signal(engine, tmp_path: Path) -> None:
    job, started, _ = held_job(tmp_path, "k", gpus=1)
    job_id = engine.submit(job)
    os.kill(int(wait_file(started).split()[0]), signal.SIGKILL)
    state = wait_phase(engine, job_id, {Phase.FAILED, Phase.CANCELLED, Phase.SUCCEEDED})
    assert state.phase is Phase.FAILED and state.reason.startswith("killed by SIGKILL"), state.describe()


@pytest.mark.integration
def test_unknown_job_is_gone(engine) -> None:
    assert engine.state("tunedeck-run-404-deadbeef").phase is Phase.GONE


@pytest.mark.integration
def test_pin_host_runs_on_that_node_or_names_the_host(engine, tmp_path: Path) -> None:
    with pytest.raises(EngineError) as e:
        engine.submit(held_job(tmp_path, "p0", node="no-such-host.invalid")[0])
    assert "pin_host 'no-such-host.invalid'" in str(e.value) and socket.gethostname() in str(e.value)
    job = Submission(
        run_id=1,
        name="tunedeck-test-pin",
        argv=["true"],
        env={},
        log_path=tmp_path / "p" / "log",
        node=socket.gethostname(),
    )
    assert wait_phase(engine, engine.submit(job), {Phase.SUCCEEDED, Phase.FAILED}).phase is Phase.SUCCEEDED


@pytest.mark.integration
def test_a_bad_address_names_the_address_and_the_fix(ray_cluster) -> None:
    from jobs.cluster.ray_engine import RayEngine

    address = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError) as e:
        RayEngine(address)
    assert address in str(e.value) and "ray start --head" in str(e.value)


# --- integration: runs through tunedeck's dispatcher, trained on Ray ---------------------------


@pytest.fixture
def dispatch(store, engine, ray_cluster, monkeypatch: pytest.MonkeyPatch):
    """Start a dispatcher on a thread: `dispatch(max_jobs=2)`; at the end each is stopped and our jobs too."""
    monkeypatch.setenv("TUNEDECK_CANCEL_GRACE_S", "10")
    with dispatchers(store, engine) as start:
        yield start
    ray_cluster.stop_jobs()  # the next test gets both GPUs


def _messages(store, run_id: int) -> list[str]:
    return [e["message"] for e in store.run_events(run_id)]


def _training(store, run_id: int, steps: int = 2) -> None:
    from training_helpers import wait_for

    wait_for(
        lambda: store.get_run(run_id).current_step >= steps or store.get_run(run_id).status.finished,
        timeout=180,
        interval=0.1,
        what=f"run {run_id} training",
    )
    assert store.get_run(run_id).current_step >= steps, explain(store, run_id)


def _job_process(run_id: int) -> psutil.Process:
    """The in-job command (`python -m jobs.worker.engine_job --run-id N`) Ray started for the run."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "jobs.worker.engine_job" in cmd and cmd[-2:] == ["--run-id", str(run_id)]:
            return p
    raise AssertionError(f"no engine_job process for run {run_id}")


@pytest.mark.integration
def test_two_runs_train_on_ray_at_once_and_succeed(store, tiny_model: Path, dispatch) -> None:
    from training_helpers import wait_for

    from storage.models import RunStatus

    began = time.monotonic()
    ids = [store.create_run(quick_spec(tiny_model, max_steps=8)) for _ in range(2)]
    d = dispatch(max_jobs=2)
    all_running(store, ids, "Ray")
    wait_for(lambda: not d.tracked, timeout=240, interval=0.2, what="both jobs ended on Ray")
    print(f"two runs submitted -> succeeded through Ray in {time.monotonic() - began:.1f} s")
    gpus = []
    for i in ids:
        run = store.get_run(i)
        assert run.status is RunStatus.SUCCEEDED, explain(store, i)
        assert run.engine == "ray" and run.engine_job_id.startswith(f"tunedeck-run-{i}-")
        assert run.engine_state.startswith("SUCCEEDED"), run.engine_state
        assert len(store.metrics(i, ["loss"])) == 8
        assert {a.kind for a in store.artifacts(i)} >= {"bundle"}
        assert (store.run_dir(i) / "train.log").is_file() and (store.run_dir(i) / "engine.log").is_file()
        gpus += [m.rsplit("GPU ", 1)[-1] for m in _messages(store, i) if " started on " in m]
    assert sorted(gpus) == ["0", "1"]  # each run had a GPU of its own (Ray's CUDA_VISIBLE_DEVICES)


@pytest.mark.integration
def test_cancel_in_tunedeck_and_ray_job_stop_from_outside(
    store, tiny_model: Path, dispatch, engine, ray_cluster
) -> None:
    """Two runs at once (one start-up paid for both): one cancelled in tunedeck, one stopped with `ray job stop`."""
    from training_helpers import wait_for

    from storage.models import RunStatus

    cancelled, stopped = (store.create_run(quick_spec(tiny_model, max_steps=LONG)) for _ in range(2))
    d = dispatch(max_jobs=2)
    _training(store, cancelled)
    _training(store, stopped)
    store.request_cancel(cancelled)
    ray_cluster.ray("job", "stop", store.get_run(stopped).engine_job_id)
    wait_for(lambda: not d.tracked, timeout=90, interval=0.2, what="both jobs ended on Ray")
    run = store.get_run(cancelled)
    assert run.status is RunStatus.CANCELLED, explain(store, cancelled)
    assert engine.state(run.engine_job_id).raw == "STOPPED"
    run = store.get_run(stopped)
    assert run.status is RunStatus.FAILED, explain(store, stopped)
    assert run.error_summary.startswith("cancelled outside tunedeck (Ray: STOPPED"), run.error_summary


@pytest.mark.integration
def test_a_run_cancelled_while_waiting_on_ray_never_trains(store, tiny_model: Path, dispatch, engine, tmp_path) -> None:
    """Ray stops a PENDING job only once it places it: the command then starts, finds its run cancelled, ends."""
    from training_helpers import wait_for

    from storage.models import RunStatus

    holders = [held_job(tmp_path, f"h{i}", gpus=1) for i in range(2)]  # both GPUs taken
    for job, started, _ in holders:
        engine.submit(job)
        wait_file(started)
    run_id = store.create_run(quick_spec(tiny_model, max_steps=8))
    dispatch()
    wait_for(
        lambda: (store.get_run(run_id).engine_state or "").startswith("PENDING"), timeout=60, what="the job waiting"
    )
    job_id = store.get_run(run_id).engine_job_id
    store.request_cancel(run_id)
    wait_for(lambda: store.get_run(run_id).status.finished, timeout=30, interval=0.1, what="the run cancelled")
    assert store.get_run(run_id).status is RunStatus.CANCELLED
    for _, _, release in holders:
        release.touch()
    assert wait_phase(engine, job_id, {Phase.CANCELLED, Phase.FAILED, Phase.SUCCEEDED}).raw == "STOPPED"
    run = store.get_run(run_id)
    assert run.status is RunStatus.CANCELLED, explain(store, run_id)
    assert not (store.run_dir(run_id) / "train.log").exists()  # no training child was started


@pytest.mark.integration
def test_a_killed_job_fails_the_run_with_the_signal(store, tiny_model: Path, dispatch) -> None:
    from training_helpers import wait_for

    from storage.models import RunStatus

    run_id = store.create_run(quick_spec(tiny_model, max_steps=LONG))
    d = dispatch()
    _training(store, run_id)
    job = _job_process(run_id)
    children = job.children(recursive=True)
    job.kill()
    wait_for(lambda: run_id not in d.tracked, timeout=90, interval=0.2, what="the job ended on Ray")
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED, explain(store, run_id)
    assert run.error_summary.startswith("Ray: FAILED (killed by SIGKILL"), run.error_summary
    # The child has its own session, so Ray's kill of the job's group misses it: it stops by itself
    # (jobs.train.child.stop_with_parent), at its next step.
    _, alive = psutil.wait_procs(children, timeout=60)
    for p in alive:
        p.kill()
    assert not alive, f"the training child {[p.pid for p in alive]} outlived its SIGKILLed job"


@pytest.mark.integration
def test_a_lost_node_requeues_the_run_and_it_resumes_from_its_checkpoint(
    store, tiny_model: Path, dispatch, ray_cluster
) -> None:
    """The only node with the FAKE GPU type dies mid-run; a new one joins; the run resumes there."""
    from training_helpers import wait_for

    from storage.checkpoints import last_complete
    from storage.models import RunStatus

    began = time.monotonic()
    node = ray_cluster.add_node(gpus=1, resources={"accelerator_type:FAKE": 1})
    run_id = store.create_run(quick_spec(tiny_model, max_steps=24, save_steps=4))
    dispatch(gpu_type="FAKE")
    wait_for(
        lambda: last_complete(store.run_dir(run_id) / "output") or store.get_run(run_id).status.finished,
        timeout=180,
        interval=0.1,
        what="a first checkpoint",
    )
    first_job = store.get_run(run_id).engine_job_id
    node.lose()
    wait_for(
        lambda: any("queued again" in m for m in _messages(store, run_id)),
        timeout=60,
        interval=0.1,
        what="the run requeued",
    )
    replacement = ray_cluster.add_node(gpus=1, resources={"accelerator_type:FAKE": 1})
    try:
        wait_for(
            lambda: store.get_run(run_id).status.finished, timeout=240, interval=0.2, what="the resumed run finished"
        )
        run = store.get_run(run_id)
        assert run.status is RunStatus.SUCCEEDED, explain(store, run_id)
        assert run.engine_job_id != first_job
        messages = _messages(store, run_id)
        assert any("node lost" in m and "queued again" in m for m in messages), messages
        restart = [m for m in messages if " started on " in m][-1]
        assert "resumes from checkpoint-" in restart, messages
        step = int(restart.rsplit("checkpoint-", 1)[1])
        assert f"checkpoint-{step} (step {step})" in (store.run_dir(run_id) / "train.log").read_text()
        # Every step after the checkpoint once. The steps before it may lack rows: the node died by
        # SIGKILL, and the child's last unflushed rows (up to jobs/train/callbacks.py's flush interval) died too.
        steps = [m.step for m in store.metrics(run_id, ["loss"])]
        assert [s for s in steps if s > step] == list(range(step + 1, 25)), steps
        assert len(steps) == len(set(steps)), steps
        print(f"lost node -> requeued -> resumed -> succeeded through Ray in {time.monotonic() - began:.1f} s")
    finally:
        replacement.stop()
        node.stop()
