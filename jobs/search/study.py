"""A search's Optuna study, kept in tunedeck's own database through Optuna's RDB storage.

The store owns the database URL (`Store.study_url`) and its engine settings; Optuna adds its own tables
(`studies`, `trials`, ...) beside tunedeck's. Optuna is imported lazily: the spec and plan modules stay light.

    study = open_study(store, search, plan)    # created on the first call, loaded after (a restart resumes it)
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from jobs.search.plan import SearchPlan

if TYPE_CHECKING:
    from storage.roles_queue import StudyHome
    from storage.store import SearchRecord


def grid_points(plan: SearchPlan) -> list[dict[str, Any]]:
    """Every combination of the listed values, in order (Optuna's GridSampler stops a study from inside
    `tell`, which only works in `study.optimize`: the grid is enqueued instead, then told like any trial)."""
    fields = [d.field for d in plan.space.dimensions]
    return [dict(zip(fields, values)) for values in itertools.product(*(d.choices for d in plan.space.dimensions))]


def pruner_startup(plan: SearchPlan) -> int:
    """Finished trials the median pruner waits for before it compares: a quarter of the budget, 1 to 5."""
    return max(1, min(5, plan.trials // 4))


def _sampler(plan: SearchPlan, seed: int) -> Any:
    import optuna

    if plan.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if plan.sampler == "grid":  # every point is enqueued when the study is created (`grid_points`)
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(plan: SearchPlan) -> Any:
    import optuna

    if plan.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=plan.steps or "auto")
    if plan.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner_startup(plan), n_warmup_steps=0)
    return optuna.pruners.NopPruner()


def rdb_storage(store: StudyHome) -> Any:
    import optuna

    return optuna.storages.RDBStorage(store.study_url, engine_kwargs=store.study_engine_kwargs())


def open_study(store: StudyHome, search: SearchRecord, plan: SearchPlan) -> Any:
    """The search's study (an optuna.Study) with its sampler and pruner; created with the base point enqueued.

    The sampler's seed is the plan's plus the trials the study holds, so a study reopened after a restart
    does not draw the same random points again."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = rdb_storage(store)
    existing = [s.study_name for s in storage.get_all_studies()]
    fresh = search.study_name not in existing
    held = 0 if fresh else len(optuna.load_study(study_name=search.study_name, storage=storage).trials)
    study = optuna.create_study(
        storage=storage,
        study_name=search.study_name,
        direction=plan.direction,  # type: ignore[arg-type]
        sampler=_sampler(plan, plan.seed + held),
        pruner=_pruner(plan),
        load_if_exists=True,
    )
    if fresh and plan.sampler == "grid":
        for point in grid_points(plan):
            study.enqueue_trial(point)
    elif fresh and plan.include_base and (values := plan.base_values()) is not None:
        study.enqueue_trial(values, user_attrs={"base": True})
    return study


def study_trials(store: StudyHome, search: SearchRecord) -> list[Any]:
    """The study's FrozenTrials (for the importance and the report); [] when it has none yet."""
    import optuna

    storage = rdb_storage(store)
    if search.study_name not in [s.study_name for s in storage.get_all_studies()]:
        return []
    return list(optuna.load_study(study_name=search.study_name, storage=storage).trials)
