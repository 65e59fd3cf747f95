"""A judge's win rate of a run against its base, on the prompts of its before/after samples.

    result = judge_run(store, run_id, "smollm2-135m-instruct")     # or a folder, "run:7", or an endpoint:
    result = judge_run(store, run_id, "https://api.example.com/v1#gpt-4o-mini")   # key: OPENAI_API_KEY, if trusted
    result.wins, result.ties, result.losses, result.unparsed, result.win_rate

The pairs are the run's before/after samples (`jobs.train.before_after`): each held-out prompt with
the base model's answer and the run's, answered greedily with the same settings when training ended,
so judging generates nothing but the verdicts. Each pair is judged twice, the run's answer shown
first and then second, which cancels a judge's bias for a position. A verdict is read from the start
of the judge's reply ("A", "B" or "tie", "Verdict: A" or "The answer is A", then a reason); a reply that
says none of these counts as a tie and is recorded as unparsed, so a weak judge makes the result
uncertain, never wrong in one direction. The verdicts and reasons are kept in the run folder's `judge.json` (artifact kind
`judge`), the counts as the "judge" task's scores (`Store.set_scores`) and a run event.

The judge is a model the worker can load (a built-in name, a local folder, a hub id where the hub is
reachable, or `run:N`, another run's result) or an OpenAI-compatible chat-completions endpoint,
written `URL#MODEL`, with its key in the worker's environment (OPENAI_API_KEY): never in a request. The key
goes only to an endpoint the worker's operator trusts (TUNEDECK_TRUSTED_ENDPOINTS, `jobs.checks.egress`); any
other endpoint is called without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.evaluate.card import JUDGE_TASK, refresh_card
from jobs.spec.job import SpecError
from jobs.train.judges import AskAll, endpoint_asker, in_batches, one_by_one
from storage.roles import Evaluations
from storage.store import Score

TASK = JUDGE_TASK  # the scores' task name
PROMPT = (
    "You compare two answers to the same question. Reply with the better answer's letter, A or B, or with "
    "tie, then one sentence of reason.\n\nQuestion:\n{prompt}\n\nAnswer A:\n{a}\n\nAnswer B:\n{b}\n\nVerdict:"
)
# "A", "Verdict: A", "answer: b", and the way small models lead with it: "The answer is A", "The better answer is B".
_VERDICT = re.compile(r"^\W*(?:verdict\W*|(?:the\s+)?(?:better\s+)?answer(?:\s+is)?\W*)?(a|b|tie)\b", re.IGNORECASE)


@dataclass
class Judgment:
    prompt: str
    run_first: bool  # the run's answer was shown as A
    reply: str
    verdict: str  # "run" | "base" | "tie" | "unparsed"


@dataclass
class JudgeResult:
    judge: str
    judgments: list[Judgment] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(j.verdict == verdict for j in self.judgments)

    @property
    def wins(self) -> int:
        return self.count("run")

    @property
    def losses(self) -> int:
        return self.count("base")

    @property
    def unparsed(self) -> int:
        return self.count("unparsed")

    @property
    def ties(self) -> int:
        return self.count("tie") + self.unparsed  # a reply without a verdict counts as a tie

    @property
    def win_rate(self) -> float | None:
        """(wins + ties / 2) / judgments; None without any."""
        n = len(self.judgments)
        return (self.wins + self.ties / 2) / n if n else None

    @property
    def stderr(self) -> float | None:
        """The win rate's standard error over the judgments (each scored 1, 0.5 or 0)."""
        n, rate = len(self.judgments), self.win_rate
        if rate is None or n < 2:
            return None
        points = [1.0 if j.verdict == "run" else 0.0 if j.verdict == "base" else 0.5 for j in self.judgments]
        return math.sqrt(sum((p - rate) ** 2 for p in points) / (n - 1) / n)

    def summary(self) -> str:
        rate = self.win_rate
        return (
            f"judge {self.judge}: the run won {self.wins}, tied {self.ties} and lost {self.losses} of "
            f"{len(self.judgments)} judgments against its base (both orders per prompt)"
            + (f"; win rate {rate:.2f}" if rate is not None else "")
            + (f"; {self.unparsed} replies without a verdict counted as ties" if self.unparsed else "")
        )


def parse_verdict(reply: str) -> str | None:
    """ "A", "B" or "tie" from the start of a judge's reply; None when it says none of them."""
    found = _VERDICT.match(reply.strip())
    if found is None:
        return None
    word = found.group(1).lower()
    return "tie" if word == "tie" else word.upper()


def judge_pairs(judge: str, ask_all: AskAll, pairs: Sequence[tuple[str, str, str]]) -> JudgeResult:
    """Judge (prompt, base answer, run answer) pairs in both orders (every verdict asked for at once)."""
    shown = [(prompt, run_first) for prompt, _, _ in pairs for run_first in (True, False)]
    asked = [
        PROMPT.format(prompt=prompt, a=run if run_first else base, b=base if run_first else run)
        for prompt, base, run in pairs
        for run_first in (True, False)
    ]
    result = JudgeResult(judge)
    for (prompt, run_first), reply in zip(shown, ask_all(asked), strict=True):
        letter = parse_verdict(reply)
        if letter is None:
            verdict = "unparsed"
        elif letter == "tie":
            verdict = "tie"
        else:
            verdict = "run" if (letter == "A") == run_first else "base"
        result.judgments.append(Judgment(prompt, run_first, reply, verdict))
    return result


def sample_pairs(store: Evaluations, run_id: int) -> list[tuple[str, str, str]]:
    """The run's before/after samples as (prompt, base answer, run answer); refused when it has none."""
    from jobs.train.before_after import rows, samples_of

    data = samples_of(store, run_id)
    pairs = [(p, b, r) for p, b, r in rows(data or {}) if b is not None and r is not None]
    if not pairs:
        raise SpecError(
            [
                Problem(
                    "run",
                    f"run {run_id} has no before/after samples with both answers to judge",
                    "judge a finished run trained with sample_count above 0",
                )
            ]
        )
    return pairs


def judge_run(store: Evaluations, run_id: int, judge: str, *, ask_all: AskAll | None = None) -> JudgeResult:
    """Judge run `run_id` against its base with `judge` (`ask_all`: the judge already at hand, else it is loaded
    here); stores the counts, the reasons and an event."""
    pairs = sample_pairs(store, run_id)
    result = judge_pairs(judge, ask_all or asker(store, judge), pairs)
    path = store.run_dir(run_id) / "judge.json"
    data = {**asdict(result), "summary": result.summary(), "win_rate": result.win_rate}
    path.write_text(json.dumps(data, indent=2))
    store.add_artifact(run_id, "judge", str(path), path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    n = len(result.judgments)
    store.set_scores(
        run_id,
        TASK,
        [
            Score("run", "win_rate", result.win_rate, result.stderr, n),
            *(Score("run", k, float(getattr(result, k)), None, n) for k in ("wins", "ties", "losses", "unparsed")),
        ],
    )
    store.add_run_event(run_id, TASK, result.summary(), data={k: data[k] for k in ("judge", "win_rate")})
    refresh_card(store, run_id, data)
    return result


def asker(store: Evaluations, judge: str) -> AskAll:
    """The judge as a function from prompts to its replies: an endpoint asked once a prompt, or a model loaded here."""
    if judge.startswith(("http://", "https://")):
        return one_by_one(endpoint_asker(judge))
    return model_asker(store, judge)


def model_asker(store: Evaluations, judge: str) -> AskAll:
    """A judge model loaded here: `run:N` (another run's result), a built-in name, a folder or a hub id."""
    if judge.startswith("run:") and judge[4:].strip().isdigit():
        from jobs.chat.generate import load, locate

        pair = load(locate(store, int(judge[4:])))
        model, tokenizer = pair.tuned, pair.tokenizer
    else:
        from jobs.models.loading import load_model_and_tokenizer
        from jobs.models.references import resolve_model
        from jobs.models.registry import ModelError

        try:
            model, tokenizer = load_model_and_tokenizer(resolve_model(judge))
        except ModelError as exc:
            raise SpecError([Problem("judge", p.problem, p.fix) for p in exc.problems]) from exc

    return in_batches(lambda: contextlib.nullcontext(model), tokenizer)


def base_asker(judge: str, base_ref: str, base: Callable[[], AbstractContextManager[Any]]) -> AskAll | None:
    """The run's base model already loaded (`base()`: a context giving it; `base_ref`: the run's model reference) as
    the judge, with the judge's own tokenizer, when `judge` names that same model; None otherwise (the judge is then
    loaded on its own)."""
    from jobs.models.references import resolve_model
    from jobs.models.registry import ModelError

    if judge.startswith(("http://", "https://", "run:")):
        return None
    try:
        path = resolve_model(judge).path
        if path != resolve_model(base_ref).path:
            return None
    except ModelError:
        return None
    from transformers import AutoTokenizer

    return in_batches(base, AutoTokenizer.from_pretrained(path))


WORDS = {"run": "run better", "base": "base better", "tie": "tie", "unparsed": "no verdict"}


def verdict_cells(judged: dict[str, Any] | None) -> dict[str, str] | None:
    """Per prompt, its judgments in the order they were made ("run better · tie"); None when never judged."""
    if not judged:
        return None
    out: dict[str, list[str]] = {}
    for j in judged.get("judgments") or []:
        out.setdefault(str(j.get("prompt", "")), []).append(WORDS.get(str(j.get("verdict")), str(j.get("verdict"))))
    return {prompt: " · ".join(words) for prompt, words in out.items()}


def judge_file(run_dir: Path) -> dict[str, Any] | None:
    """The run's judge.json, or None."""
    path = Path(run_dir) / "judge.json"
    return json.loads(path.read_text()) if path.is_file() else None
