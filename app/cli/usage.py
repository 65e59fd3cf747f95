"""What the command line reads and how it reports bad input: exit codes, `UsageError`, spec files.

Shared by `app.cli.main` and the command modules it registers (`app.cli.sweep`, ...), so none of
them imports another. `StoreUse` is how a command says whether `app.cli.main` opens the store for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from pathlib import Path

from jobs.errors import Problem, ProblemError
from jobs.spec.job import JobSpec

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class StoreUse(Enum):
    """What a command needs of the store; a subparser sets it as `store_use` (default OPEN)."""

    OPEN = "open"  # opened (created and migrated when new) before the command runs
    EXISTING = "existing"  # opened only if its database exists; else the command gets None
    NONE = "none"  # the command gets None and no database is touched


class UsageError(ProblemError):
    """Bad input from the command line: reported as problems, exit code 2."""


def load_spec(path: str, overrides: Sequence[str] = ()) -> JobSpec:
    """Read a YAML spec file and apply `key=value` overrides; raises SpecError/UsageError."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise UsageError(
            [
                Problem(
                    "spec",
                    f"file {path} not found",
                    "give the path of a YAML spec, e.g. examples/tiny-llama-quick.yaml",
                )
            ]
        )
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(
            [Problem("spec", f"{path} is not valid YAML ({exc})", "fix the YAML syntax at the line shown")]
        ) from exc
    if not isinstance(data, dict):
        return JobSpec.from_dict(data)  # reports the "expected a mapping" problem
    return JobSpec.from_dict({**files_beside(data, file.parent), **parse_overrides(overrides)})


FILE_FIELDS = ("dataset", "eval_dataset", "eval_tasks")  # fields whose text may name local files


def files_beside(data: dict[str, object], folder: Path) -> dict[str, object]:
    """The spec with each relative file named in FILE_FIELDS that is not found from the current folder but is
    beside the spec file taken from there (`tunedeck run examples/x.yaml` works from any folder); the rest as is."""

    def beside(ref: str) -> str:
        text = ref.strip()
        if not text or Path(text).is_absolute() or Path(text).exists() or not (folder / text).exists():
            return ref
        return str((folder / text).resolve())

    out = dict(data)
    for name in FILE_FIELDS:
        value = out.get(name)
        if isinstance(value, str):
            out[name] = ",".join(beside(part) for part in value.split(","))
        elif isinstance(value, list):
            out[name] = [beside(v) if isinstance(v, str) else v for v in value]
    return out


def parse_overrides(overrides: Sequence[str]) -> dict[str, object]:
    """`--set key=value` items as {key: value}, each value read like YAML; UsageError for one without `=`."""
    values: dict[str, object] = {}
    bad = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            bad.append(Problem("--set", f"`{item}` is not key=value", "write e.g. --set learning_rate=1e-4"))
            continue
        values[key.strip()] = _yaml_scalar(value)
    if bad:
        raise UsageError(bad)
    return values


def _yaml_scalar(text: str) -> object:
    """A --set value read like the same value in the YAML file (empty: null); odd text stays text."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, (str, int, float, bool)) else text
