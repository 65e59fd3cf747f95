"""Benchmark tasks named by a spec's `eval_tasks`: read, checked row by row, and written out as lm-eval tasks.

    refs = task_refs("qa.jsonl, my_task.yaml, hellaswag")      # TaskRef(kind, ref, name) each
    problems = task_problems("qa.jsonl")                        # row-numbered, each with the fix
    folder, names = write_tasks(refs, Path(tmp))                # an lm-eval include_path and the task names
    specs = [lm_eval_spec(Path(tmp), t) for t in names]        # what lm-eval's simple_evaluate is handed

Three kinds of reference:
- a `.jsonl` of questions a user writes. Rows with `question`, `choices` (two or more) and `answer` (the
  right choice's index or text) are multiple choice, scored by log-likelihood (`acc`); rows with
  `question` and an `answer` and/or a `regex` are generation, the greedy answer scored by exact match
  with `answer` (`exact_match`: case, punctuation and surrounding spaces ignored) and by a search for
  `regex` in it (`regex_match`: Python's `re.search`, case-sensitive unless the pattern says `(?i)`),
  each over the rows that give it (`answer_scores`). A reply ends at its first line break and has at most
  32 tokens, or, when every row gives an answer, the longest answer's tokens plus 8 (`generation_budget`: a
  longer reply could not match; a row's regex is searched in that reply). One file is one kind. tunedeck writes lm-eval's
  task YAML and the rows into a folder of its own, so nothing is written next to the user's file;
- a `.yaml` lm-evaluation-harness task a user wrote: its folder becomes an include path;
- any other name is a task of lm-eval's own registry (`hellaswag`, `arc_easy`), whose data comes from
  the Hugging Face hub: refused where the hub is off (`HF_HUB_OFFLINE=1`), since it could not be read.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from jobs.errors import Problem, ProblemError

FIELD = "eval_tasks"
MAX_GEN_TOKS = 32  # a generation answer's most tokens: exact-match answers are short
ANSWER_MARGIN = 8  # tokens past the longest expected answer (a reply longer than that cannot match it)
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


class TaskFileError(ProblemError):
    """Raised with every problem of a benchmark task file (field `eval_tasks`)."""

    subject = "with the benchmark tasks"


class TaskKind(str, Enum):
    QUESTIONS = "jsonl"  # questions a user wrote (multiple choice or generation)
    YAML = "yaml"  # an lm-eval task file
    HUB = "hub"  # lm-eval's own registry (data from the hub)


@dataclass(frozen=True)
class TaskRef:
    kind: TaskKind
    ref: str  # as written in the spec
    name: str  # what scores are stored and shown under (the file's stem, or the hub task's name)


def task_refs(text: str | None) -> list[TaskRef]:
    """The references of `eval_tasks`, comma- or line-separated, in order, each once."""
    out: list[TaskRef] = []
    for part in re.split(r"[,\n]", text or ""):
        ref = part.strip()
        if not ref or any(r.ref == ref for r in out):
            continue
        lower = ref.lower()
        if lower.endswith(".jsonl"):
            out.append(TaskRef(TaskKind.QUESTIONS, ref, Path(ref).stem))
        elif lower.endswith((".yaml", ".yml")):
            out.append(TaskRef(TaskKind.YAML, ref, _yaml_task_name(Path(ref)) or Path(ref).stem))
        else:
            out.append(TaskRef(TaskKind.HUB, ref, ref))
    return out


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def task_problems(text: str | None) -> list[Problem]:
    """Every problem of the tasks `eval_tasks` names (files read here, row numbers named)."""
    out: list[Problem] = []
    for ref in task_refs(text):
        if ref.kind is TaskKind.QUESTIONS:
            out.extend(_rows_problems(Path(ref.ref))[0])
        elif ref.kind is TaskKind.YAML:
            out.extend(_yaml_problems(Path(ref.ref)))
        elif not _NAME.match(ref.ref):
            out.append(
                Problem(FIELD, f"{ref.ref!r} is neither a .jsonl, a .yaml nor a task name", "write task names so")
            )
        elif hub_offline():
            out.append(
                Problem(
                    FIELD,
                    f"`{ref.ref}` is an lm-evaluation-harness task whose data comes from the Hugging Face hub, "
                    "and this machine has the hub turned off (HF_HUB_OFFLINE=1)",
                    "write the questions as a local .jsonl (question, choices, answer) or an lm-eval task .yaml, "
                    "or run where the hub is reachable",
                )
            )
    return out


def read_questions(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """("multiple_choice" | "generate_until", the rows normalised: answer as an index for multiple choice)."""
    problems, kind, rows = _rows_problems(path)
    if problems:
        raise TaskFileError(problems)
    return kind, rows


def _rows_problems(path: Path) -> tuple[list[Problem], str, list[dict[str, Any]]]:
    where = f"{path}"
    if not path.is_file():
        return (
            [Problem(FIELD, f"{where} does not exist", "check the path (it is read on the worker's machine)")],
            "",
            [],
        )
    out: list[Problem] = []
    rows: list[dict[str, Any]] = []
    kind = ""
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                out.append(Problem(FIELD, f"{where} row {n} is not JSON ({exc.msg})", "write one JSON object a line"))
                continue
            this = "multiple_choice" if isinstance(row, dict) and "choices" in row else "generate_until"
            kind = kind or this
            problem, fixed = _row_problem(row, this, kind)
            if problem:
                out.append(Problem(FIELD, f"{where} row {n}: {problem[0]}", problem[1]))
            else:
                rows.append(fixed)
            if len(out) >= 10:
                out.append(Problem(FIELD, f"{where}: more rows with problems follow", "fix the rows above first"))
                break
    if not rows and not out:
        out.append(Problem(FIELD, f"{where} has no rows", 'add rows such as {"question": "2+2?", "answer": "4"}'))
    return out, kind, rows


def _row_problem(row: Any, this: str, kind: str) -> tuple[tuple[str, str] | None, dict[str, Any]]:
    """(problem, fix) of one row, or None and the row normalised."""
    example = '{"question": "2+2?", "choices": ["3", "4"], "answer": 1}'
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
        return ("has no `question` text", f"write rows such as {example}"), {}
    if this != kind:
        return (
            f"is {this.replace('_', ' ')} but the file's first row is {kind.replace('_', ' ')}",
            "keep multiple-choice rows (with choices) and answer-only rows in separate files",
        ), {}
    answer = row.get("answer")
    if this == "generate_until":
        return _generation_row(row)
    choices = row.get("choices")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        return ("`choices` is not a list of two or more texts", f"write rows such as {example}"), {}
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        index = answer
    elif isinstance(answer, str) and answer in choices:
        index = choices.index(answer)
    else:
        return (
            f"`answer` {answer!r} is neither an index below {len(choices)} nor one of the choices",
            "give the right choice's index (from 0) or its exact text",
        ), {}
    return None, {"question": row["question"], "choices": choices, "answer": index}


def _generation_row(row: dict[str, Any]) -> tuple[tuple[str, str] | None, dict[str, Any]]:
    """(problem, fix) of a generation row, or None and the row with `answer` and `regex` ("" where not given)."""
    answer, regex = row.get("answer"), row.get("regex")
    has_answer = isinstance(answer, (str, int, float)) and not isinstance(answer, bool) and bool(str(answer).strip())
    if regex is not None and (not isinstance(regex, str) or not regex.strip()):
        return ("`regex` is not a pattern text", 'write it as a string, e.g. {"regex": "\\b4\\b"}'), {}
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            return (
                f"`regex` {regex!r} is not a regular expression ({exc})",
                "fix the pattern (Python's re syntax)",
            ), {}
    if not has_answer and regex is None:
        return (
            "has no `answer` (nor a `regex`)",
            'give the expected answer, a pattern the answer must contain, or both: {"question": "2+2?", "answer": "4"}',
        ), {}
    return None, {
        "question": row["question"],
        "answer": str(answer).strip() if has_answer else "",
        "regex": regex or "",
    }


def _normal(text: str) -> str:
    """Case, punctuation and runs of spaces ignored (what exact match compares)."""
    return " ".join(text.lower().translate(_PUNCTUATION).split())


def answer_scores(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """lm-eval's `process_results` of a generation row: exact_match where it gives an answer, regex_match where a regex."""
    reply = results[0] if results else ""
    out: dict[str, float] = {}
    if doc.get("answer"):
        out["exact_match"] = float(_normal(reply) == _normal(str(doc["answer"])))
    if doc.get("regex"):
        out["regex_match"] = float(re.search(str(doc["regex"]), reply) is not None)
    return out


def lm_eval_spec(folder: Path, task: str) -> str | dict[str, Any]:
    """What lm-eval is handed for `task`: a generation task written here as its config with `answer_scores` as its
    `process_results` (a function can only be handed in, never written into a YAML without running code from a
    file); any other task by its name."""
    path = folder / f"{task}.yaml"
    if not path.is_file():
        return task
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    if config.get("output_type") != "generate_until":
        return task
    return {**config, "process_results": answer_scores}


def _yaml_task_name(path: Path) -> str | None:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaggedLoader)  # noqa: S506 - tags become None
    except (OSError, yaml.YAMLError):
        return None
    name = data.get("task") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name.strip() else None


def _yaml_problems(path: Path) -> list[Problem]:
    if not path.is_file():
        return [Problem(FIELD, f"{path} does not exist", "check the path (it is read on the worker's machine)")]
    if _yaml_task_name(path) is None:
        return [
            Problem(
                FIELD,
                f"{path} is not an lm-evaluation-harness task file (no `task:` name at its top)",
                "write a task YAML as lm-eval documents it (task, dataset_path, output_type, doc_to_text, ...)",
            )
        ]
    return []


class _TaggedLoader(yaml.SafeLoader):
    """A safe loader that reads lm-eval's `!function module.name` tags as None (only the task name is read)."""


_TaggedLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def generation_budget(rows: list[dict[str, Any]], count_tokens: Callable[[str], int] | None) -> int:
    """The most tokens a generation task's replies may have: its longest expected answer's tokens plus
    ANSWER_MARGIN when every row gives an answer (a longer reply cannot match), else MAX_GEN_TOKS (a pattern
    alone may match anywhere); never above MAX_GEN_TOKS. `count_tokens`: the scored model's tokenizer."""
    if count_tokens is None or not rows or not all(r.get("answer") for r in rows):
        return MAX_GEN_TOKS
    return min(MAX_GEN_TOKS, max(count_tokens(str(r["answer"])) for r in rows) + ANSWER_MARGIN)


def write_tasks(
    refs: list[TaskRef], folder: Path, count_tokens: Callable[[str], int] | None = None
) -> tuple[list[str], dict[str, str]]:
    """Write the question files as lm-eval tasks into `folder`; (include paths, {lm-eval task name: ref name}).
    `count_tokens` (the scored model's tokenizer) sizes each generation task's replies (`generation_budget`)."""
    folder.mkdir(parents=True, exist_ok=True)
    include: list[str] = [str(folder)]
    names: dict[str, str] = {}
    for i, ref in enumerate(refs):
        if ref.kind is TaskKind.QUESTIONS:
            task = f"tunedeck_{i}_{re.sub(r'[^A-Za-z0-9_]', '_', ref.name)}"
            kind, rows = read_questions(Path(ref.ref))
            data = folder / f"{task}.jsonl"
            data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
            metrics = [
                m for m, key in (("exact_match", "answer"), ("regex_match", "regex")) if any(r.get(key) for r in rows)
            ]
            config = _task_config(task, kind, data, metrics, generation_budget(rows, count_tokens))
            (folder / f"{task}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            names[task] = ref.name
        elif ref.kind is TaskKind.YAML:
            parent = str(Path(ref.ref).resolve().parent)
            include += [parent] if parent not in include else []
            names[ref.name] = ref.name
        else:
            names[ref.ref] = ref.name
    return include, names


def _task_config(task: str, kind: str, data: Path, metrics: list[str], budget: int = MAX_GEN_TOKS) -> dict[str, Any]:
    """lm-eval's task YAML for a file of questions (read by its TaskManager through include_path)."""
    config: dict[str, Any] = {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": kind,
        "doc_to_text": "Question: {{question}}\nAnswer:",
    }
    if kind == "multiple_choice":
        config |= {
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{answer}}",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        }
    else:  # scored by `answer_scores` (handed in by `lm_eval_spec`): the metrics its rows give
        config |= {
            "doc_to_target": "{{answer}}",
            "generation_kwargs": {"until": ["\n"], "do_sample": False, "max_gen_toks": budget},
            "metric_list": [{"metric": metric, "aggregation": "mean", "higher_is_better": True} for metric in metrics],
        }
    return config


def watched_task_problems(metric_for_best_model: str, eval_tasks: str | None) -> list[Problem]:
    """Why the task score `metric_for_best_model` names cannot be watched during training ([] when it can, or when it
    names no task): it must be a .jsonl of questions in eval_tasks (read here), scored by the metric named."""
    from jobs.spec.evaluation import watched_task

    task = watched_task(metric_for_best_model)
    ref = next((r for r in task_refs(eval_tasks) if task is not None and r.name == task[0]), None)
    if task is None or ref is None:
        return []  # not a task score, or one eval_tasks does not list (the spec's own problems say so)
    field, (name, metric) = "metric_for_best_model", task
    if ref.kind is not TaskKind.QUESTIONS:
        where = "the hub's" if ref.kind is TaskKind.HUB else "a task YAML's"
        return [
            Problem(
                field,
                f"{name} is {where} task: only a .jsonl of questions is scored during training",
                "write the questions as a .jsonl (question, choices, answer) and watch it, or watch eval_loss",
            )
        ]
    problems, kind, rows = _rows_problems(Path(ref.ref))
    if problems:
        return []  # eval_tasks' own problems name the rows
    produced = (
        ["acc"]
        if kind == "multiple_choice"
        else [m for m, k in (("exact_match", "answer"), ("regex_match", "regex")) if any(r.get(k) for r in rows)]
    )
    if metric in produced:
        return []
    return [
        Problem(
            field,
            f"{ref.ref} is not scored by {metric} (its rows give {', '.join(produced)})",
            f"watch task:{name}/{produced[0]}",
        )
    ]
