"""The scripting API: named Gradio endpoints with typed, documented parameters.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/", auth=("alice", "password"), analytics_enabled=False)
    out = client.predict(spec_yaml="model: tiny-llama\\nmax_steps: 20\\n", api_name="/submit")
    out["run_id"], out["problems"]            # an id, or null and every problem (field, problem, fix)
    client.predict(run_id=1, names=["loss"], since_step=-1, api_name="/metrics")

Endpoints: submit, runs, run, metrics, memory, cancel, resume, bundle, tag, delete; for a spec's data before
launch: tokens (a row's tokens, each trained or masked) and audit; try_rewards and task (`app.api_tasks`: a grpo
spec's rewards tried on base samples by a worker, and any task followed); and a hyperparameter search's search,
search_show, search_best (`app.api_search`; `client.view_api()` lists them with their parameters). Bad input
raises an error naming the parameter and the fix
(`gradio_client.exceptions.AppError`). A login set with `--auth-file`/`TUNEDECK_AUTH` guards
these routes as it guards the page: pass `auth=(user, password)` to the Client.

`wire(store)` declares the endpoints; call it first inside the dashboard's Blocks so the names
are theirs. `publish(demo)`, called last, takes every other event handler (the form's, the
timers') off the API: the page still calls them, clients and the API page do not see them.

No `from __future__ import annotations` here: Gradio reads these functions' type hints at run
time to type the endpoints.
"""

import math
from collections.abc import Sequence
from typing import Any, TypedDict

import gradio as gr
from gradio.utils import get_function_description

from app import run_summaries
from app.api_data import DataEndpoints, _fail
from app.api_tasks import TaskEndpoints
from app.run_summaries import RunSummary
from app.spec_text import spec_values
from jobs.checks.access import AccessPolicy
from jobs.doctor.findings import Finding, findings_of
from jobs.errors import Problem
from jobs.queue import run_actions
from jobs.queue.run_actions import RunCommandError
from jobs.spec.job import SpecError
from jobs.spec.stored import spec_of
from storage.models import RunStatus
from storage.records import RunRecord
from storage.roles import RunReader
from storage.roles_api import ApiEndpoints, RunDetails
from storage.roles_queue import Submitting
from storage.run_files import DiskUsage

RUN_ENDPOINTS = (
    "submit",
    "runs",
    "run",
    "metrics",
    "memory",
    "cancel",
    "resume",
    "bundle",
    "tag",
    "delete",
    "tokens",
    "audit",
    "try_rewards",  # app.api_tasks
    "task",
)
SEARCH_ENDPOINTS = ("search", "search_show", "search_best")  # `app.api_search`, which the dashboard passes to wire()
ENDPOINTS = RUN_ENDPOINTS + SEARCH_ENDPOINTS
SERIAL = ("submit", "tokens", "audit")  # one call at a time each: they read the data and the tokenizer
MAX_RUNS = 1000


class ProblemData(TypedDict):
    field: str
    problem: str
    fix: str


class Submitted(TypedDict):
    run_id: int | None
    problems: list[ProblemData]


class FindingData(TypedDict):
    code: str
    step: int
    severity: str
    diagnosis: str
    fix: str
    spec_change: dict[str, Any]
    evidence: dict[str, Any]


class RunDetail(RunSummary):
    spec: dict[str, Any]
    final_metrics: dict[str, float | None]
    metric_names: list[str]
    error_detail: str | None
    resumable: bool
    has_bundle: bool
    findings: list[FindingData]


class MetricRow(TypedDict):
    step: int
    value: float | None
    time: float


class MemoryRow(TypedDict):
    time: float
    source: str
    used_bytes: int | None
    total_bytes: int | None
    utilization: float | None
    torch_allocated: int | None
    torch_reserved: int | None
    process_rss: int | None


class Outcome(TypedDict):
    run_id: int
    status: str
    message: str


def problem_data(problems: list[Problem]) -> list[ProblemData]:
    return [ProblemData(field=p.field, problem=p.problem, fix=p.fix) for p in problems]


def _number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def submit_yaml(store: Submitting, spec_yaml: str, policy: AccessPolicy | None = None) -> Submitted:
    """Check a YAML spec as the form does (one `jobs.checks.pipeline.check`, through submit) and queue it."""
    from jobs.queue.submit import submit

    policy = policy or AccessPolicy.dashboard()  # the API is the dashboard's: no custom reward function
    try:
        return Submitted(run_id=submit(store, spec_values(spec_yaml), policy), problems=[])
    except SpecError as exc:
        return Submitted(run_id=None, problems=problem_data(exc.problems))


def detail(store: RunDetails, run: RunRecord, disk: DiskUsage) -> RunDetail:
    from app.ui.served_files import bundle_path

    (summary,) = run_summaries.summaries(store, [run], disk)
    return RunDetail(
        **summary,
        spec=spec_of(run).to_dict(),
        final_metrics={k: _number(v) for k, v in run.final_metrics.items()},
        metric_names=sorted(store.metric_names(run.id)),
        error_detail=run.error_detail,
        resumable=run_actions.resumable(store, run),
        has_bundle=bundle_path(store, run.id) is not None,
        findings=[_finding_data(f) for f in findings_of(store.run_events(run.id))],
    )


def _finding_data(finding: Finding) -> FindingData:
    data = finding.event_data()
    return FindingData(**{k: data[k] for k in FindingData.__annotations__})  # type: ignore[typeddict-item]


def _run(store: RunReader, run_id: int) -> RunRecord:
    try:
        return run_actions.existing_run(store, run_id, "run_id")
    except RunCommandError as exc:
        raise _fail(exc.problems) from None


class Endpoints(DataEndpoints, TaskEndpoints):
    """The API's endpoints over one store, each a method (Gradio types an endpoint from its signature and
    documents it from its docstring). `policy`: what callers may reach on the server (a dashboard behind
    a login: data folders only, no remote code)."""

    store: ApiEndpoints

    def __init__(self, store: ApiEndpoints, policy: AccessPolicy | None = None) -> None:
        from jobs.queue.trial import request_try_rewards

        self.store = store
        self.policy = policy
        self.disk = DiskUsage(store)
        self.request_trial = request_try_rewards  # the task endpoints' (app.api_tasks) queueing, one layer down

    def submit(self, spec_yaml: str) -> Submitted:
        """Check a job spec and queue it. Nothing is queued unless every check passes (fields, model, data, device).

        Parameters:
            spec_yaml: the job spec as YAML text (the fields of the launch form and docs/spec.md's table), e.g. "model: tiny-llama\\nmax_steps: 20".
        Returns:
            run_id: the new run's id, or null when nothing was queued; problems: every problem as {field, problem, fix}, the same ones the launch form shows.
        """
        return submit_yaml(self.store, spec_yaml, self.policy)

    def runs(self, status: str = "all", limit: int = 50, search: str = "", tag: str = "") -> list[RunSummary]:
        """List runs, newest first.

        Parameters:
            status: "all", or one run status: queued, running, succeeded, failed, cancelled, interrupted.
            limit: at most this many runs (1 to 1000).
            search: only runs whose name, tags or note contain this text (case-insensitive); empty: all.
            tag: only runs carrying exactly this tag; empty: all.
        Returns:
            one summary per run: id, name, status, model, method, trainer, tags, note, times (Unix seconds), step, last loss, peak memory and disk use in bytes.
        """
        problems = []
        choices = [s.value for s in RunStatus]
        if (status or "all") not in ["all", *choices]:
            problems.append(
                Problem("status", f"`{status}` is not a run status", f"use all or one of: {', '.join(choices)}")
            )
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_RUNS:
            problems.append(
                Problem("limit", f"`{limit}` is not a whole number from 1 to {MAX_RUNS}", "pass e.g. limit=50")
            )
        if problems:
            raise _fail(problems)
        found = self.store.list_runs(
            None if status in ("all", "", None) else RunStatus(status),
            limit=limit,
            search=search or None,
            tag=tag or None,
        )
        return run_summaries.summaries(self.store, found, self.disk)

    def run(self, run_id: int) -> RunDetail:
        """One run: its summary plus the spec, final metrics, metric names, error detail, whether it can be resumed or its bundle downloaded, and the training doctor's findings.

        Parameters:
            run_id: the run's id (from submit or runs).
        """
        return detail(self.store, _run(self.store, run_id), self.disk)

    def metrics(self, run_id: int, names: list[str] | None = None, since_step: int = -1) -> dict[str, list[MetricRow]]:
        """A run's logged metrics, by name, oldest step first.

        Parameters:
            run_id: the run's id.
            names: metric names to return (e.g. ["loss", "eval_loss", "learning_rate"]); null or empty: all of them.
            since_step: only steps after this one; pass the last step you have to poll for new points (-1: from the start).
        Returns:
            {name: [{step, value, time}, ...]}; a value is null where training logged NaN or infinity.
        """
        _run(self.store, run_id)
        out: dict[str, list[MetricRow]] = {}
        for p in self.store.metrics(
            run_id, names or None, after_step=int(since_step if since_step is not None else -1)
        ):
            out.setdefault(p.name, []).append(MetricRow(step=p.step, value=_number(p.value), time=p.time))
        return out

    def memory(self, run_id: int, since: float = 0.0) -> list[MemoryRow]:
        """A run's memory samples (GPU via NVML and torch, or host RSS on CPU), oldest first.

        Parameters:
            run_id: the run's id.
            since: only samples taken at or after this Unix time (0: all); pass the last time you have to poll.
        Returns:
            [{time, source, used_bytes, total_bytes, utilization, torch_allocated, torch_reserved, process_rss}, ...].
        """
        _run(self.store, run_id)
        keys = MemoryRow.__annotations__
        return [
            MemoryRow(**{k: getattr(p, k) for k in keys})  # type: ignore[typeddict-item]
            for p in self.store.memory_samples(run_id, since=float(since) if since else None)
        ]

    def cancel(self, run_id: int) -> Outcome:
        """Cancel a queued run at once, or ask a running run's worker to stop it (within seconds).

        Parameters:
            run_id: the run's id.
        """
        try:
            done = run_actions.cancel(self.store, run_id, "run_id")
        except RunCommandError as exc:
            raise _fail(exc.problems) from None
        return Outcome(run_id=done.run_id, status=done.status.value, message=done.message)

    def resume(self, run_id: int) -> Outcome:
        """Queue an interrupted or cancelled run again (same id); it continues from its last complete checkpoint.

        Parameters:
            run_id: the run's id.
        """
        try:
            done = run_actions.resume(self.store, run_id, "run_id")
        except RunCommandError as exc:  # the problem is the whole answer; a traceback is noise for a caller
            raise _fail(exc.problems) from None
        return Outcome(run_id=done.run_id, status=RunStatus.QUEUED.value, message=done.message)

    def bundle(self, run_id: int) -> gr.FileData:
        """Download a succeeded run's bundle: a zip of the adapter (or model), tokenizer, spec.yaml, metrics and model card.

        Parameters:
            run_id: the run's id.
        Returns:
            the zip file (gradio_client saves it and returns its local path).
        """
        from app.ui.served_files import bundle_path

        found = _run(self.store, run_id)
        path = bundle_path(self.store, found.id)
        if path is None:
            raise _fail(
                [
                    Problem(
                        "run_id",
                        f"run {found.id} is {found.status.value} and has no bundle",
                        "wait until it has succeeded; failed and cancelled runs leave no bundle",
                    )
                ]
            )
        return gr.FileData(path=str(path), orig_name=path.name)

    def tag(
        self, run_id: int, add: list[str] | None = None, remove: list[str] | None = None, note: str | None = None
    ) -> RunSummary:
        """Add and remove a run's tags, and set its note.

        Parameters:
            run_id: the run's id.
            add: tags to add (letters, digits, . _ : + / -; at most 64 characters each).
            remove: tags to remove.
            note: the run's new note; null keeps it, "" removes it.
        """
        try:
            changed = run_actions.tag(self.store, run_id, add=add or [], remove=remove or [], note=note, field="run_id")
        except RunCommandError as exc:
            raise _fail(exc.problems) from None
        return run_summaries.summaries(self.store, [changed], self.disk)[0]

    def delete(self, run_id: int) -> Outcome:
        """Delete a run with its files (metrics, memory samples, log, checkpoints, bundle). A running run is refused: cancel it first.

        Parameters:
            run_id: the run's id.
        """
        try:
            report = run_actions.delete(self.store, run_id, field="run_id")
        except RunCommandError as exc:
            raise _fail(exc.problems) from None
        self.disk.forget(report.run_id)
        return Outcome(run_id=report.run_id, status="deleted", message=report.message)

    def functions(self) -> list[Any]:
        """The endpoints, in ENDPOINTS' order : bound methods, which `publish` recognises by identity, so pass it this very list."""
        return [getattr(self, name) for name in RUN_ENDPOINTS]


def wire(store: ApiEndpoints, policy: AccessPolicy | None = None, more: Sequence[Any] = ()) -> list[Any]:
    """Declare the API endpoints inside the current gr.Blocks; returns their functions. `policy`: what
    callers may reach on the server (a dashboard behind a login: data folders only, no remote code).
    `more`: the searches' endpoints (`app.api_search.SearchEndpoints.functions()`)."""
    functions = Endpoints(store, policy).functions() + list(more)
    for fn in functions:
        gr.api(fn, api_name=fn.__name__, concurrency_limit=1 if fn.__name__ in SERIAL else None)
    return functions


def publish(demo: gr.Blocks, functions: list[Any]) -> None:
    """Make `functions` the whole API: document their parameters; every other handler becomes private."""
    ours = {id(fn) for fn in functions}
    named: set[str] = set()
    for block_fn in demo.fns.values():
        fn = block_fn.fn
        if fn is None or id(fn) not in ours:
            block_fn.api_visibility = "private"
            continue
        named.add(str(block_fn.api_name))
        _, params, returns = get_function_description(fn)
        inputs: list[Any] = list(block_fn.inputs)  # components, each with the info Gradio's API page shows
        for component, text in zip(inputs, params.values()):
            component._api_info["additional_description"] = text
        outputs: list[Any] = list(block_fn.outputs)
        for component in outputs:
            component._api_info["additional_description"] = " ".join(returns)
    if named != set(ENDPOINTS):  # another event took one of the names first: wire() must run first
        raise RuntimeError(f"API endpoint names {sorted(named)} differ from {sorted(ENDPOINTS)}")
