"""Declared rewards (`jobs.spec.rewards.RewardSpec`) as the callables trl's GRPOTrainer calls, and their weights.

Pure: a declared reward in, a reward function out (no I/O, nothing loaded here). trl calls each as
`func(prompts=..., completions=..., completion_ids=..., <the data's other columns>=...)` and logs its
scores as `rewards/<func.__name__>/mean`, so each callable carries its reward's name. Completions come
as text (plain prompts) or as one assistant message (chat prompts); `text_of` reads both.

A judge reward (kind `judge`) asks a judge model or endpoint, handed in as `judge_for` (`jobs.train.judges`):
nothing is loaded until its first call.

Patterns run under the `regex` package's timeout (`PATTERN_TIMEOUT_S` per completion): a pattern that
backtracks catastrophically scores 0 for that completion instead of stalling the worker.

    funcs = reward_functions(declared, spec.max_completion_length)
    weights = [r.weight for r in declared]
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from jobs.spec.rewards import RewardKind, RewardSpec

log = logging.getLogger(__name__)
PATTERN_TIMEOUT_S = 0.25
_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d+)*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_SCORE = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)")
JUDGE_PROMPT = (
    "You score an answer to a question by this rubric:\n{rubric}\n\nQuestion:\n{prompt}\n\nAnswer:\n{completion}\n\n"
    "Reply with a score from 0 to {scale} (higher is better by the rubric), then one sentence of reason.\n\nScore:"
)
AskAll = Callable[[list[str]], list[str]]  # a judge: every prompt at once -> its replies (`jobs.train.judges`)
JudgeFor = Callable[[str], AskAll]  # a judge reference -> that judge, made on first use and held


def text_of(completion: Any) -> str:
    """A completion's text: the string itself, or the content of its (last) assistant message."""
    if isinstance(completion, list):
        return str(completion[-1].get("content") or "") if completion else ""
    return str(completion)


def timed_search(pattern: Any, text: str, how: str = "search") -> Any:
    """`pattern.search/match(text)` under the timeout; None when it found nothing or ran out of time."""
    try:
        return getattr(pattern, how)(text, timeout=PATTERN_TIMEOUT_S)
    except TimeoutError:
        log.warning(
            "reward pattern %r ran out of time (%ss) on a completion: scored 0", pattern.pattern, PATTERN_TIMEOUT_S
        )
        return None


class Scorer:
    """One declared reward as a trl reward function: scores each completion with `score(text, row)`; a judge reward
    asks its judge (`judge_for(reward.judge)`, on the first call) about every completion at once."""

    def __init__(self, reward: RewardSpec, judge_for: JudgeFor | None = None):
        import regex

        self.reward = reward
        self.judge_for = judge_for
        self.ask_all: AskAll | None = None
        self.unparsed = 0  # judge replies without a score, over every call
        self.__name__ = reward.name
        flags = regex.IGNORECASE if reward.ignore_case else 0
        self.pattern = regex.compile(reward.pattern, flags) if reward.pattern else None
        self.extract = regex.compile(reward.extract) if reward.extract else None
        self.schema = json.loads(reward.schema) if reward.schema is not None else None
        words = reward.words
        nocase = reward.ignore_case is not False
        self.words = [
            regex.compile(rf"(?<!\w){regex.escape(w)}(?!\w)", regex.IGNORECASE if nocase else 0) for w in words
        ]

    def __call__(
        self, completions: list[Any], completion_ids: Sequence[Sequence[int]] | None = None, **kw: Any
    ) -> list[float | None]:
        if self.reward.kind is RewardKind.JUDGE:
            return self.judged(kw.get("prompts") or [""] * len(completions), completions)
        column = self.reward.column
        refs = kw.get(column) if column else None
        if column and refs is None:  # checked at submit (jobs.checks.rewards); a data set changed since
            raise KeyError(f"reward {self.__name__}: the data has no column `{column}` (it has: {', '.join(kw)})")
        out: list[float | None] = []
        for i, completion in enumerate(completions):
            n_tokens = len(completion_ids[i]) if completion_ids is not None else None
            out.append(self.score(text_of(completion), refs[i] if refs is not None else None, n_tokens))
        return out

    def judged(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[float | None]:
        """The judge's score of each completion as score/scale; None (skipped) for a reply that gives none."""
        if self.ask_all is None:
            if self.judge_for is None:
                raise ValueError(f"reward {self.__name__}: a judge reward needs judge_for (reward_functions' judges)")
            self.ask_all = self.judge_for(str(self.reward.judge))
        scale = self.reward.scale
        asked = [
            JUDGE_PROMPT.format(rubric=self.reward.rubric, prompt=text_of(p), completion=text_of(c), scale=scale)
            for p, c in zip(prompts, completions, strict=True)
        ]
        scores = [judge_score(reply, scale) for reply in self.ask_all(asked)]
        missing = sum(s is None for s in scores)
        self.unparsed += missing
        if missing:
            log.warning(
                "reward %s: %d of %d judge replies gave no score (skipped)", self.__name__, missing, len(scores)
            )
        return scores

    def answer(self, text: str) -> str | None:
        """The answer part of a completion: extract's first group (or whole match) of its last match, else None;
        without extract, the whole stripped completion."""
        if self.extract is None:
            return text.strip()
        try:
            matches = list(self.extract.finditer(text, timeout=PATTERN_TIMEOUT_S))
        except TimeoutError:
            return None
        if not matches:
            return None
        found = matches[-1]
        return (found.group(1) if self.extract.groups else found.group(0)).strip()

    def score(self, text: str, ref: Any, n_tokens: int | None) -> float | None:
        kind = self.reward.kind
        if kind is RewardKind.REGEX:
            return float(timed_search(self.pattern, text, self.reward.mode) is not None)
        if kind is RewardKind.CONTAINS:
            return float(_fold(str(ref), self.reward.ignore_case) in _fold(text, self.reward.ignore_case))
        if kind is RewardKind.EXACT:
            answer = self.answer(text)
            return float(
                answer is not None
                and _fold(answer, self.reward.ignore_case) == _fold(str(ref).strip(), self.reward.ignore_case)
            )
        if kind is RewardKind.NUMERIC:
            return _numeric(self.answer(text) if self.extract else text, ref, self.reward.tolerance)
        if kind in (RewardKind.JSON_VALID, RewardKind.JSON_SCHEMA):
            return self._json(text)
        if kind is RewardKind.LENGTH:
            target = self.reward.target or 1
            n = n_tokens if n_tokens is not None else len(text.split())
            return max(0.0, 1.0 - abs(n - target) / target)
        found = sum(timed_search(w, text) is not None for w in self.words) / len(self.words)
        return found if kind is RewardKind.REQUIRED_WORDS else -found

    def _json(self, text: str) -> float:
        answer = self.answer(text)
        if answer is None:
            return 0.0
        fenced = _FENCE.match(answer)
        try:
            value = json.loads(fenced.group(1) if fenced else answer)
        except (json.JSONDecodeError, RecursionError):
            return 0.0
        if self.schema is None:
            return 1.0
        import jsonschema

        return float(jsonschema.validators.validator_for(self.schema)(self.schema).is_valid(value))


def judge_score(reply: str, scale: int) -> float | None:
    """The first number of a judge's reply, clamped to 0..scale, as a share of scale; None when it has none."""
    found = _SCORE.search(reply)
    if found is None:
        return None
    return min(max(float(found.group(0)), 0.0), float(scale)) / scale


def _fold(text: str, ignore_case: bool | None) -> str:
    return text.casefold() if ignore_case else text


def _number(text: str) -> float | None:
    """The last number in `text` (1,234.5 reads as 1234.5), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _numeric(answer: str | None, ref: Any, tolerance: float) -> float | None:
    """1 when the answer's number is within tolerance of the reference's; None (skipped) for a reference that
    is not a number, as trl's accuracy reward skips an unparseable reference."""
    expected = ref if isinstance(ref, (int, float)) and not isinstance(ref, bool) else _number(str(ref))
    if expected is None or not math.isfinite(expected):
        return None
    got = _number(answer) if answer is not None else None
    return float(got is not None and abs(got - float(expected)) <= tolerance)


class _ChatOrPlain:
    """trl's text rewards read chat completions ([{'content': ...}]); plain-text prompts give strings, so each
    string is wrapped as one message first; `column` is handed on as trl's `solution`."""

    def __init__(self, func: Callable[..., list[Any]], name: str, column: str | None = None):
        self.func = func
        self.__name__ = name
        self.column = column

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[Any]:
        chats = [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]
        if self.column is not None:
            kwargs["solution"] = [str(s) for s in kwargs.pop(self.column)]
        return self.func(chats, **kwargs)


def trl_reward(reward: RewardSpec, max_completion_length: int) -> Callable[..., list[Any]]:
    """The trl.rewards callable behind one of trl's reward kinds, named for its metric."""
    from trl import rewards

    kind, name, column = reward.kind, reward.name, reward.reference_column
    if kind is RewardKind.THINK_FORMAT:
        return _ChatOrPlain(rewards.think_format_reward, name)
    if kind is RewardKind.ACCURACY:
        return _ChatOrPlain(rewards.accuracy_reward, name, column)
    if kind is RewardKind.REASONING_ACCURACY:
        return _ChatOrPlain(rewards.reasoning_accuracy_reward, name, column)
    if kind is RewardKind.COSINE_LENGTH:
        return _ChatOrPlain(rewards.get_cosine_scaled_reward(max_len=max_completion_length), name, column)
    if kind is RewardKind.REPETITION:
        func = rewards.get_repetition_penalty_reward(ngram_size=reward.ngram_size, max_penalty=-1.0)
    else:  # overlong: the penalty starts a quarter of the budget before the end (at least one token)
        func = rewards.get_soft_overlong_punishment(max_completion_length, max(1, max_completion_length // 4))
    func.__name__ = name
    return func


def reward_functions(
    declared: Sequence[RewardSpec], max_completion_length: int, judge_for: JudgeFor | None = None
) -> list[Callable[..., list[Any]]]:
    """One trl reward function per declared reward, in order (their weights: `[r.weight for r in declared]`);
    `judge_for`: the judges of judge rewards by reference (`jobs.train.judges.reward_judges`), asked on first use."""
    from jobs.spec.rewards import TRL_KINDS

    return [trl_reward(r, max_completion_length) if r.kind in TRL_KINDS else Scorer(r, judge_for) for r in declared]
