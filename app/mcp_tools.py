"""tunedeck's tools for agents (the Model Context Protocol): what an agent may do to runs, on one store.

    tunedeck mcp                          # stdio, for desktop agents (Claude Desktop, editors, ...)
    http://127.0.0.1:7860/mcp             # the same tools on the dashboard, behind its login or token

Every tool goes through the code the form and the scripting API use (`app.api.Endpoints`: one submit, one
set of checks, one access policy): an agent can do nothing a dashboard user of the same server could not
(no code it brings, no files outside the data folders when the dashboard has a login). Nothing here loads
a model: chat and export are carried out by a worker that reaches the run, as the Chat tab's and Export
tab's are. A refusal is a tool error naming the field, the problem and the fix.

Tools: runs, run, plan, submit, cancel, resume, metrics, log, chat, export, tasks.
Resources: `tunedeck://runs/{run_id}/spec` (the run's spec as YAML), `tunedeck://runs/{run_id}/log`
(the last lines of its training log).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import TypedDict  # pydantic (the MCP SDK's schemas) needs it on Python < 3.12

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem, ProblemError
from storage.roles import CheckReader, RunReader
from storage.roles_api import McpResults, McpTools
from storage.roles_chat import ChatAnswers
from storage.roles_tasks import ExportOnWorker

NAME = "tunedeck"
LOG_LINES_MAX = 2000
CHAT_TOKENS_MAX = 4096
T = TypeVar("T")


class PlanData(TypedDict):
    total_bytes: int | None
    verdict: str | None
    phase: str | None
    trainable_params: int | None
    total_params: int | None
    prediction: dict[str, Any] | None
    problems: list[dict[str, str]]


class TaskData(TypedDict):
    id: int
    run_id: int
    kind: str
    status: str
    result: dict[str, Any] | None
    error: str | None


def refused(problems: list[Problem]) -> Exception:
    """The tool error an agent reads: each problem as `field: problem (fix)`."""
    from mcp.server.mcpserver.exceptions import ToolError

    return ToolError("; ".join(str(p) for p in problems))


def _answered(call: Callable[[], T]) -> T:
    """`call()`, with the API's refusals (gr.Error) and the checks' (ProblemError) as tool errors."""
    import gradio as gr
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return call()
    except ProblemError as exc:
        raise refused(exc.problems) from None
    except gr.Error as exc:
        raise ToolError(str(exc.message)) from None


def _whole_number(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise refused([Problem(field, f"`{value}` is not a whole number from {low} to {high}", f"pass e.g. {low}")])
    return value


def plan_data(store: CheckReader, spec_yaml: str, policy: AccessPolicy) -> PlanData:
    """The memory prediction submit would make for `spec_yaml`, with every problem submit would refuse it for."""
    from app.spec_text import spec_values
    from jobs.checks.pipeline import check
    from jobs.spec.job import SpecError

    try:
        checked = check(spec_values(spec_yaml), policy=policy, store=store)
    except SpecError as exc:
        raise refused(exc.problems) from None
    prediction = checked.prediction
    out = prediction.to_dict() if prediction is not None else None
    return PlanData(
        total_bytes=prediction.total_bytes if prediction is not None else None,
        verdict=out.get("verdict") if out else None,
        phase=prediction.phase if prediction is not None else None,
        trainable_params=prediction.trainable_params if prediction is not None else None,
        total_params=prediction.total_params if prediction is not None else None,
        prediction=out,
        problems=[{"field": p.field, "problem": p.problem, "fix": p.fix} for p in checked.problems],
    )


def log_text(store: RunReader, run_id: int, lines: int) -> str:
    from jobs.queue.run_actions import existing_run
    from storage.run_files import log_tail

    run = existing_run(store, run_id, "run_id")
    return log_tail(run.log_path, lines) or f"run {run.id} has no training log yet ({run.status.value})"


def spec_text(store: RunReader, run_id: int) -> str:
    from jobs.queue.run_actions import existing_run
    from jobs.spec.stored import spec_of

    return spec_of(existing_run(store, run_id, "run_id")).to_yaml()


def task_data(task: Any) -> TaskData:
    return TaskData(
        id=task.id, run_id=task.run_id, kind=task.kind, status=task.status.value, result=task.result, error=task.error
    )


async def chat_answer(store: ChatAnswers, run_id: int, prompt: str, system: str, base: bool, max_tokens: int) -> str:
    """One answer from a finished run (or its base), through the worker's chat service as `/v1` asks it."""
    from starlette.concurrency import run_in_threadpool

    from app.openai_api import parse, whole
    from app.openai_fields import ApiError, check_prompt
    from app.ui.chat import reach_problem

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    model = await run_in_threadpool(_model_name, store, run_id, base)
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    try:
        ask = await run_in_threadpool(parse, store, body, True)
        await run_in_threadpool(check_prompt, store, ask)
        problem = await run_in_threadpool(reach_problem, store, ask.run_id)
        if problem is not None:
            raise refused([Problem("worker", problem.replace("**", ""), "start `tunedeck worker`")])
        answer = await whole(store, ask, True)
    except ApiError as exc:
        raise refused([Problem(exc.param or "prompt", exc.message, "see the tool's description")]) from None
    return str(answer["choices"][0]["message"]["content"])


def _model_name(store: RunReader, run_id: int, base: bool) -> str:
    """The `/v1` model name of a run's result, or of the base model it was trained from."""
    from jobs.queue.run_actions import existing_run
    from jobs.spec.stored import spec_of

    run = existing_run(store, run_id, "run_id")
    return spec_of(run).model if base else str(run.id)


def build(store: McpTools, policy: AccessPolicy) -> Any:
    """The MCP server (`mcp.server.mcpserver.MCPServer`) of tunedeck's tools over `store`, under `policy`."""
    from mcp.server.mcpserver import MCPServer

    from app.api import Endpoints

    api = Endpoints(store, policy)
    server = MCPServer(
        NAME,
        instructions=(
            "tunedeck fine-tunes language models. Compose a job spec as YAML (docs/spec.md: model, dataset, "
            "method, trainer, hyper-parameters), `plan` it to learn whether it fits, `submit` it, follow it "
            "with `run`, `metrics` and `log`, then `chat` with the result or `export` it."
        ),
    )

    _run_tools(server, api, store, policy)
    _result_tools(server, api, store)
    return server


def _run_tools(server: Any, api: Any, store: CheckReader, policy: AccessPolicy) -> None:
    """The tools that read, plan, queue and stop runs."""

    @server.tool()
    def runs(status: str = "all", limit: int = 50, search: str = "", tag: str = "") -> list[dict[str, Any]]:
        """List runs, newest first: id, name, status, model, method, trainer, tags, step, last loss, peak memory.
        status: all, queued, running, succeeded, failed, cancelled or interrupted; limit: 1 to 1000."""
        return [dict(r) for r in _answered(lambda: api.runs(status, limit, search, tag))]

    @server.tool()
    def run(run_id: int) -> dict[str, Any]:
        """One run: summary, spec, final metrics, metric names, error detail, resumable, the training doctor's findings."""
        return dict(_answered(lambda: api.run(run_id)))

    @server.tool()
    def plan(spec_yaml: str) -> PlanData:
        """Predict a job spec's peak memory on the workers' device without queueing it, with every problem
        submit would refuse it for (field, problem, fix)."""
        return _answered(lambda: plan_data(store, spec_yaml, policy))

    @server.tool()
    def submit(spec_yaml: str) -> dict[str, Any]:
        """Check a job spec (YAML) and queue it. Returns run_id, or null and every problem (field, problem, fix)."""
        return dict(_answered(lambda: api.submit(spec_yaml)))

    @server.tool()
    def cancel(run_id: int) -> dict[str, Any]:
        """Cancel a queued run, or ask a running run's worker to stop it (it saves a checkpoint)."""
        return dict(_answered(lambda: api.cancel(run_id)))

    @server.tool()
    def resume(run_id: int) -> dict[str, Any]:
        """Queue an interrupted or cancelled run again; it continues from its last complete checkpoint."""
        return dict(_answered(lambda: api.resume(run_id)))

    @server.tool()
    def metrics(run_id: int, names: list[str] | None = None, since_step: int = -1) -> dict[str, Any]:
        """A run's logged metrics by name ({name: [{step, value, time}]}), oldest first; since_step polls for new points."""
        return dict(_answered(lambda: api.metrics(run_id, names, since_step)))


def _result_tools(server: Any, api: Any, store: McpResults) -> None:
    """The tools and resources of a run's log and result: log, chat, export, tasks; the spec and log resources."""

    @server.tool()
    def log(run_id: int, lines: int = 40) -> str:
        """The last lines (1 to 2000) of a run's training log."""
        count = _whole_number(lines, "lines", 1, LOG_LINES_MAX)
        return _answered(lambda: log_text(store, run_id, count))

    @server.tool()
    async def chat(run_id: int, prompt: str, system: str = "", base: bool = False, max_tokens: int = 256) -> str:
        """Ask a finished run (or, with base=true, the model it was trained from) one question; greedy decoding.
        A worker that reaches the run answers; max_tokens: 1 to 4096."""
        count = _whole_number(max_tokens, "max_tokens", 1, CHAT_TOKENS_MAX)
        try:
            return await chat_answer(store, run_id, prompt, system, base, count)
        except ProblemError as exc:
            raise refused(exc.problems) from None

    @server.tool()
    def export(
        run_id: int,
        merged: bool = True,
        dtype: str = "bf16",
        gguf: list[str] | None = None,
        imatrix: bool = False,
    ) -> list[TaskData]:
        """Ask a worker to export a succeeded run: the adapter merged into its base (dtype bf16, fp16 or fp32)
        and/or GGUF files (gguf: e.g. ["f16", "q4_k_m"]), each checked; imatrix: the quantized types made with an
        importance matrix of the run's training rows. Returns the tasks; follow them with `tasks`."""
        return _answered(lambda: export_tasks(store, run_id, merged, dtype, gguf or [], imatrix))

    @server.tool()
    def tasks(task_ids: list[int]) -> list[TaskData]:
        """The state of worker tasks (exports, evaluations): queued, running, succeeded or failed, with the result."""
        return [task_data(t) for t in store.tasks_of(task_ids)]

    @server.resource("tunedeck://runs/{run_id}/spec", mime_type="application/yaml")
    def run_spec(run_id: int) -> str:
        """A run's job spec as YAML (what `tunedeck submit` would take to run it again)."""
        return _answered(lambda: spec_text(store, int(run_id)))

    @server.resource("tunedeck://runs/{run_id}/log", mime_type="text/plain")
    def run_log(run_id: int) -> str:
        """The last 200 lines of a run's training log."""
        return _answered(lambda: log_text(store, int(run_id), 200))


def export_tasks(
    store: ExportOnWorker,
    run_id: int,
    merged: bool,
    dtype: str,
    gguf: list[str],
    imatrix: bool = False,
) -> list[TaskData]:
    """The export tasks of one request, refused as the Export tab refuses it (nothing queued on a problem); an
    importance matrix calibrates on the run's own rows: a file of the worker's machine is named only by its
    command line (`tunedeck export --calibration`), never by a remote agent."""
    from jobs.export.merged import finished_spec
    from jobs.queue.run_actions import existing_run
    from jobs.worker.tasks import reach_problem, request_export

    run = existing_run(store, run_id, "run_id")
    finished_spec(store, run.id)
    problem = reach_problem(store, run)
    if problem is not None:
        raise ProblemError([problem])
    ids = request_export(store, run.id, merged, dtype, gguf, imatrix)
    return [task_data(t) for t in store.tasks_of(ids)]


def serve_stdio(store: McpTools, policy: AccessPolicy) -> None:
    """`tunedeck mcp`: serve the tools on stdin/stdout until the agent closes them."""
    asyncio.run(build(store, policy).run_stdio_async())
