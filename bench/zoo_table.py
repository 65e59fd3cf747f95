"""Every zoo family x method: refused at submit (and why) or trained two steps, predicted vs counted peak.

    python bench/zoo_table.py                       # all families, lora/qlora/dora/full; prints the table
    python bench/zoo_table.py --write               # ... and regenerates docs/models.md
    python bench/zoo_table.py --only mixtral,qwen3_moe --methods lora
    python bench/zoo_table.py --methods lora --more qlora,dora,full --subset mixtral,qwen3_moe,granitemoehybrid:qlora
    python bench/zoo_table.py --only llama,mixtral,bamba --methods lora --max-length 2048 --checkpointing
    python bench/zoo_table.py --shapes --write       # ... and the shape grid (`SHAPE_FAMILIES` x `shape_grid()`)

Each family is a tiny random-weight model of `jobs.models.zoo.FAMILIES`. Each (family, method) goes through
tunedeck's one check (`jobs.checks.pipeline.check`, on this machine's CPU): a refusal prints its problems;
an accepted spec trains two optimizer steps in this process through tunedeck's trainer path
(`bench.memory_truth.measure_cpu`: the live tensor bytes counted exactly) and its prediction
(`jobs.memory.predict.predict`, allocated bytes, no CUDA constant) is compared with the counted peak. The last
line gives the share of trained families within 15% of the counted peak (issue 31's bar).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.memory_truth import build_data, measure_cpu, quiet  # noqa: E402
from jobs.spec.job import JobSpec  # noqa: E402

METHODS = ("lora", "qlora", "dora", "full")
WITHIN = 0.15
DOC = REPO / "docs" / "models.md"


@dataclass(frozen=True)
class Outcome:
    family: str
    method: str
    status: str  # "works", "refused", "fails"
    detail: str = ""  # the refusal (problem: fix) or the failure
    predicted: int = 0
    measured: int = 0

    @property
    def error(self) -> float | None:
        return (self.predicted - self.measured) / self.measured if self.measured else None


def zoo_spec(model: Path, data: Path, method: str, length: int = 64, checkpointing: bool = False) -> JobSpec:
    return JobSpec.from_dict(
        {
            "model": str(model),
            "dataset": str(data),
            "method": method,
            "max_steps": 2,
            "max_length": length,
            "gradient_checkpointing": checkpointing,
            "per_device_train_batch_size": 2,
            "logging_steps": 1,
            "learning_rate": 1e-4,
            "lora_r": 8,
            "lora_alpha": 16,
        }
    )


def try_one(
    family: str, method: str, model: Path, data: Path, out: Path, length: int = 64, checkpointing: bool = False
) -> Outcome:
    from jobs.checks.pipeline import check
    from jobs.devices.probe import cpu_facts

    spec = zoo_spec(model, data, method, length, checkpointing)
    facts = cpu_facts()
    checked = check(spec, device=facts)
    problems = [p for p in checked.problems if p.field != "memory"]
    if problems:
        return Outcome(family, method, "refused", "; ".join(f"{p.field}: {p.problem} ({p.fix})" for p in problems))
    total = predicted_bytes(spec, model)
    try:
        measured = measure_cpu(spec, out)
    except Exception as exc:  # noqa: BLE001 - a failure after the checks accepted it: what the table must show
        traceback.print_exc(file=sys.stderr)
        return Outcome(family, method, "fails", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    return Outcome(family, method, "works", "", total, measured["peak"])


def predicted_bytes(spec: JobSpec, model: Path) -> int:
    """The predicted allocated peak of `spec` on this CPU (no overhead, no runtime baseline): the counted side's
    match. The counted peak does not depend on it, so a kept outcome can be predicted again (`--repredict`)."""
    from transformers import AutoConfig

    from jobs.devices.probe import cpu_facts
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict

    prediction = predict(spec, arch_from_config(AutoConfig.from_pretrained(model)), cpu_facts(), resident=False)
    return prediction.total_bytes - prediction.part("overhead") - prediction.part("runtime")


def run(
    families: list[str],
    methods: list[str],
    work: Path,
    log=sys.stdout,
    write: bool = False,
    more: dict[str, list[str]] | None = None,
    length: int = 64,
    checkpointing: bool = False,
) -> list[Outcome]:
    """Each family with each of `methods`, and the families in `more` with their extra methods too. Each outcome
    is kept in `work`/outcomes.jsonl as it comes: a later run in the same folder resumes after the last one."""
    from jobs.models.zoo import build_zoo_model

    kept = work / "outcomes.jsonl"
    done = {(o.family, o.method): o for o in map(_outcome, kept.read_text().splitlines())} if kept.is_file() else {}
    outcomes = []
    for family in families:
        for method in [*methods, *(more or {}).get(family, [])]:
            o = done.get((family, method))
            if o is None:
                model = build_zoo_model(work / family, family)
                data = build_data(work, model, "sft", length)
                o = try_one(family, method, model, data, work / "out", length, checkpointing)
                with kept.open("a") as fh:
                    fh.write(json.dumps(asdict(o)) + "\n")
            outcomes.append(o)
            print(row(o), file=log, flush=True)
            if write:  # after each outcome: an interrupted run keeps what it measured
                DOC.write_text(document(outcomes))
    return outcomes


def _outcome(line: str) -> Outcome:
    return Outcome(**json.loads(line))


def row(o: Outcome) -> str:
    error = f"{100 * o.error:+.0f}%" if o.error is not None else ""
    return f"| {o.family} | {o.method} | {o.status} | {error} | {o.detail.replace('|', '/')} |"


def summary(outcomes: list[Outcome], within: float = WITHIN) -> str:
    lora = [o for o in outcomes if o.method == "lora" and o.error is not None]
    close = [o for o in lora if abs(o.error or 0) <= within]
    worst = min((o.error for o in lora if o.error is not None), default=0.0)
    return (
        f"{len(close)} of {len(lora)} families trained with lora within {within:.0%} of the counted peak "
        f"({100 * len(close) / max(1, len(lora)):.0f}%); most under: {100 * worst:+.0f}%"
    )


GGUF_HEADING = "## GGUF export"  # the section bench/gguf_families.py --write keeps up to date


def document(outcomes: list[Outcome]) -> str:
    from jobs.models.zoo import FAMILIES

    lines = [
        "# Model families",
        "",
        "Which causal-LM families of transformers 5.24 tunedeck trains, and how close its memory prediction is.",
        "Generated by `python bench/zoo_table.py --write` from tiny random-weight models of each family",
        "(`jobs.models.zoo`: hidden 64, 2 layers, 512-token vocabulary) trained two steps on the CPU; the error",
        "is the predicted peak against the live tensor bytes counted (`jobs.memory.count.LiveBytes`).",
        "`refused` means `tunedeck submit` refuses it before queueing, with the reason and the fix shown.",
        "Mixture-of-experts families train their experts by default (`moe_targets: attention+experts`).",
        'The same check at other sizes, lengths, with checkpointing and QLoRA is in "Shapes" below.',
        "",
        "| family | structure |",
        "|---|---|",
        *[f"| {f.model_type} | {f.structure} |" for f in FAMILIES.values()],
        "",
        "| family | method | outcome | memory error | reason |",
        "|---|---|---|---|---|",
        *[row(o) for o in outcomes],
        "",
        summary(outcomes) + ".",
        "",
        "Mamba-2 state-space mixers (bamba, granitemoehybrid) are sized by `jobs.memory.mixers` (the chunked scan's "
        "fp32 tensors).",
        "So is the gated delta-net of qwen3_next (the chunked rule's fp32 tensors). Layers no formula describes",
        "(the short convolutions, `Conv1d`) are named in the prediction as `not modelled`: their activations are "
        "not counted.",
        "",
    ]
    from bench.zoo_shapes import HEADING

    old = DOC.read_text() if DOC.is_file() else ""
    kept = old.partition(GGUF_HEADING)[2]  # bench/gguf_families.py's section
    shapes = old.partition(HEADING)[2].partition(GGUF_HEADING)[0]  # bench/zoo_shapes.py's section
    return (
        "\n".join(lines)
        + (f"\n{HEADING}{shapes.rstrip()}\n" if shapes else "")
        + (f"\n{GGUF_HEADING}{kept}" if kept else "")
    )


def main(argv: list[str] | None = None) -> int:
    from jobs.models.zoo import FAMILIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated families (default: all)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--more", default="", help="extra methods for the --subset families")
    ap.add_argument(
        "--subset", default="", help="comma-separated families that also get the --more methods (family:m1+m2: those)"
    )
    ap.add_argument("--work", default=None, help="folder for the models (default: a temporary one)")
    ap.add_argument("--write", action="store_true", help="regenerate docs/models.md")
    ap.add_argument("--max-length", type=int, default=64, help="tokens a row (the data's rows are all this long)")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    ap.add_argument("--shapes", action="store_true", help="the shape grid of bench/zoo_shapes.py instead")
    ap.add_argument("--full-grid", action="store_true", help="with --shapes: every combination, not the half")
    ap.add_argument("--repredict", action="store_true", help="predict the rows kept in --work again, no training")
    ns = ap.parse_args(argv)
    quiet()
    work = Path(ns.work) if ns.work else Path(tempfile.mkdtemp(prefix="tunedeck-zoo-"))
    if ns.shapes:
        return shapes_main(ns.only, work, ns.write, ns.full_grid, ns.repredict)
    if ns.repredict:
        return repredict_main(work, ns.write)
    families = [f for f in ns.only.split(",") if f] or list(FAMILIES)
    extra = [m for m in ns.more.split(",") if m]
    more = {
        f.partition(":")[0]: f.partition(":")[2].split("+") if ":" in f else extra for f in ns.subset.split(",") if f
    }
    if ns.write and (ns.max_length != 64 or ns.checkpointing):
        ap.error("--write keeps docs/models.md's table at its 64 tokens without checkpointing")
    outcomes = run(
        families,
        ns.methods.split(","),
        work,
        write=ns.write,
        more=more,
        length=ns.max_length,
        checkpointing=ns.checkpointing,
    )
    print(summary(outcomes))
    if ns.write:
        print(f"wrote {DOC}")
    return 0


def repredict_main(work: Path, write: bool) -> int:
    """The family rows kept in `work`/outcomes.jsonl predicted again (their counted peaks kept), in their order."""
    from bench.memory_truth import build_data
    from jobs.models.zoo import build_zoo_model

    outcomes = []
    for o in map(_outcome, (work / "outcomes.jsonl").read_text().splitlines()):
        if o.status == "works":
            model = build_zoo_model(work / o.family, o.family)
            spec = zoo_spec(model, build_data(work, model, "sft", 64), o.method)
            was, o = o.error, replace(o, predicted=predicted_bytes(spec, model))
            print(f"{row(o)} (kept: {100 * (was or 0):+.1f}%, now {100 * (o.error or 0):+.1f}%)")
        outcomes.append(o)
    print(summary(outcomes))
    if write:
        DOC.write_text(document(outcomes))
    return 0


def shapes_main(only: str, work: Path, write: bool, full: bool = False, repredict: bool = False) -> int:
    from bench import zoo_shapes

    families = [f for f in only.split(",") if f] or zoo_shapes.all_families()
    if repredict:  # in the grid's order, the rows it has not reached yet left out
        kept = {o.key: o for o in zoo_shapes.repredict(work)}
        outcomes = [kept[key] for key in zoo_shapes.shape_grid(families, full) if key in kept]
    else:
        outcomes = zoo_shapes.run_shapes(families, work, full=full)
    print("\n".join(zoo_shapes.shape_summary(outcomes)))
    if write:
        DOC.write_text(zoo_shapes.splice(DOC.read_text(), zoo_shapes.section(outcomes), GGUF_HEADING))
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
