"""GRPO's rewards: the built-in ones from trl.rewards by the names people use, and custom functions.

A spec names its rewards as text (`rewards: "think_format, repetition=0.5"`); this module parses
that text (pure, no trl import, so `jobs.spec.job` can check it) and builds the callables trl's
GRPOTrainer calls. A custom function (`reward_function: my_rewards:score` or `path/to/file.py:score`)
is imported here, in the training process only; `jobs.checks.access` keeps it off the dashboard and its API.

    weights, problems = parse_rewards("think_format, repetition=0.5")   # ({...: 1.0, ...: 0.5}, [])
    funcs = [builtin_reward(name, spec.max_completion_length) for name in weights]
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# name -> what it rewards (the form's help says the same in short).
BUILTIN_REWARDS: dict[str, str] = {
    "think_format": "1.0 when the completion is <think>...</think> followed by the answer, else 0.0 "
    "(trl.rewards.think_format_reward)",
    "repetition": "0 for no repeated token 3-grams, down to -1.0 for a fully repetitive completion "
    "(trl.rewards.get_repetition_penalty_reward)",
    "overlong": "0 up to max_completion_length minus a quarter of it, then falling linearly to -1.0 at "
    "max_completion_length (trl.rewards.get_soft_overlong_punishment, DAPO)",
}
_EXAMPLE = "e.g. think_format, repetition=0.5"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_rewards(text: str) -> tuple[dict[str, float], list[tuple[str, str]]]:
    """`think_format, repetition=0.5` -> ({name: weight}, [(problem, fix)]); weights default to 1."""
    weights: dict[str, float] = {}
    problems: list[tuple[str, str]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, raw = (x.strip() for x in part.partition("="))
        if name not in BUILTIN_REWARDS:
            problems.append((f"`{name}` is not a built-in reward", f"use {', '.join(BUILTIN_REWARDS)} ({_EXAMPLE})"))
            continue
        weight = 1.0
        if sep:
            try:
                weight = float(raw)
            except ValueError:
                weight = math.nan
            if not math.isfinite(weight):
                problems.append((f"`{part}` has no number as its weight", f"write name=weight, {_EXAMPLE}"))
                continue
        if name in weights:
            problems.append((f"`{name}` is listed twice", "list each reward once"))
            continue
        weights[name] = weight
    if not weights and not problems:
        problems.append(("lists no reward", f"leave it empty, or name built-in rewards, {_EXAMPLE}"))
    return weights, problems


def function_ref_problem(ref: str) -> tuple[str, str] | None:
    """(problem, fix) when `ref` is not `module:function` or `path.py:function` (no import happens)."""
    where, sep, name = ref.strip().rpartition(":")
    fix = "write module:function (importable on the worker) or path/to/rewards.py:function"
    if not sep or not where or not _IDENT.match(name):
        return f"`{ref}` is not module:function or file.py:function", fix
    if not where.endswith(".py") and not _MODULE.match(where):
        return f"`{where}` is neither a Python module name nor a .py file", fix
    return None


def load_function(ref: str) -> Callable[..., list[float]]:
    """Import the custom reward function `module:function` or `path.py:function` (runs the user's code)."""
    where, _, name = ref.strip().rpartition(":")
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"reward_function: {path} does not exist on this machine")
        module_name = f"tunedeck_reward_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        loader.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    func = getattr(module, name, None)
    if not callable(func):
        raise AttributeError(f"reward_function: {where} has no function `{name}`")
    return func


class _ChatOrPlain:
    """trl's think_format_reward reads chat completions ([{'content': ...}]); plain-text prompts give
    strings, so each string is wrapped as one message first. Keeps trl's function and its name."""

    def __init__(self, func: Callable[..., list[float]]):
        self.func = func
        self.__name__ = getattr(func, "__name__", "reward")

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        chats = [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]
        return self.func(chats, **kwargs)


def builtin_reward(name: str, max_completion_length: int) -> Callable[..., list[float]]:
    """The trl.rewards callable behind a built-in reward name."""
    from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment, think_format_reward

    if name == "think_format":
        return _ChatOrPlain(think_format_reward)
    if name == "repetition":
        return get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0)
    if name == "overlong":
        # The penalty starts a quarter of the budget before the end (at least one token).
        return get_soft_overlong_punishment(max_completion_length, max(1, max_completion_length // 4))
    raise ValueError(f"no built-in reward {name!r}")  # pragma: no cover - parse_rewards refuses it first
