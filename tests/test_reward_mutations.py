"""Each declared reward's scorer is held by its hand-made cases (issue 45: "a mutation of each scorer fails its test").

For every kind `jobs.config.rewards.Scorer` scores, and for the wrapper that hands trl's rewards their reference
column, each mutant below is put in place of the real code for that kind alone, and the hand-made cases of
tests/test_rewards_declared.py are scored again: at least one case must come out other than expected. A mutant
no case catches is a scorer whose tests could not fail, and fails here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import jobs.config.rewards as rewards
from jobs.spec.rewards import RewardKind
from tests.test_rewards_declared import CASES, score

Score = Callable[[rewards.Scorer, str, Any, "int | None"], "float | None"]
REAL_SCORE = rewards.Scorer.score
REAL_ANSWER = rewards.Scorer.answer


def _shifted(self: rewards.Scorer, text: str, ref: Any, n: int | None) -> float | None:
    """The length scorer aimed one token past its target."""
    target = (self.reward.target or 1) + 1
    count = n if n is not None else len(text.split())
    return max(0.0, 1.0 - abs(count - target) / target)


def _any_word(self: rewards.Scorer, text: str, ref: Any, n: int | None) -> float | None:
    """The word lists scored as 'any word found' instead of the share found."""
    found = float(any(rewards.timed_search(w, text) is not None for w in self.words))
    return found if self.reward.kind is RewardKind.REQUIRED_WORDS else -found


def _searched(self: rewards.Scorer, text: str, ref: Any, n: int | None) -> float | None:
    """A regex searched anywhere, whatever its mode."""
    return float(rewards.timed_search(self.pattern, text) is not None)


def _folded(self: rewards.Scorer, text: str, ref: Any, n: int | None) -> float | None:
    """Case always ignored."""
    return REAL_SCORE(self, text.casefold(), str(ref).casefold() if ref is not None else None, n)


def _exactly(self: rewards.Scorer, text: str, ref: Any, n: int | None) -> float | None:
    """A numeric match with no tolerance."""
    answer = self.answer(text) if self.extract else text
    got = rewards._number(answer) if answer is not None else None
    expected = rewards._number(str(ref))
    return None if expected is None else float(got == expected)


def _schema_ignored(self: rewards.Scorer, text: str, ref: Any, n: int | None) -> float | None:
    """Valid JSON passes whatever the schema says."""
    self.schema = None
    return REAL_SCORE(self, text, ref, n)


GENERIC: dict[str, Score] = {
    "always 1": lambda self, text, ref, n: 1.0,
    "always 0": lambda self, text, ref, n: 0.0,
    "negated": lambda self, text, ref, n: -(REAL_SCORE(self, text, ref, n) or 0.0),
}
SPECIFIC: dict[RewardKind, dict[str, Score]] = {
    RewardKind.REGEX: {"mode ignored": _searched},
    RewardKind.EXACT: {"case always ignored": _folded},
    RewardKind.CONTAINS: {"case always ignored": _folded},
    RewardKind.NUMERIC: {"no tolerance": _exactly},
    RewardKind.JSON_SCHEMA: {"schema ignored": _schema_ignored},
    RewardKind.LENGTH: {"target off by one": _shifted},
    RewardKind.REQUIRED_WORDS: {"any word instead of the share": _any_word},
    RewardKind.FORBIDDEN_WORDS: {"any word instead of the share": _any_word},
}
SCORED = [k for k in RewardKind if k in SPECIFIC or k in (RewardKind.JSON_VALID,)]
MUTANTS = [(kind, name, mutant) for kind in SCORED for name, mutant in {**GENERIC, **SPECIFIC.get(kind, {})}.items()]


def cases_of(kind: RewardKind) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = [case for case in CASES if case[0]["kind"] == kind.value]  # type: ignore[index]
    return found


def caught(kind: RewardKind) -> bool:
    """Whether some hand-made case of `kind` scores other than expected with the code as it is now."""
    return any(
        score(declared, completions, **columns) != expected
        for declared, completions, columns, expected in cases_of(kind)
    )


@pytest.mark.parametrize("kind,name,mutant", MUTANTS, ids=[f"{k.value}-{n}" for k, n, _ in MUTANTS])
def test_a_mutant_scorer_fails_a_hand_made_case(
    kind: RewardKind, name: str, mutant: Score, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cases_of(kind), f"no hand-made case scores {kind.value}"
    assert not caught(kind), "the real scorer must pass its own cases first"

    def mutated(self: rewards.Scorer, text: str, ref: Any, n: int | None) -> float | None:
        return mutant(self, text, ref, n) if self.reward.kind is kind else REAL_SCORE(self, text, ref, n)

    monkeypatch.setattr(rewards.Scorer, "score", mutated)
    assert caught(kind), f"{kind.value}: the mutant '{name}' passes every hand-made case"


def test_an_extract_that_takes_the_first_match_fails_a_case(monkeypatch: pytest.MonkeyPatch) -> None:
    def first(self: rewards.Scorer, text: str) -> str | None:
        if self.extract is None:
            return text.strip()
        found = self.extract.search(text)
        return None if found is None else (found.group(1) if self.extract.groups else found.group(0)).strip()

    monkeypatch.setattr(rewards.Scorer, "answer", first)
    assert caught(RewardKind.EXACT) and caught(RewardKind.NUMERIC)


@pytest.mark.parametrize("kind", [RewardKind.ACCURACY, RewardKind.REASONING_ACCURACY])
def test_trls_rewards_without_their_reference_column_fail_a_case(
    kind: RewardKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapper hands the declared column to trl as `solution`; a wrapper that drops it (trl then reads whatever
    `solution` the data happens to have, or fails) must not pass."""
    real = rewards._ChatOrPlain.__call__

    def dropped(self: rewards._ChatOrPlain, completions: list[Any], **kwargs: Any) -> list[Any]:
        if self.column is not None:
            kwargs.pop(self.column, None)
            kwargs["solution"] = ["0"] * len(completions)
            self = rewards._ChatOrPlain(self.func, self.__name__)
        return real(self, completions, **kwargs)

    assert not caught(kind)
    monkeypatch.setattr(rewards._ChatOrPlain, "__call__", dropped)
    assert caught(kind)
