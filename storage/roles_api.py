"""The store's roles for the dashboard's APIs: the Gradio API's endpoints (`app.api`, `app.api_tasks`,
`app.api_search`), the MCP tools over them (`app.mcp_tools`) and the OpenAI-compatible fine-tuning jobs
(`app.openai_tuning`), each a `Protocol` `Store` plays, checked by mypy in `storage.roles_played`. The smaller roles
they combine are in `storage.roles`, `storage.roles_queue`, `storage.roles_pages`, `storage.roles_chat` and
`storage.roles_tasks`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from storage.roles import ArtifactReader, RunArtifacts, RunEvents, RunLister
from storage.roles_chat import ChatAnswers
from storage.roles_pages import RewardTrials, RunCounts, RunReport
from storage.roles_queue import RunActing, Submitting
from storage.roles_tasks import ExportOnWorker

if TYPE_CHECKING:  # annotations only (a module that asks for a role must not import the database layer)
    from storage.records import MemoryPoint


class RunDetails(RunCounts, RunArtifacts, RunEvents, Protocol):
    """One run in full for the API (`app.api.detail`): its summary, metric names, events (the doctor's findings),
    whether it can be resumed and its bundle."""

    def metric_names(self, run_id: int) -> list[str]: ...


class ApiEndpoints(RunDetails, RunActing, RewardTrials, Protocol):
    """The dashboard's API (`app.api.Endpoints`): runs listed, read, submitted, cancelled, resumed, tagged and
    deleted; their metrics and memory samples; a Try rewards task queued and read back."""

    def memory_samples(
        self, run_id: int | None = None, since: float | None = None, source: str | None = None, limit: int | None = None
    ) -> list[MemoryPoint]: ...


class McpResults(ChatAnswers, ExportOnWorker, Protocol):
    """The MCP tools on a run's result (`app.mcp_tools._result_tools`): its log and spec, one chat answer, export
    tasks asked of a worker and read back."""


class McpTools(ApiEndpoints, ChatAnswers, ExportOnWorker, Protocol):
    """`tunedeck mcp`'s server (`app.mcp_tools.build`): the API's endpoints, a spec planned, and the result tools."""


class TuningModels(ArtifactReader, RunLister, Protocol):
    """A fine-tuning job's `model` (`app.openai_tuning.create`): a base model, a folder or hub id, or a finished
    run's whole-model folder, named as /v1 names it."""


class JobSubmitting(RunReport, Submitting, Protocol):
    """A fine-tuning job created (`app.openai_tuning.routes.create_job`): checked and queued through submit, its
    extras kept, the job shown."""


class TuningJobs(JobSubmitting, RunActing, Protocol):
    """The fine-tuning API's routes (`app.openai_tuning.routes`): jobs created, listed, shown, cancelled; their
    events and checkpoints; an uploaded file deleted when no run uses it."""
