"""The one check of a job before it is queued: every problem at once, and what the later steps need.

Every entry point calls `check` once: the launch form and the API (values that may not parse),
`tunedeck submit` / `tunedeck plan`, `jobs.queue.submit.submit` and the trick sweep. Each step runs
once per call, in this order, and the facts one step found are handed to the next instead of
being found again:

1. access: what this server lets its users reach (`jobs.checks.access.AccessPolicy`);
2. fields: the spec's own problems (parsing, ranges, combinations of fields);
3. model: the model reference resolves (`jobs.models.references.check_model`);
4. data: each data set read once (`jobs.checks.datasets`), rendered with the model's chat template
   where it matters; the tokenizer is loaded at most once, from this machine's files;
5. device: what the device cannot do (`jobs.config.mapping.device_problems`); when no worker has
   published its device, the fix says that the check used this machine's;
6. combinations: what trl/peft refuse, with the model's layer shapes where the method needs them
   (a mixture-of-experts model's adapter places: `jobs.config.moe`), and the assistant_only_loss needs
   of rows and template; then the libraries' own verdict (`jobs.checks.library`): peft wraps the model built
   on the meta device with the spec's adapters, and one micro-batch of max_length tokens runs forward and
   backward on no memory, so peft's refusals and shapes transformers cannot run are problems here, never
   failures after queueing (a note says when it cannot run);
7. memory: the predicted peak on the device (`jobs.checks.memory`) for the worst micro-batch of the
   training rows' measured token lengths (`jobs.data.tokens.measurement`, cached), with the max_length
   worst case kept as the bound (with grpo's use_vllm, a prompt longer than max_length is refused: vLLM's
   context, `jobs.config.vllm`); a "will not fit" is a problem only when nothing else is wrong
   (`memory_problem`, with the cheapest change that fits);
   from the same lengths, the rows whose whole answer `max_length` cuts away
   (`jobs.checks.answers`): refused when most rows are, a warning when some are;
   the loss masks of the first 200 training rows as trl builds them (`jobs.checks.masks`, the token view):
   answers that do not end with a token generation stops at (a warning), rows with no token in the loss
   (refused when all are, or when trl would refuse them; else a warning);
8. a grpo `reward_model_run`: a finished reward run in the store;
9. `report_to`: each tracker can start (`jobs.checks.trackers`: its package, MLflow's store, W&B's key),
   checked with the fields;
10. endpoints a spec names (the judge's URL#MODEL): refused on a shared dashboard by the access policy, a
   warning elsewhere when the workers would call it without their keys (`jobs.checks.egress`);
11. `run_name`: not one that reads as a run id (`3`, `#3`, `run:3`) or names a base model the dashboard
   serves (a built-in, the spec's model, another run's model), which /v1 reads first
   (`jobs.models.served_names`);
12. duplicates: training rows repeated (exactly or nearly) or also in the eval data, warnings naming the rows and
   the fix `dedupe: true` (`jobs.checks.duplicates`, by the data audit `jobs.data.audit`).

No step swallows an unexpected error: a bug in a check fails the call instead of hiding a refusal.

    checked = check(spec, policy=AccessPolicy.dashboard(), store=store)
    checked.problems        # [] or every Problem, each naming the field and the fix
    checked.prediction      # jobs.memory.predict.Prediction, or None
    checked.accepted()      # the spec, or SpecError with every problem
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobs.checks.access import AccessPolicy
from jobs.checks.answers import answer_problems
from jobs.checks.datasets import DATA_FIELDS, dataset_problems, values_problems
from jobs.checks.duplicates import duplicate_warnings
from jobs.checks.egress import endpoint_warning
from jobs.checks.library import library_problems
from jobs.checks.masks import BLOCKING_FIELDS, mask_findings
from jobs.checks.memory import (
    NO_MEMORY,
    Memory,
    judge_reward_archs,
    measured_lengths,
    model_arch,
    predict_memory,
    reward_model_arch,
    taken_memory_warning,
)
from jobs.checks.rewards import judge_reward_problems, reward_column_problems
from jobs.checks.template import assistant_only_problems
from jobs.checks.trackers import tracker_problems
from jobs.checks.trick_packages import missing_package_problems
from jobs.config.families import family_problems
from jobs.config.mapping import MODEL_CHECKED_METHODS, capability_warnings, combination_problems, device_problems
from jobs.config.moe import moe_notes, moe_problems
from jobs.config.vllm import vllm_length_problems
from jobs.data.bench_tasks import task_problems, watched_task_problems
from jobs.devices.facts import DeviceFacts
from jobs.errors import Problem
from jobs.spec.job import JobSpec, SpecError
from storage.roles import CheckReader

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo
    from jobs.memory.breakdown import Prediction


@dataclass(frozen=True)
class Checked:
    """The outcome of one check: the spec (None when the values did not parse) and every problem, plus the
    facts found on the way: what each data set's check read, the memory prediction, the warnings."""

    spec: JobSpec | None
    problems: list[Problem]
    device: DeviceFacts
    data: dict[str, DatasetInfo] = field(default_factory=dict)  # by field: "dataset", "eval_dataset"
    memory: Memory = NO_MEMORY
    warnings: list[str] = field(default_factory=list)  # runs, but not the way the spec suggests

    @property
    def prediction(self) -> Prediction | None:
        return self.memory.prediction

    def accepted(self) -> JobSpec:
        """The spec when nothing is wrong; else SpecError with every problem."""
        if self.problems or self.spec is None:
            raise SpecError(self.problems)
        return self.spec


def check(
    spec: JobSpec | Mapping[str, Any] | Any,
    *,
    policy: AccessPolicy | None = None,
    store: CheckReader | None = None,
    device: DeviceFacts | None = None,
    libraries: bool = True,
) -> Checked:
    """Every problem with `spec` (a JobSpec, or plain values still to parse), its model, its data and the device.

    `policy`: what the caller may reach (default: everything, the command line's). `device`: the facts to
    check against; default: the workers' published device when `store` is given, else this machine's.
    `store` also enables the checks that read it (a grpo reward_model_run). `libraries`: also ask peft and
    transformers themselves (`jobs.checks.library`: imports torch, so `tunedeck plan` leaves it to submit unless
    asked); submit always does."""
    policy = policy or AccessPolicy.open()
    facts, note = _device(store, device)
    if not isinstance(spec, JobSpec):
        try:
            spec = JobSpec.from_dict(dict(spec) if isinstance(spec, Mapping) else spec)
        except SpecError as exc:  # still check the data sets whose fields parsed, so one answer shows all
            problems = list(exc.problems)
            if isinstance(spec, Mapping):
                with policy.reading():  # images in rows: from the data folders only, for a restricted user
                    problems += values_problems(spec, {p.field for p in problems}, policy)
            return Checked(None, _unique(problems), facts)
        field_problems: list[Problem] = []  # from_dict checked the fields
    else:
        field_problems = spec.problems()
    refused_model = policy.model_problem(spec.model)
    if refused_model is not None:  # nothing reads a folder this user may not name (its files would tell)
        return Checked(spec, _unique(policy.problems(spec) + field_problems), facts)
    with policy.reading():
        return _check_spec(spec, policy, store, facts, note, field_problems, libraries)


def _check_spec(
    spec: JobSpec,
    policy: AccessPolicy,
    store: CheckReader | None,
    facts: DeviceFacts,
    note: str | None,
    field_problems: list[Problem],
    libraries: bool = True,
) -> Checked:
    from jobs.models.references import check_model
    from jobs.models.registry import ModelError
    from jobs.models.tokenizer import LocalTokenizer

    problems = policy.problems(spec) + field_problems
    problems += judge_reward_problems(spec, store, {p.field for p in problems})  # a judge that does not resolve
    valid = not problems  # the spec itself is sound: its prediction means something
    problems += tracker_problems(spec)  # a missing package does not change what the run would need
    if spec.run_name:  # one that reads as an id or a base model: /v1 would not reach it (reads stored runs: lazily)
        from jobs.models.served_names import run_name_problems

        problems += run_name_problems(spec, store)
    # Loaded at most once per check, and only from files on this machine; code shipped with the model
    # runs only where this server allows it.
    tokenizer = LocalTokenizer(spec.model, spec.trust_remote_code and policy.allow_remote_code)
    if not any(p.field == "model" for p in problems):
        try:
            problems += list(check_model(spec.model, trust_remote_code=spec.trust_remote_code))
        except ModelError as exc:
            problems += exc.problems
    infos: dict[str, DatasetInfo] = {}
    if not any(p.field in DATA_FIELDS for p in problems):
        found, infos = dataset_problems(spec, tokenizer)
        problems += found + reward_column_problems(spec, infos)  # a declared reward's column the data lacks
    arch = model_arch(spec.model) if valid or spec.method in MODEL_CHECKED_METHODS else (None, "")
    capability = facts.device()
    problems += [_where(p, note) for p in device_problems(spec, capability)]
    problems += missing_package_problems(spec, capability)
    shape = arch[0].shape if arch[0] is not None else None
    problems += combination_problems(spec, shape)
    moe = shape.moe if shape is not None else None
    unbuildable = moe_problems(spec, moe)  # peft would refuse these adapters: nothing to count or predict
    problems += unbuildable + family_problems(spec, shape)
    valid = valid and not unbuildable
    refused, library_notes = library_problems(spec) if libraries and valid and not problems else ([], [])
    problems += refused  # peft's and transformers' own refusals: adapters placed, one step on the meta device
    valid = valid and not refused
    problems += assistant_only_problems(spec, infos.get("dataset"), tokenizer)
    if not any(p.field == "eval_tasks" for p in problems):  # a file the server may not read is not opened
        problems += task_problems(spec.eval_tasks)  # benchmark files read like data: rows named, fix given
        problems += watched_task_problems(spec.metric_for_best_model, spec.eval_tasks)  # early stopping's task score
    lengths = measured_lengths(spec, tokenizer) if valid and not problems and arch[0] is not None else None
    # grpo: the worst batch is sized by the longest prompt, which vLLM's context must hold whole
    problems += vllm_length_problems(spec, lengths.worst_batch(spec).length if lengths is not None else None)
    reward = reward_model_arch(store, spec) if valid else None  # a grpo reward run's model, loaded beside the policy
    judge_archs = judge_reward_archs(store, spec) if valid else {}  # a judge reward's local model, held beside it
    memory = predict_memory(spec, facts, arch, lengths, reward, judge_archs) if valid else NO_MEMORY
    cut_answers, answer_warnings = answer_problems(spec, lengths)
    problems += cut_answers
    masked, mask_warnings = (
        mask_findings(spec, tokenizer) if valid and not any(p.field in BLOCKING_FIELDS for p in problems) else ([], [])
    )
    problems += masked
    if not problems:
        problems += [p for p in (memory_problem(spec, memory),) if p is not None]
    if store is not None:
        from jobs.models.reward_model import reward_run_problems

        problems += reward_run_problems(store, spec)
    warnings = capability_warnings(spec, capability) + moe_notes(spec, moe)
    warnings += [w for info in infos.values() for w in info.warnings]
    warnings += duplicate_warnings(spec, infos) if not problems else []  # repeated rows, eval rows in training
    warnings += answer_warnings + mask_warnings + library_notes
    judged = [(spec.judge, "judge")] + [(r.judge, f"rewards[{i}].judge") for i, r in enumerate(spec.declared_rewards)]
    warnings += [w for w in (endpoint_warning(*j) for j in judged) if w]  # a shared dashboard refused them above
    warnings += [NO_PREDICTION] if valid and not problems and memory.prediction is None else []
    taken = taken_memory_warning(memory.prediction, facts, store) if not problems else None
    warnings += [taken] if taken else []
    return Checked(spec, _unique(problems), facts, infos, memory, warnings)


NO_PREDICTION = (
    "no memory prediction: this model's config.json is not readable here or transformers has no causal-LM class "
    "for it, so whether the run fits the device is not known before it starts"
)


def memory_problem(spec: JobSpec, memory: Memory) -> Problem | None:
    """A problem when the predicted peak will not fit the device (None when it fits, is overridden or unknown)."""
    from jobs.memory.breakdown import Verdict, explain
    from jobs.memory.planner import cheapest_change

    if spec.ignore_memory_prediction or memory.prediction is None:
        return None
    if memory.prediction.verdict is not Verdict.WILL_NOT_FIT:
        return None
    device = memory.prediction.device
    change = cheapest_change(spec, memory.arch, device, memory.lengths) if memory.arch is not None else None
    fix = (
        f"{change} (`tunedeck plan SPEC.yaml --fit` lists more)"
        if change
        else "shorten max_length or pick a smaller model"
    )
    return Problem(
        "memory",
        explain(memory.prediction).rstrip("."),
        fix + "; or set ignore_memory_prediction: true to queue it anyway",
    )


def _device(store: CheckReader | None, device: DeviceFacts | None) -> tuple[DeviceFacts, str | None]:
    """The facts to check against, and the note to add to device problems when they are this machine's
    only because no worker has published its own."""
    if device is not None:
        return device, None
    if store is None:
        from jobs.devices.probe import local_facts

        return local_facts(), None
    from jobs.devices.target import target

    chosen = target(store)
    return chosen.facts, chosen.note if chosen.worker_id is None else None


def _where(problem: Problem, note: str | None) -> Problem:
    if note is None:
        return problem
    return Problem(problem.field, problem.problem, f"{problem.fix} ({note}; start the worker first if it has a GPU)")


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.field, p.problem) not in seen:
            seen.add((p.field, p.problem))
            out.append(p)
    return out
