"""A GRPO run's completions at its logged steps: kept every `completions_every` steps, bounded, and read back.

trl's GRPOTrainer (`log_completions`, on in every grpo run) writes, at each logging step, the last generation
batch as `<output_dir>/completions/completions_<step>.parquet`: the step, each prompt and completion, one
column per reward function (its score) and the advantage. `CompletionsKeeper` prunes those files as the
run goes: steps that are not multiples of `completions_every` go, and when more than `COMPLETIONS_KEPT`
remain every other one goes (the oldest first kept), so a long run keeps at most that many, spread over it.

    steps = completion_steps(run_folder)          # the kept steps, ascending
    rows = read_step(run_folder, steps[-1])       # {"rewards": [...], "rows": [{prompt, completion, scores, advantage}]}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from jobs.spec.grpo import COMPLETIONS_KEPT

FOLDER = "completions"  # under the trainer's output_dir (a run's `output/`)
_FILE = re.compile(r"^completions_(\d+)\.parquet$")
_NOT_SCORES = {"step", "prompt", "completion", "advantage", "image"}


def _files(folder: Path) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := _FILE.match(p.name))}


def prune(folder: Path, every: int, kept: int = COMPLETIONS_KEPT, newest: int | None = None) -> list[int]:
    """Remove the files of steps not kept (see the module docstring); the steps left. `newest`: a step not
    pruned for `every` (the last one, so a run that ends between multiples still shows its end)."""
    files = _files(folder)
    for step, path in list(files.items()):
        if step % every and step != newest:
            path.unlink(missing_ok=True)
            del files[step]
    steps = sorted(files)
    while len(steps) > kept:
        dropped = steps[1::2]
        for step in dropped:
            files[step].unlink(missing_ok=True)
        steps = steps[::2]
    return steps


class CompletionsKeeper(TrainerCallback):
    """Prunes trl's completion files at each log (those of the earlier logs are written by then) and at the end."""

    def __init__(self, every: int, kept: int = COMPLETIONS_KEPT) -> None:
        self.every = every
        self.kept = kept

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        prune(Path(args.output_dir) / FOLDER, self.every, self.kept)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / FOLDER
        prune(folder, self.every, self.kept, newest=max(_files(folder), default=None))


def completion_steps(run_folder: Path) -> list[int]:
    """The steps whose completions a run kept, ascending ([] for none)."""
    return sorted(_files(run_folder / "output" / FOLDER))


def _text(value: Any) -> str:
    """A prompt's or completion's text: a string, or the last message's content of a chat."""
    if isinstance(value, str):
        return value
    messages = list(value) if value is not None else []
    return str(messages[-1].get("content") or "") if messages else ""


def read_step(run_folder: Path, step: int) -> dict[str, Any]:
    """One kept step: its reward names and one row per completion (prompt, completion, each reward's score, the
    advantage); {"rewards": [], "rows": []} when that step was not kept."""
    import math

    import pandas as pd

    path = _files(run_folder / "output" / FOLDER).get(int(step))
    if path is None:
        return {"rewards": [], "rows": []}
    frame = pd.read_parquet(path)
    rewards = [c for c in frame.columns if c not in _NOT_SCORES]

    def number(v: Any) -> float | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    rows = [
        {
            "prompt": _text(r["prompt"]),
            "completion": _text(r["completion"]),
            "scores": {name: number(r[name]) for name in rewards},
            "advantage": number(r["advantage"]),
        }
        for r in frame.to_dict("records")
    ]
    return {"rewards": rewards, "rows": rows}
