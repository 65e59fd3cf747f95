"""GRPO's rewards, declared in the spec: trl.rewards' functions and scorers with parameters, each with a weight.

A spec declares its rewards without code, so every access policy accepts them. The stored form of the
`rewards` field is one text: the short list of parameterless rewards (`think_format, repetition=0.5`),
or a YAML/JSON list, which is what a YAML spec's list becomes (JSON text, `jobs.spec.parse`):

    rewards: [{kind: regex, pattern: "^<answer>", weight: 0.5}, {kind: exact, column: answer}, think_format]

`parse_rewards` reads that text once into typed `RewardSpec`s and names every problem by its place
(`rewards[0].pattern: ...`); it compiles each pattern and checks each JSON schema here, so nothing that
cannot run is queued. What the data must hold (a `column`) is checked with the data
(`jobs.checks.rewards`); the callables trl calls are built by `jobs.config.rewards`. No trl import.
A custom function (`reward_function: my_rewards:score`) is code: `jobs.spec.custom_reward`.

    declared, problems = parse_rewards('[{kind: regex, pattern: "^A", weight: 0.5}, think_format]')
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from jobs.errors import Problem

FIELD = "rewards"
PATTERN_MAX = 500  # characters of a declared pattern (with the regex module's timeout: jobs.config.rewards)
WORDS_MAX = 200
RUBRIC_MAX = 4000  # characters of a judge's rubric
SCALE_MAX = 1000
JUDGE_BATCH = 8  # prompts a loaded judge model answers at once (`jobs.train.judges`)
JUDGE_REPLY_TOKENS = 16  # a judge reward's reply: its score first, so a few tokens


class RewardKind(str, Enum):
    # trl.rewards
    THINK_FORMAT = "think_format"
    REPETITION = "repetition"
    OVERLONG = "overlong"
    ACCURACY = "accuracy"
    REASONING_ACCURACY = "reasoning_accuracy"
    COSINE_LENGTH = "cosine_length"
    # declared scorers
    REGEX = "regex"
    EXACT = "exact"
    NUMERIC = "numeric"
    CONTAINS = "contains"
    JSON_VALID = "json_valid"
    JSON_SCHEMA = "json_schema"
    LENGTH = "length"
    REQUIRED_WORDS = "required_words"
    FORBIDDEN_WORDS = "forbidden_words"
    JUDGE = "judge"


@dataclass(frozen=True)
class KindInfo:
    """What a reward kind scores, the parameters it takes (beside `weight` and `name`) and those it needs."""

    help: str
    params: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    metric: str | None = None  # the logged name (rewards/<name>/mean) when it is not the kind's own


def _kind(help: str, params: str = "", required: str = "", metric: str | None = None) -> KindInfo:
    return KindInfo(help, frozenset(params.split()), frozenset(required.split()), metric)


_ANSWER = "column (your data's reference answers), extract (a regex whose first group is the answer; else "
KINDS: dict[RewardKind, KindInfo] = {
    RewardKind.THINK_FORMAT: _kind(
        "1 when the completion is <think>...</think> then the answer, else 0 (trl think_format_reward)",
        metric="think_format_reward",
    ),
    RewardKind.REPETITION: _kind(
        "0 for no repeated token n-grams, down to -1 for a fully repetitive completion; ngram_size (default 3) "
        "(trl get_repetition_penalty_reward)",
        "ngram_size",
        metric="repetition_penalty_reward",
    ),
    RewardKind.OVERLONG: _kind(
        "0 up to max_completion_length minus a quarter, then down to -1 at max_completion_length (trl "
        "get_soft_overlong_punishment, DAPO)",
        metric="soft_overlong_punishment_reward",
    ),
    RewardKind.ACCURACY: _kind(
        "1 when the completion's LaTeX answer (\\boxed{} first) equals the column's, by math-verify; rows whose "
        "reference does not parse are skipped (trl accuracy_reward); column defaults to solution",
        "column",
        metric="accuracy_reward",
    ),
    RewardKind.REASONING_ACCURACY: _kind(
        "accuracy of the answer after </think> (0 without it) (trl reasoning_accuracy_reward); column "
        "defaults to solution",
        "column",
        metric="reasoning_accuracy_reward",
    ),
    RewardKind.COSINE_LENGTH: _kind(
        "accuracy scaled by length: correct 1 (short) to 0.5 (max_completion_length), wrong -1 (short) to -0.5 "
        "(trl get_cosine_scaled_reward); column defaults to solution",
        "column",
        metric="cosine_scaled_reward",
    ),
    RewardKind.REGEX: _kind(
        "1 when pattern is found (mode: search, default) or matches at the start (mode: match), else 0; ignore_case",
        "pattern mode ignore_case",
        "pattern",
    ),
    RewardKind.EXACT: _kind(
        "1 when the answer equals the row's reference, else 0; " + _ANSWER + "the whole completion), ignore_case",
        "column extract ignore_case",
        "column",
    ),
    RewardKind.NUMERIC: _kind(
        "1 when the answer's number is within tolerance (default 0) of the reference's, else 0; "
        + _ANSWER
        + "the last number in the completion)",
        "column extract tolerance",
        "column",
    ),
    RewardKind.CONTAINS: _kind(
        "1 when the completion contains the row's reference, else 0; column, ignore_case",
        "column ignore_case",
        "column",
    ),
    RewardKind.JSON_VALID: _kind(
        "1 when the completion (or extract's first group; a ```json fence is removed) is valid JSON, else 0",
        "extract",
    ),
    RewardKind.JSON_SCHEMA: _kind(
        "1 when the completion is JSON valid under schema (a JSON Schema, checked at submit), else 0; extract",
        "schema extract",
        "schema",
    ),
    RewardKind.LENGTH: _kind(
        "1 at target completion tokens, falling linearly to 0 at 0 and at twice the target",
        "target",
        "target",
    ),
    RewardKind.REQUIRED_WORDS: _kind(
        "the share of words (whole words; ignore_case, default true) found in the completion, 0 to 1",
        "words ignore_case",
        "words",
    ),
    RewardKind.FORBIDDEN_WORDS: _kind(
        "minus the share of words found in the completion, 0 (none) to -1 (all)",
        "words ignore_case",
        "words",
    ),
    RewardKind.JUDGE: _kind(
        "a judge model's score of the completion under rubric: it replies with a score from 0 to scale (default "
        "10), the reward is score/scale (0 to 1); a reply without a score is skipped; judge: a built-in model, a "
        "folder, run:N, or an OpenAI-compatible endpoint URL#MODEL",
        "judge rubric scale",
        "judge rubric",
    ),
}
TRL_KINDS = frozenset(list(RewardKind)[:6])  # the ones trl.rewards scores
ANSWER_KINDS = frozenset({RewardKind.ACCURACY, RewardKind.REASONING_ACCURACY, RewardKind.COSINE_LENGTH})
MODES = ("search", "match")
_COMMON = frozenset({"kind", "weight", "name"})
_EXAMPLE = '[{kind: regex, pattern: "^<answer>", weight: 0.5}, {kind: exact, column: answer}, think_format]'
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RewardSpec:
    """One declared reward: its kind, weight, logged name and the parameters its kind takes."""

    kind: RewardKind
    weight: float = 1.0
    name: str = ""  # the metric is rewards/<name>/mean
    pattern: str | None = None
    mode: str = "search"
    column: str | None = None
    extract: str | None = None
    tolerance: float = 0.0
    ignore_case: bool | None = None  # None: the kind's default (words: true, else false)
    schema: str | None = None  # JSON text of a JSON Schema
    target: int | None = None
    words: tuple[str, ...] = ()
    ngram_size: int = 3
    judge: str | None = None  # a built-in model, a folder, run:N, or an endpoint URL#MODEL
    rubric: str | None = None
    scale: int = 10

    @property
    def local_judge(self) -> str | None:
        """The judge model this reward loads in the training process (a built-in, a folder, run:N); None for an
        endpoint judge and for other kinds."""
        ref = (self.judge or "").strip()
        return ref if self.kind is RewardKind.JUDGE and ref and not ref.startswith(("http://", "https://")) else None

    @property
    def reference_column(self) -> str | None:
        """The data column this reward reads, if any (trl's accuracy rewards read `solution` by default)."""
        return self.column or ("solution" if self.kind in ANSWER_KINDS else None)


def parse_rewards(text: str) -> tuple[list[RewardSpec], list[Problem]]:
    """The stored `rewards` text -> ([declared rewards], [problems, each naming `rewards[i].param`])."""
    items, problems = _items(text)
    declared: list[RewardSpec] = []
    for i, item in enumerate(items):
        reward, found = _reward(i, item)
        problems += found
        if reward is not None:
            declared.append(reward)
    declared = _named(declared)
    seen: set[str] = set()
    for i, r in enumerate(declared):
        if r.name in seen:
            problems.append(Problem(f"{FIELD}[{i}].name", f"`{r.name}` is used twice", "give each reward its own name"))
        seen.add(r.name)
    if not items and not problems:
        problems.append(Problem(FIELD, "lists no reward", f"leave it empty, or declare rewards, e.g. {_EXAMPLE}"))
    return (declared if not problems else []), problems


def _items(text: str) -> tuple[list[Any], list[Problem]]:
    """The stored text as a list of items: a YAML/JSON list, or names (`name` or `name=weight`) by commas."""
    if text.lstrip().startswith("["):
        import yaml

        try:
            loaded = json.loads(text)  # the stored form
        except json.JSONDecodeError:
            try:
                loaded = yaml.safe_load(text)  # typed into the form as a YAML flow list
            except yaml.YAMLError as exc:
                problem = f"is not a valid list ({str(exc).splitlines()[0]})"
                return [], [Problem(FIELD, problem, f"write e.g. {_EXAMPLE}")]
        return (loaded, []) if isinstance(loaded, list) else ([], [Problem(FIELD, "is not a list", _EXAMPLE)])
    items: list[Any] = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            name, sep, weight = (x.strip() for x in part.partition("="))
            items.append({"kind": name, "weight": weight} if sep else name)
    return items, []


def _reward(i: int, item: Any) -> tuple[RewardSpec | None, list[Problem]]:
    """One list item (a kind's name, or a mapping with `kind`) as a RewardSpec, or its problems."""
    where = f"{FIELD}[{i}]"
    if isinstance(item, str):
        item = {"kind": item}
    if not isinstance(item, dict) or "kind" not in item:
        return None, [Problem(where, "is neither a reward's name nor a mapping with `kind`", f"write e.g. {_EXAMPLE}")]
    try:
        kind = RewardKind(str(item["kind"]).strip())
    except ValueError:
        choices = ", ".join(k.value for k in RewardKind)
        return None, [Problem(f"{where}.kind", f"`{item['kind']}` is not a reward", f"use one of: {choices}")]
    info = KINDS[kind]
    problems = [
        Problem(f"{where}.{key}", f"is not a parameter of {kind.value}", _takes(kind))
        for key in item
        if key not in _COMMON | info.params
    ]
    problems += [
        Problem(f"{where}.{key}", f"{kind.value} needs it", _takes(kind)) for key in sorted(info.required - set(item))
    ]
    values: dict[str, Any] = {}
    for key, raw in item.items():
        if key != "kind" and key in _COMMON | info.params:
            value, problem = _param(key, raw)
            if problem:
                problems.append(Problem(f"{where}.{key}", *problem))
            else:
                values[key] = value
    if problems:
        return None, problems
    return RewardSpec(kind, **values), []


def _takes(kind: RewardKind) -> str:
    params = sorted(KINDS[kind].params)
    return f"{kind.value} takes weight, name" + (", " + ", ".join(params) if params else "")


def _param(key: str, raw: Any) -> tuple[Any, tuple[str, str] | None]:
    """A parameter's value, checked on its own: (value, None) or (None, (problem, fix))."""
    if key == "weight":
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(raw, bool) or not math.isfinite(value) or abs(value) > 100:
            return None, (f"`{raw}` is not a finite number within -100..100", "write a weight such as 0.5 or -1")
        return value, None
    if key in ("pattern", "extract"):
        return _pattern(raw, key)
    if key in ("name", "column", "mode"):
        text = str(raw).strip() if isinstance(raw, (str, int)) and not isinstance(raw, bool) else ""
        if key == "mode" and text not in MODES:
            return None, (f"`{raw}` is not a mode", "use search (anywhere) or match (at the start)")
        if key == "name" and not _IDENT.match(text):
            return None, (f"`{raw}` is not a name", "use letters, digits and _ (it names the logged metric)")
        return (text, None) if text else (None, ("is empty", f"give the {key}"))
    if key in ("ignore_case",):
        return (
            (raw, None) if isinstance(raw, bool) else (None, (f"`{raw}` is not true or false", "write true or false"))
        )
    if key in ("target", "ngram_size"):
        ok = isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= 100_000
        return (raw, None) if ok else (None, (f"`{raw}` is not a whole number >= 1", "write e.g. 64"))
    if key == "tolerance":
        ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw) and raw >= 0
        return (float(raw), None) if ok else (None, (f"`{raw}` is not a number >= 0", "write e.g. 0.01"))
    if key == "words":
        return _words(raw)
    if key in ("judge", "rubric", "scale"):
        return _judging(key, raw)
    if key == "schema":
        from jobs.spec.reward_schema import checked_schema

        return checked_schema(raw)
    raise AssertionError(key)  # pragma: no cover - KINDS lists only the parameters handled here


def _pattern(raw: Any, key: str) -> tuple[str | None, tuple[str, str] | None]:
    """A pattern compiled now, with the module that runs it (`regex`), so one that cannot compile is refused."""
    import regex

    if not isinstance(raw, str) or not raw:
        return None, ("is not a pattern", 'write a regular expression, e.g. "Answer: (\\d+)"')
    if len(raw) > PATTERN_MAX:
        return None, (f"is {len(raw)} characters long", f"keep a pattern within {PATTERN_MAX} characters")
    try:
        compiled = regex.compile(raw)
    except regex.error as exc:
        return None, (f"`{raw}` does not compile ({exc})", "fix the regular expression (Python `re` syntax)")
    if key == "extract" and compiled.groups > 1:
        return None, (f"`{raw}` has {compiled.groups} groups", "keep one group around the answer, (?:...) for others")
    return raw, None


def _judging(key: str, raw: Any) -> tuple[Any, tuple[str, str] | None]:
    """A judge reward's parameter: the judge's reference (its form only; whether it resolves is checked with the
    models and runs, `jobs.checks.rewards`), the rubric, the scale."""
    if key == "scale":
        ok = isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= SCALE_MAX
        return (raw, None) if ok else (None, (f"`{raw}` is not a whole number from 1 to {SCALE_MAX}", "write e.g. 10"))
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        what = "what a good completion is, e.g. 'Polite, correct and brief'" if key == "rubric" else _JUDGE_FORMS
        return None, ("is empty" if isinstance(raw, str) else f"`{raw}` is not text", f"write {what}")
    if key == "rubric":
        ok = len(text) <= RUBRIC_MAX
        return (text, None) if ok else (None, (f"is {len(text)} characters long", f"keep it within {RUBRIC_MAX}"))
    if text.startswith(("http://", "https://")) and not text.partition("#")[2].strip():
        return None, (f"`{text}` names no model", "write the endpoint as URL#MODEL, e.g. https://host/v1#gpt-4o-mini")
    if text.lower().startswith("run:") and not text[4:].strip().isdigit():
        return None, (f"`{text}` names no run", "write run:N with a finished run's id, e.g. run:7")
    return text, None


_JUDGE_FORMS = "a built-in model's name, a model folder, run:N, or an OpenAI-compatible endpoint URL#MODEL"


def _words(raw: Any) -> tuple[tuple[str, ...] | None, tuple[str, str] | None]:
    words = [raw] if isinstance(raw, str) else raw
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
        return None, ("is not a list of words", "write e.g. [please, thanks]")
    if len(words) > WORDS_MAX:
        return None, (f"lists {len(words)} words", f"list at most {WORDS_MAX}")
    return tuple(w.strip() for w in words), None


def _named(declared: list[RewardSpec]) -> list[RewardSpec]:
    """Each reward with its metric name: the one given, else its kind's (trl's function name for trl's own);
    a second one of a kind gets _2, a third _3, ..."""
    import dataclasses

    counts: dict[str, int] = {}
    out = []
    for r in declared:
        if r.name:
            out.append(r)
            continue
        base = KINDS[r.kind].metric or r.kind.value
        counts[base] = counts.get(base, 0) + 1
        out.append(dataclasses.replace(r, name=base if counts[base] == 1 else f"{base}_{counts[base]}"))
    return out


def reward_series(declared: list[RewardSpec]) -> dict[str, str]:
    """{chart label: logged metric} of each declared reward's mean (trl logs `rewards/<name>/mean`), for the run
    page's trainer-metrics chart: one curve per reward function."""
    return {f"reward {r.name}": f"rewards/{r.name}/mean" for r in declared}
