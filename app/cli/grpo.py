"""`tunedeck grpo try SPEC`: a grpo spec's rewards on the base model's own samples, before training.

    tunedeck grpo try examples/grpo-arithmetic.yaml              # 4 prompts, a table per prompt
    tunedeck grpo try my.yaml --prompts 8 --set temperature=1.2 --json

Samples num_generations completions for the first prompts of the training data with the job's generation
settings, scores each with every reward and shows the advantages trl would compute, flagging groups with
no learning signal (`jobs.train.reward_trial`). Runs in this process; the dashboard's "Try rewards" asks a
worker for the same (`--task ID` is how that worker runs it: the result goes next to the task's log).
Exit 2 with the problems when the spec cannot run, 1 when no prompt can teach, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from app.cli.usage import EXIT_OK, StoreUse, UsageError
from jobs.errors import Problem

if TYPE_CHECKING:  # the parser is built for every command: no store imported for it
    from storage.roles_pages import RewardTrying

EXIT_NO_SIGNAL = 1


def cmd_grpo_try(store: RewardTrying, args: argparse.Namespace) -> int:
    from jobs.train.reward_trial import trial_table, try_rewards

    if args.task is not None:
        return _carry_out(store, args.task)
    if args.spec is None:
        raise UsageError([Problem("SPEC", "no spec given", "tunedeck grpo try SPEC.yaml")])
    from app.cli.usage import load_spec
    from jobs.checks.pipeline import check
    from jobs.spec.grpo import TRIAL_PROMPTS_MAX
    from jobs.spec.job import SpecError
    from jobs.spec.trainer_records import record_for

    if not 1 <= args.prompts <= TRIAL_PROMPTS_MAX:
        raise UsageError([Problem("--prompts", f"{args.prompts} is not from 1 to {TRIAL_PROMPTS_MAX}", "use e.g. 4")])
    try:
        spec = check(load_spec(args.spec, args.set), store=store).accepted()
    except SpecError as exc:
        raise UsageError(exc.problems) from None
    if not record_for(spec.trainer).generates:
        raise UsageError([Problem("trainer", f"{spec.trainer.value} has no rewards to try", "set trainer: grpo")])
    result = try_rewards(spec, args.prompts, store=store)
    print(json.dumps(result, indent=1) if args.json else trial_table(result))
    return EXIT_OK if result["teaching"] else EXIT_NO_SIGNAL


def _carry_out(store: RewardTrying, task_id: int) -> int:
    """A worker's task: the spec and prompt count from the task, the result as JSON next to its log."""
    from jobs.spec.job import JobSpec
    from jobs.train.reward_trial import trial_table, try_rewards
    from jobs.worker.task_service import task_file

    task = store.get_task(task_id)
    if task is None or "spec" not in task.args:
        raise UsageError([Problem("--task", f"{task_id} is not a try-rewards task", "queue one from the dashboard")])
    result = try_rewards(JobSpec.from_dict(task.args["spec"]), int(task.args.get("prompts", 4)), store=store)
    path = task_file(store, task, "json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    print(trial_table(result), flush=True)
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `grpo` group: `try`."""
    grpo = sub.add_parser("grpo", help="GRPO helpers: try a spec's rewards before training")
    grpo_sub = grpo.add_subparsers(dest="grpo_command", required=True, metavar="SUBCOMMAND")
    s = grpo_sub.add_parser("try", help="sample the base model, score with every reward, show the learning signal")
    s.add_argument("spec", metavar="SPEC.yaml", nargs="?")
    s.add_argument("--prompts", type=int, default=4, help="how many training prompts to try (default 4)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.add_argument("--task", type=int, default=None, help=argparse.SUPPRESS)  # a worker carrying out the task
    s.set_defaults(func=cmd_grpo_try, store_use=StoreUse.OPEN)
