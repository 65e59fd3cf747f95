"""Other tools' training configs as tunedeck job specs: LLaMA-Factory, axolotl and trl CLI configs.

`import_config(data)` tells the tool by the file's keys (or `tool=`), maps every key it can onto a
spec field and lists every other key as not carried over with the reason; values with no tunedeck
equivalent (a PPO stage, freeze tuning, a SimPO loss, ...) are an `ImportConfigError` naming the
key. `build_spec` applies `--set` style overrides and parses the result into a `JobSpec`, naming
the source key next to each spec field a problem is about. Pure: the caller reads the files
(the config, LLaMA-Factory's `dataset_info.json`).

    imported = import_config(yaml.safe_load(text), dataset_info=info, dataset_dir="data")
    spec = build_spec(imported, {"model": "smollm2-135m-instruct"})
    header(imported)   # the not-carried-over list as YAML comments
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.errors import Problem
from jobs.spec.imports import axolotl, llamafactory, trl
from jobs.spec.imports.base import ImportConfigError, Imported, NotCarried
from jobs.spec.job import JobSpec, SpecError

__all__ = [
    "TOOLS",
    "ImportConfigError",
    "Imported",
    "NotCarried",
    "build_spec",
    "detect_tool",
    "header",
    "import_config",
    "spec_values",
]

TOOLS = ("llamafactory", "axolotl", "trl")


def detect_tool(data: Mapping[str, Any]) -> str:
    """Which tool a config is from, by its keys; ImportConfigError when they do not tell."""
    keys = set(data)
    if keys & set(llamafactory.MARKERS):
        return "llamafactory"
    if keys & set(axolotl.MARKERS):
        return "axolotl"
    if keys & set(trl.MARKERS):
        return "trl"
    raise ImportConfigError(
        [
            Problem(
                "config",
                "its keys do not tell which tool it is from (no stage/finetuning_type, base_model or model_name_or_path)",
                "pass --from llamafactory, axolotl or trl",
            )
        ]
    )


def import_config(
    data: Any, *, tool: str | None = None, dataset_info: Mapping[str, Any] | None = None, dataset_dir: str = "data"
) -> Imported:
    """Another tool's config (a parsed YAML mapping) as spec fields and a not-carried-over list."""
    if not isinstance(data, Mapping):
        raise ImportConfigError(
            [
                Problem(
                    "config",
                    f"expected a mapping of keys to values, got {type(data).__name__}",
                    "import a training config YAML file",
                )
            ]
        )
    tool = tool or detect_tool(data)
    if tool == "llamafactory":
        return llamafactory.import_llamafactory(data, dataset_info, dataset_dir)
    if tool == "axolotl":
        return axolotl.import_axolotl(data)
    if tool == "trl":
        return trl.import_trl(data)
    raise ImportConfigError(
        [Problem("--from", f"`{tool}` is not a tool this importer reads", "use " + ", ".join(TOOLS))]
    )


def build_spec(imported: Imported, overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """The imported fields with `overrides` on top, as a checked JobSpec; a SpecError names the source key too."""
    overrides = dict(overrides or {})
    values = {**imported.fields, **overrides}
    try:
        return JobSpec.from_dict(values)
    except SpecError as exc:
        raise SpecError([_from_source(p, imported, overrides) for p in exc.problems]) from exc


def spec_values(imported: Imported, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the written spec holds: the imported and overridden fields, parsed, in the spec's order."""
    spec = build_spec(imported, overrides)
    given = set(imported.fields) | set(overrides or {})
    return {k: v for k, v in spec.to_dict().items() if k in given}


def header(imported: Imported, source: str = "") -> str:
    """YAML comment lines: where the spec came from and every key not carried over."""
    lines = [f"# imported by `tunedeck import` from {source or 'a config'} ({imported.tool})"]
    if imported.not_carried:
        lines.append(f"# {len(imported.not_carried)} key(s) not carried over:")
        lines += [f"#   {n}" for n in imported.not_carried]
    else:
        lines.append("# every key was carried over")
    return "\n".join(lines) + "\n"


def _from_source(problem: Problem, imported: Imported, overrides: Mapping[str, Any]) -> Problem:
    origin = imported.origins.get(problem.field)
    if origin is None or problem.field in overrides or origin == problem.field:
        return problem
    return Problem(f"{problem.field} (from {origin})", problem.problem, problem.fix)
