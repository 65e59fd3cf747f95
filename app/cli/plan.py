"""`tunedeck plan`: the predicted peak memory of a spec, and a variant that fits a memory target.

    tunedeck plan SPEC.yaml                   # breakdown table + verdict against this machine's device
    tunedeck plan SPEC.yaml --memory 24GiB    # ... against a 24 GiB GPU instead
    tunedeck plan SPEC.yaml --json            # {"total_bytes", "data_bytes", "worst_case_bytes", "lengths",
                                              #  "parts", "phases", "verdict", "device", ...}
    tunedeck plan SPEC.yaml --fit 24GiB       # the fastest variant that fits, and the runners-up

The prediction is the one `tunedeck submit` makes (`jobs.checks.pipeline.check`, whose other problems
are listed after it); the arithmetic is `jobs.memory.predict` / `jobs.memory.planner`. This module
only parses and prints.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from jobs.errors import Problem

RUNNERS_UP = 4


def parse_size(text: str, flag: str) -> int:
    """'24GiB', '24G', '24 GB', '80000MiB', '24' (GiB) -> bytes (binary units throughout)."""
    from app.cli.usage import UsageError
    from jobs.units import parse_bytes

    size = parse_bytes(text)
    if size is None:
        raise UsageError([Problem(flag, f"`{text}` is not a memory size", "write e.g. 24GiB, 80G or 16000MiB")])
    return size


def device_for(memory: int | None, store=None):  # -> DeviceFacts
    """The workers' device (`jobs.devices.target`; this machine's when none has published one), or a
    GPU of the given size (bf16-capable) when --memory/--fit says so."""
    from jobs.devices.facts import DeviceFacts
    from jobs.devices.probe import local_facts
    from jobs.devices.target import target

    facts = target(store).facts if store is not None else local_facts()
    if memory is None:
        return facts
    if facts.kind == "cuda":
        return replace(facts, total_bytes=memory)
    return DeviceFacts(kind="cuda", name=f"{memory / 1024**3:g} GiB GPU", total_bytes=memory, bf16=True, fp16=True)


def table(prediction, source: str) -> str:  # prediction: jobs.memory.predict.Prediction
    from jobs.memory.breakdown import explain
    from jobs.units import human_bytes

    total = prediction.total_bytes or 1
    lines = [
        f"model architecture from {source}; {prediction.trainable_params:,} of {prediction.total_params:,} "
        f"parameters train; precision {prediction.precision}; peak in the {prediction.phase}",
        *(
            [
                f"mixture of experts: {prediction.active_params:,} of {prediction.total_params:,} parameters active per token"
            ]
            if prediction.active_params is not None
            else []
        ),
        "",
        f"{'PART':12s} {'BYTES':>10s} {'SHARE':>6s}  FORMULA",
    ]
    for p in prediction.parts:
        lines.append(f"{p.name:12s} {human_bytes(p.bytes):>10s} {100 * p.bytes / total:5.1f}%  {p.formula}")
    lines += [f"{'total':12s} {human_bytes(prediction.total_bytes):>10s}", "", explain(prediction)]
    if prediction.from_data:
        lines.append(
            f"this data: {human_bytes(prediction.total_bytes)} ({prediction.lengths.summary()}; "
            f"{prediction.batch.basis})"
        )
        lines.append(
            f"any data up to max_length {prediction.lengths.max_length}: {human_bytes(prediction.worst_case_bytes)}"
        )
    else:
        lines.append("every row taken at max_length (the data's token lengths were not measured here)")
    lines += [f"note: {n}" for n in prediction.notes]
    if prediction.not_modelled:
        lines.append(
            f"not modelled: {', '.join(prediction.not_modelled)} (no formula for these layers: their activations "
            "are not counted, so the figure may be low)"
        )
    return "\n".join(lines)


def fit_text(spec, arch, device, target: int, history=(), lengths=None) -> str:
    """The pick and runners-up; `history`: earlier runs' measured tokens/s (`jobs.memory.planner.measured_history`)."""
    from jobs.memory.planner import MARGIN, fit
    from jobs.units import human_bytes

    plan = fit(spec, arch, device, target, history=history, lengths=lengths)
    if not plan:
        return (
            f"nothing fits in {human_bytes(MARGIN * target)} ({MARGIN:.0%} of {human_bytes(target)}) by changing "
            "micro-batch, checkpointing, precision, optimizer or LoRA -> QLoRA: shorten max_length or pick a smaller model"
        )
    unit = "tokens/s" if plan[0].calibrated else "relative speed"
    lines = [f"{'':4s}{'PEAK':>10s} {unit.upper():>14s}  CHANGES"]
    for i, c in enumerate(plan[: 1 + RUNNERS_UP]):
        mark = "pick" if i == 0 else f"{i + 1:>4d}"
        speed = f"{c.speed:,.0f}" if c.calibrated else f"{c.speed / plan[0].speed:.2f}"
        lines.append(
            f"{mark:4s}{human_bytes(c.prediction.total_bytes):>10s} {speed:>14s}  "
            + ("; ".join(c.changes) or "no change: fits as it is")
        )
    return "\n".join(lines)


def cmd_plan(store, args: argparse.Namespace) -> int:
    """`store`: None in a fresh home (no database yet): this machine's device, no measured history."""
    from app.cli.usage import EXIT_OK, UsageError, load_spec
    from jobs.checks.pipeline import check

    spec = load_spec(args.spec, args.set)
    memory = parse_size(args.memory, "--memory") if args.memory else None
    target = parse_size(args.fit, "--fit") if args.fit not in (None, "") else None
    device = device_for(memory if memory is not None else target, store)
    # The one check submit runs (its prediction, its problems); peft's and transformers' own step (it imports
    # torch: seconds) only with --check-libraries, so a plan stays quick; submit always runs it.
    checked = check(spec, store=store, device=device, libraries=args.check_libraries)
    prediction = checked.prediction
    if prediction is None:
        raise UsageError(
            [
                Problem(
                    "model",
                    f"no readable config.json for `{spec.model}` here (folder, built-in or HF cache)",
                    "point model at a local folder with config.json, or download the model's config first",
                )
            ]
        )
    arch = checked.memory.arch
    assert arch is not None  # a prediction comes with the architecture it was made from
    others = [p for p in checked.problems if p.field != "memory"]  # the verdict is in the table already
    if args.json:
        out = prediction.to_dict()
        out["problems"] = [{"field": p.field, "problem": p.problem, "fix": p.fix} for p in others]
        if args.fit is not None:
            from jobs.memory.planner import fit, measured_history

            plan = fit(
                spec,
                arch,
                device,
                target,
                history=measured_history(store, spec.model, device) if store is not None else [],
                lengths=checked.memory.lengths,
            )
            out["fit"] = [
                {
                    "changes": list(c.changes),
                    "total_bytes": c.prediction.total_bytes,
                    "speed": c.speed,
                    "spec": c.spec.to_dict(),
                }
                for c in plan[: 1 + RUNNERS_UP]
            ]
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print(table(prediction, checked.memory.source))
    if args.fit is not None:
        print("\nfit to " + (args.fit or "this device") + ":")
        from jobs.memory.planner import measured_history

        print(
            fit_text(
                spec,
                arch,
                device,
                target if target is not None else device.total_bytes,
                measured_history(store, spec.model, device) if store is not None else [],
                checked.memory.lengths,
            )
        )
    if others:
        print("\nsubmit would refuse it as it is:")
        print("\n".join(f"  {p}" for p in others))
    return EXIT_OK


def add_parser(sub) -> None:
    s = sub.add_parser("plan", help="predict a spec's peak memory (and fit it to a memory size)")
    s.add_argument("spec", metavar="SPEC.yaml")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    s.add_argument("--json", action="store_true", help="print JSON for scripts")
    s.add_argument(
        "--check-libraries",
        action="store_true",
        help="also place the adapters with peft and run one step on the meta device, as submit does (imports torch)",
    )
    s.add_argument("--memory", default=None, metavar="SIZE", help="predict against a GPU of this size (e.g. 24GiB)")
    s.add_argument(
        "--fit",
        nargs="?",
        const="",
        default=None,
        metavar="SIZE",
        help="find the fastest variant that fits SIZE (default: this device) and list runners-up",
    )
    from app.cli.usage import StoreUse

    s.set_defaults(func=cmd_plan, store_use=StoreUse.EXISTING)  # reads published devices and history; creates nothing
