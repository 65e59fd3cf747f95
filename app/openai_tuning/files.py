"""`/v1/files`: upload (multipart, purpose `fine-tune`), list, retrieve, `/content` and delete.

An upload is read as it arrives and cut at TUNEDECK_MAX_UPLOAD_MB (413, nothing kept; `storage.uploads`), kept
in the uploads folder (`storage.api_files`), then read by tunedeck's data checks as the rows of a supervised
or, for preference rows, a dpo job (`jobs.data.inspection`): a file they refuse is removed and the refusal
names `file` and the first bad rows. A file a queued or running job trains on is not deleted (409).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from app.openai_fields import ApiError
from jobs.checks.access import AccessPolicy
from jobs.errors import ProblemError
from storage.api_files import ApiFile, api_file, api_files, delete_api_file, keep_api_file
from storage.models import RunStatus
from storage.roles import RunLister
from storage.settings import max_upload_mb
from storage.uploads import UploadRefused

PURPOSE = "fine-tune"
FORM_SLACK = 2**16  # the multipart form's own bytes (boundaries, headers, the purpose) besides the file
PREFERENCE_KEYS = {"preferred_output", "non_preferred_output", "chosen", "rejected"}
MAX_LIST = 10_000


def file_object(found: ApiFile) -> dict[str, Any]:
    return {
        "id": found.id,
        "object": "file",
        "bytes": found.bytes,
        "created_at": found.created_at,
        "filename": found.filename,
        "purpose": found.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the file is over the {limit // 2**20} MB upload limit. Fix: raise TUNEDECK_MAX_UPLOAD_MB on the server",
        "file",
        "file_too_large",
    )


async def _form(request: Request, limit: int) -> Any:
    """The multipart form, read up to `limit` bytes of file plus the form's own (413 past it, unread)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "send the file as multipart/form-data with `file` and `purpose` parts", "file")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + FORM_SLACK:
        raise _too_large(limit)

    async def capped() -> Any:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit + FORM_SLACK:
                raise _too_large(limit)
            yield chunk

    try:
        return await MultiPartParser(request.headers, capped(), max_files=1, max_fields=8).parse()
    except MultiPartException as exc:
        raise ApiError(400, f"the multipart form could not be read: {exc.message}", "file") from None


def _trainer_for(path: Path) -> str:
    """dpo for preference rows (judged by the first row), else sft: the rows' check then says what is wrong."""
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    return "sft"
                return "dpo" if isinstance(row, dict) and PREFERENCE_KEYS & set(row) else "sft"
    return "sft"


def check_rows(found: ApiFile, policy: AccessPolicy) -> None:
    """tunedeck's data checks on the kept file; ApiError naming `file` (and the file removed) when they refuse it."""
    from jobs.data.inspection import check_dataset
    from jobs.spec.enums import Trainer

    try:
        with policy.reading():
            check_dataset(str(found.path), Trainer(_trainer_for(found.path)), field="file")
    except ProblemError as exc:
        delete_api_file(found.id)
        text = "; ".join(f"{p.problem}. Fix: {p.fix}" for p in exc.problems).replace(str(found.path), found.filename)
        raise ApiError(400, f"{found.filename}: {text}", "file", "invalid_file") from None


async def upload(request: Request, policy: AccessPolicy) -> Response:
    limit = max_upload_mb() * 2**20
    form = await _form(request, limit)
    try:
        purpose, sent = form.get("purpose"), form.get("file")
        if purpose != PURPOSE:
            raise ApiError(400, f"`purpose` must be {PURPOSE!r} (tunedeck keeps files for fine-tuning)", "purpose")
        if not isinstance(sent, UploadFile):
            raise ApiError(400, "`file` must be a file part of the form", "file")
        name = Path(sent.filename or "upload.jsonl").name[:255] or "upload.jsonl"
        try:
            kept = await run_in_threadpool(keep_api_file, sent.file, name, purpose, limit)
        except UploadRefused:
            raise _too_large(limit) from None
        await run_in_threadpool(check_rows, kept, policy)
        return JSONResponse(file_object(kept))
    finally:
        await form.close()


def _found(file_id: str) -> ApiFile:
    found = api_file(file_id)
    if found is None:
        raise ApiError(404, f"no file {file_id[:80]!r}: GET /v1/files lists them", "file_id", "file_not_found")
    return found


def listing(request: Request) -> Response:
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"`order` must be asc or desc, not {order[:20]!r}", "order")
    limit_text = query.get("limit", str(MAX_LIST))
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIST:
        raise ApiError(400, f"`limit` must be a whole number from 1 to {MAX_LIST}", "limit")
    found = [f for f in api_files() if query.get("purpose") in (None, f.purpose)]
    found = found if order == "desc" else found[::-1]
    ids = [f.id for f in found]
    after = query.get("after")
    if after is not None and after not in ids:
        raise ApiError(400, f"`after` {after[:80]!r} is no file in this list", "after")
    start = ids.index(after) + 1 if after is not None else 0
    chosen = found[start : start + int(limit_text)]
    return JSONResponse(
        {
            "object": "list",
            "data": [file_object(f) for f in chosen],
            "has_more": start + len(chosen) < len(found),
            "first_id": chosen[0].id if chosen else None,
            "last_id": chosen[-1].id if chosen else None,
        }
    )


def retrieve(file_id: str) -> Response:
    return JSONResponse(file_object(_found(file_id)))


def content(file_id: str) -> Response:
    found = _found(file_id)
    return FileResponse(found.path, media_type="application/octet-stream", filename=found.filename)


def delete(store: RunLister, file_id: str) -> Response:
    found = _found(file_id)
    path = str(found.path)
    for run in store.list_runs(status=[RunStatus.QUEUED, RunStatus.RUNNING], limit=10_000):
        if path in run.spec_json:
            raise ApiError(
                409,
                f"{found.id} is the data of run {run.id} (ftjob-{run.id}), which is {run.status.value}: "
                "cancel it or wait for it to end, then delete the file",
                "file_id",
                "file_in_use",
            )
    delete_api_file(found.id)
    return JSONResponse({"id": found.id, "object": "file", "deleted": True})
