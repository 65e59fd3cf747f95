"""That the whole `Store` plays every role of `storage.roles`, `storage.roles_queue`, `storage.roles_pages`,
`storage.roles_chat`, `storage.roles_tasks`, `storage.roles_api`, `storage.roles_dashboard`
and `storage.roles_worker`.

Nothing imports this module: mypy reads it (`./dev.sh check`), so a role whose signature drifts from the store's
method fails there. It lives apart from `storage.store` so that the store imports no role (the roles stay leaves
of the import graph, tests/test_layers.py).
"""

from __future__ import annotations

from storage import roles as r
from storage import roles_api as a
from storage import roles_chat as c
from storage import roles_dashboard as d
from storage import roles_pages as p
from storage import roles_queue as q
from storage import roles_tasks as t
from storage import roles_worker as w
from storage.store import Store


def plays_every_role(store: Store) -> None:
    """Never called: mypy checks here that `Store` satisfies each role, so a changed signature fails
    `./dev.sh check` instead of a module that asks for the role."""
    played: tuple[r.RunReader, r.RunFolders, r.ArtifactReader, r.RunArtifacts, r.RunEvents, r.MetricSink] = (store,) * 6
    more: tuple[r.MetricReader, r.RunLifecycle, r.TrainingRecord, r.CheckReader, r.Sweeps] = (store,) * 5
    rest: tuple[r.WorkerDirectory, r.Leases, r.ChatRuns, r.RunLister, r.TaskQueue] = (store,) * 5
    scores: tuple[r.ScoreSink, r.Evaluations] = (store,) * 2
    queue: tuple[q.Submitting, q.RunActing, q.CheckTasks, q.SearchReader, q.StudyHome, q.SearchDriving] = (store,) * 6
    worker: tuple[r.RunEnding, r.StaleRuns, r.ShareRequeue, r.QueueNotes, r.MemoryRecord] = (store,) * 5
    pages: tuple[p.SeriesReader, p.DeviceMemory, p.RunText, p.RunCounts, r.ChatHistory, p.TaskReader] = (store,) * 6
    tabs: tuple[p.RunReport, q.SearchPages, p.RewardTrials, p.RewardTrying, q.QueueOrder] = (store,) * 5
    chat: tuple[c.ChatReach, c.ChatImages, c.ChatReading, c.ChatLength, c.ChatWriting, c.ChatTurnActions] = (store,) * 6
    chat_api: tuple[c.ChatTab, c.ModelNames, c.ChatRequests, c.ChatAnswers, c.OpenAIChat] = (store,) * 5
    tasks: tuple[t.TaskReach, t.TaskFollowing, t.RunTasks, t.TaskOnWorker, t.ExportRequests, t.EvaluationRequests] = (
        store,
    ) * 6
    task_uses: tuple[t.ExportOnWorker, t.EvaluationOnWorker, t.ExportTasks, t.EvaluationTasks, t.Exporting] = (
        store,
    ) * 5
    reports: tuple[t.ScoreReport, t.Evaluating] = (store,) * 2
    api: tuple[a.RunDetails, a.ApiEndpoints, a.McpResults, a.McpTools] = (store,) * 4
    tuning: tuple[a.TuningModels, a.JobSubmitting, a.TuningJobs] = (store,) * 3
    page: tuple[d.LiveStamps, d.LiveFeed, d.RunPageReads, d.LivePages, d.FormDevice, d.BundlePaths] = (store,) * 6
    parts: tuple[w.DeviceClaims, w.WorkerPresence, w.EngineRuns, w.Dispatching, p.RunFollowing] = (store,) * 5
    services: tuple[c.ChatServing, t.TaskServing, w.WorkerServices, w.Working] = (store,) * 4
    del (
        services,
        parts,
        page,
        api,
        tuning,
        played,
        more,
        rest,
        scores,
        queue,
        worker,
        pages,
        tabs,
        chat,
        chat_api,
        tasks,
        task_uses,
        reports,
    )
