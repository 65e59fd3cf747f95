"""GRPO's custom reward function (`reward_function: my_rewards:score` or `path/to/file.py:score`): code.

`function_ref_problem` checks the reference's form (no import); `load_function` imports it, in the training
process only. It runs the user's Python, so `jobs.checks.access` keeps it off the dashboard and its API;
declared rewards (`jobs.spec.rewards`) need no code.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


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
