"""A run's scores in words, base beside run with standard errors, and the bundle's model card that carries them.

    scores_rows(store.scores(7))       # (task, metric, "0.300 ± 0.100", "0.800 ± 0.100", "+0.500") each
    scores_table(records)              # the same as aligned text (`tunedeck show`, `tunedeck evaluate`)
    benchmark_markdown(records)        # a markdown table (the run page)
    refresh_card(store, 7, judged)     # README.md's scores section rewritten, the bundle zip remade and recorded

Scores land after the bundle is written (a worker's `evaluate` or `judge` task, possibly days later), so
the card's section between two HTML comments is replaced each time, and the zip that "download" means is
remade from the folder, its recorded size and sha256 updated: the downloaded card always says what the
dashboard shows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from jobs.train.artifacts import bundle_of, sha256_of, zip_bundle
from storage.roles import Evaluations

log = logging.getLogger(__name__)

BEGIN, END = "<!-- tunedeck:scores -->", "<!-- /tunedeck:scores -->"
JUDGE_TASK = "judge"  # the judge's scores' task name (jobs.evaluate.judge): a line in the card, not table rows


def benchmark_markdown(records: list[Any], run_label: str = "this run") -> str:
    """A markdown table task | metric | base | run | change, ± standard errors ("" without benchmark scores)."""
    rows = scores_rows([r for r in records if r.task != JUDGE_TASK])
    if not rows:
        return ""
    lines = [f"| task | metric | base | {run_label} | change |", "|---|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(r)} |" for r in rows])


def judge_line(judged: dict[str, Any] | None) -> str:
    """The judge's verdict in one line ("" when the run was never judged)."""
    return str(judged.get("summary") or "") if judged else ""


def card_section(records: list[Any], judged: dict[str, Any] | None) -> str:
    """The card's scores section, between its markers ("" without any score)."""
    table, line = benchmark_markdown(records, "fine-tuned"), judge_line(judged)
    if not table and not line:
        return ""
    parts = ["## Did it get better?"]
    if table:
        parts += [
            "Benchmark tasks (lm-evaluation-harness, zero-shot), base model beside this one, ± standard error:",
            table,
        ]
    if line:
        parts.append(f"A judge, each prompt shown in both orders: {line}.")
    return "\n".join([BEGIN, "\n\n".join(parts), END]) + "\n"


def with_section(card: str, section: str) -> str:
    """`card` with its scores section replaced by `section` (or appended)."""
    start, end = card.find(BEGIN), card.find(END)
    if start >= 0 and end > start:
        card = card[:start].rstrip("\n") + "\n" + card[end + len(END) :].lstrip("\n")
    return card.rstrip("\n") + "\n\n" + section if section else card


def refresh_card(store: Evaluations, run_id: int, judged: dict[str, Any] | None) -> Path | None:
    """Rewrite the bundle card's scores section (`judged`: the run's judge.json, or None) and remake the bundle
    zip; its path, or None without a bundle on this machine."""
    folder, archive = store.run_dir(run_id) / "bundle", bundle_of(store, run_id)
    card = folder / "README.md"
    if not card.is_file() or archive is None:
        return None
    section = card_section(store.scores(run_id), judged)
    card.write_text(with_section(card.read_text(encoding="utf-8"), section), encoding="utf-8")
    dest = zip_bundle(folder, Path(archive))
    store.rewrite_artifact(run_id, "bundle", str(dest), dest.stat().st_size, sha256_of(dest))
    log.info("run %s: the bundle's card carries its scores (%s)", run_id, dest)
    return dest


def scores_rows(records: list[Any]) -> list[tuple[str, str, str, str, str]]:
    """(task, metric, base ± stderr, run ± stderr, change) per task and metric, for `tunedeck show` and the run page."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        rows.setdefault((r.task, r.metric), {})[r.model] = r
    out = []
    for (task, metric), pair in rows.items():
        base, run = pair.get("base"), pair.get("run")
        change = f"{run.value - base.value:+.3f}" if base and run and None not in (base.value, run.value) else ""
        out.append((task, metric, _cell(base), _cell(run), change))
    return out


def scores_table(records: list[Any]) -> list[str]:
    """`scores_rows` as aligned text lines (with a header; [] without scores)."""
    rows = scores_rows(records)
    if not rows:
        return []
    out = [f"{'task':<24} {'metric':<14} {'base':>16} {'run':>16} {'change':>8}"]
    out += [f"{t[:24]:<24} {m[:14]:<14} {b:>16} {r:>16} {c:>8}" for t, m, b, r, c in rows]
    return out


def _cell(r: Any) -> str:
    if r is None or r.value is None:
        return "-"
    return f"{r.value:.3f} ± {r.stderr:.3f}" if r.stderr is not None else f"{r.value:.3f}"
