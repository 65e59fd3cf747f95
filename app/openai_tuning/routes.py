"""The routes of `/v1/files` and `/v1/fine_tuning/jobs`, behind the same login or token as every route.

Each handler checks access first (`denied`: the `/v1` rule of `app.openai_api`), then parses, calls the
store or the one submit path (`jobs.queue.submit`, `jobs.queue.run_actions`), and answers; an ApiError becomes
OpenAI's error shape `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.openai_fields import ApiError, read_body
from app.openai_tuning import files
from app.openai_tuning.create import job_values, refusal
from app.openai_tuning.views import job_checkpoints, job_events, job_id, job_object, page, run_id_of, save_extras
from jobs.checks.access import AccessPolicy
from jobs.errors import ProblemError
from jobs.queue import run_actions
from jobs.queue.submit import submit
from storage.records import RunRecord
from storage.roles import RunReader
from storage.roles_api import JobSubmitting, TuningJobs
from storage.roles_pages import RunReport

Denied = Callable[[Request], Awaitable[Response | None]]
MAX_PAGE = 100


def _limit(request: Request, default: int = 20) -> int:
    text = request.query_params.get("limit", str(default))
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise ApiError(400, f"`limit` must be a whole number from 1 to {MAX_PAGE}", "limit")
    return int(text)


def _run(store: RunReader, ident: str) -> RunRecord:
    run_id = run_id_of(ident)
    run = store.get_run(run_id) if run_id is not None else None
    if run is None:
        raise ApiError(
            404, f"no fine-tuning job {ident[:80]!r}: GET /v1/fine_tuning/jobs lists them", "fine_tuning_job_id"
        )
    return run


def create_job(store: JobSubmitting, policy: AccessPolicy, body: Any) -> dict[str, Any]:
    """Parse, check and queue through the one submit path; the job as it is then."""
    values, extras = job_values(store, body)
    try:
        run_id = submit(store, values, policy)
    except ProblemError as exc:
        files = {
            values.get(k): body.get(f) for k, f in (("dataset", "training_file"), ("eval_dataset", "validation_file"))
        }
        raise refusal(exc, {str(path): str(ident) for path, ident in files.items() if path}) from None
    save_extras(store, run_id, extras)
    run = store.get_run(run_id)
    assert run is not None
    return job_object(store, run)


def list_jobs(store: RunReport, request: Request) -> dict[str, Any]:
    """Newest first, `limit` after the job `after`, optionally only those whose `metadata[k]` is `v`."""
    limit = _limit(request)
    after = request.query_params.get("after")
    before = run_id_of(after) if after is not None else None
    if after is not None and before is None:
        raise ApiError(400, f"`after` must be a job id (ftjob-...), not {after[:80]!r}", "after")
    wanted = {k[9:-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")}
    jobs: list[dict[str, Any]] = []
    while len(jobs) <= limit:
        runs = store.list_runs(limit=MAX_PAGE, before=before)
        jobs += [j for j in (job_object(store, r) for r in runs) if _has(j, wanted)]
        if len(runs) < MAX_PAGE:
            break
        before = runs[-1].id
    out = page(jobs[: limit + 1], None, limit)
    return out


def _has(job: dict[str, Any], wanted: dict[str, str]) -> bool:
    metadata = job.get("metadata") or {}
    return all(metadata.get(k) == v for k, v in wanted.items())


def cancel_job(store: TuningJobs, ident: str) -> dict[str, Any]:
    run = _run(store, ident)
    try:
        done = run_actions.cancel(store, run.id, "fine_tuning_job_id")
    except ProblemError as exc:
        raise refusal(exc) from None
    if done.result is run_actions.CancelResult.ALREADY_FINISHED:
        raise ApiError(
            400, f"{job_id(run.id)} already {done.status.value}: there is nothing to cancel", "fine_tuning_job_id"
        )
    fresh = store.get_run(run.id)
    return job_object(store, fresh or run)


def add_tuning_routes(app: Any, store: TuningJobs, denied: Denied, policy: AccessPolicy) -> None:
    """Serve `/v1/files` and `/v1/fine_tuning/jobs` from Gradio's FastAPI `app`."""

    def route(path: str, method: str, answer: Callable[..., Awaitable[Response]]) -> None:
        async def handle(request: Request) -> Response:
            refused = await denied(request)
            if refused is not None:
                return refused
            try:
                return await answer(request, **request.path_params)
            except ApiError as exc:
                return exc.response()

        app.add_api_route(path, handle, methods=[method], include_in_schema=False)

    def threaded(fn: Callable[..., Any]) -> Callable[..., Awaitable[Response]]:
        async def answer(request: Request, **params: Any) -> Response:
            found = await run_in_threadpool(fn, request, **params)
            return found if isinstance(found, Response) else JSONResponse(found)

        return answer

    async def create(request: Request) -> Response:
        body = await read_body(request)
        return JSONResponse(await run_in_threadpool(create_job, store, policy, body))

    async def upload(request: Request) -> Response:
        return await files.upload(request, policy)

    jobs = "/v1/fine_tuning/jobs"
    route("/v1/files", "POST", upload)
    route("/v1/files", "GET", threaded(lambda request: files.listing(request)))
    route("/v1/files/{file_id}", "GET", threaded(lambda request, file_id: files.retrieve(file_id)))
    route("/v1/files/{file_id}/content", "GET", threaded(lambda request, file_id: files.content(file_id)))
    route("/v1/files/{file_id}", "DELETE", threaded(lambda request, file_id: files.delete(store, file_id)))
    route(jobs, "POST", create)
    route(jobs, "GET", threaded(lambda request: list_jobs(store, request)))
    route(jobs + "/{job}", "GET", threaded(lambda request, job: job_object(store, _run(store, job))))
    route(jobs + "/{job}/cancel", "POST", threaded(lambda request, job: cancel_job(store, job)))
    route(
        jobs + "/{job}/events",
        "GET",
        threaded(lambda request, job: _page(job_events(store, _run(store, job)), request)),
    )
    route(
        jobs + "/{job}/checkpoints",
        "GET",
        threaded(lambda request, job: _page(job_checkpoints(store, _run(store, job)), request, 10)),
    )
    # Gradio's own catch-all routes come first otherwise: put ours ahead of them (as app.openai_api does).
    ours = [r for r in app.router.routes if getattr(r, "path", "").startswith("/v1/")]
    app.router.routes[:] = ours + [r for r in app.router.routes if r not in ours]


def _page(items: list[dict[str, Any]], request: Request, default: int = 20) -> dict[str, Any]:
    after = request.query_params.get("after")
    if after is not None and after not in {i["id"] for i in items}:
        raise ApiError(400, f"`after` {after[:80]!r} is not one of this job's items", "after")
    return page(items, after, _limit(request, default))
