"""`tunedeck import`: another tool's training config as a tunedeck job spec YAML.

    tunedeck import llama3_lora_sft.yaml --dataset-dir LLaMA-Factory/data -o spec.yaml
    tunedeck import axolotl.yml --set model=smollm2-135m-instruct      # the spec on stdout
    tunedeck import trl_config.yaml --from trl --set trainer=dpo

The mapping is `jobs.spec.imports` (pure); this module reads the files (the config and, for
LLaMA-Factory, `dataset_info.json` in --dataset-dir, else the config's `dataset_dir`, else `data/`),
writes the spec with the not-carried-over keys as comments at its top, prints that list to stderr,
and runs the check `tunedeck submit` runs (`jobs.checks.pipeline.check`). Exit code 0 when the spec
would be accepted, 2 when the config cannot be imported (nothing is written) or the written spec
would be refused (its problems are listed, each naming the field, the problem and the fix).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from jobs.errors import Problem
from storage.roles import CheckReader


def read_config(path: str) -> Any:
    """The parsed YAML of the config file; UsageError when it is missing or not YAML."""
    import yaml

    from app.cli.usage import UsageError

    file = Path(path)
    if not file.is_file():
        raise UsageError(
            [Problem("FILE", f"{path} not found", "give the path of a LLaMA-Factory, axolotl or trl config")]
        )
    try:
        return yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise UsageError(
            [Problem("FILE", f"{path} is not valid YAML ({exc})", "fix the YAML syntax at the line shown")]
        ) from exc


def read_dataset_info(folder: Path) -> dict[str, Any] | None:
    """LLaMA-Factory's data set registry in `folder`, or None when there is none."""
    from app.cli.usage import UsageError

    file = folder / "dataset_info.json"
    if not file.is_file():
        return None
    try:
        info = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(
            [Problem("--dataset-dir", f"{file} is not valid JSON ({exc})", "fix the JSON syntax")]
        ) from exc
    if not isinstance(info, dict):
        raise UsageError(
            [
                Problem(
                    "--dataset-dir",
                    f"{file} is not a mapping of data set names",
                    "point at LLaMA-Factory's data/ folder",
                )
            ]
        )
    return info


def import_text(args: argparse.Namespace) -> tuple[str, list[str], Any]:
    """(the spec YAML with its comment header, the not-carried-over lines, the JobSpec); raises ProblemError."""
    import yaml

    from app.cli.usage import parse_overrides
    from jobs.spec.imports import build_spec, header, import_config, spec_values

    data = read_config(args.file)
    overrides = parse_overrides(args.set)
    given_dir = args.dataset_dir or (data.get("dataset_dir") if isinstance(data, dict) else None) or "data"
    folder = Path(str(given_dir)).expanduser().resolve()
    imported = import_config(data, tool=args.from_tool, dataset_info=read_dataset_info(folder), dataset_dir=str(folder))
    values = spec_values(imported, overrides)
    text = header(imported, args.file) + yaml.safe_dump(values, sort_keys=False)
    return text, [str(n) for n in imported.not_carried], build_spec(imported, overrides)


def cmd_import(store: CheckReader | None, args: argparse.Namespace) -> int:
    from app.cli.plan import device_for
    from app.cli.usage import EXIT_BAD_INPUT, EXIT_OK
    from jobs.checks.pipeline import check

    text, not_carried, spec = import_text(args)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    for line in not_carried:
        print(line, file=sys.stderr)
    checked = check(spec, store=store, device=device_for(None, store))  # the check submit runs
    if checked.problems:
        print(f"submit would refuse it as it is ({len(checked.problems)} problem(s)):", file=sys.stderr)
        for p in checked.problems:
            print(f"  {p}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def add_parser(sub: Any) -> None:
    from app.cli.usage import StoreUse
    from jobs.spec.imports import TOOLS

    s = sub.add_parser("import", help="convert a LLaMA-Factory, axolotl or trl config into a tunedeck spec YAML")
    s.add_argument("file", metavar="FILE", help="the other tool's training config (YAML)")
    s.add_argument(
        "--from",
        dest="from_tool",
        choices=TOOLS,
        default=None,
        help="the tool the file is from (default: told by its keys)",
    )
    s.add_argument(
        "--dataset-dir",
        default=None,
        metavar="DIR",
        help="LLaMA-Factory: the folder with dataset_info.json and the data files (default: the config's dataset_dir, else data/)",
    )
    s.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field after mapping"
    )
    s.add_argument("-o", "--output", default=None, metavar="SPEC.yaml", help="write the spec here (default: stdout)")
    s.set_defaults(func=cmd_import, store_use=StoreUse.EXISTING)  # reads the workers' published device; creates nothing
