"""The zoo by shape: families x sizes x lengths x checkpointing x lora/qlora, predicted vs counted peak.

    python bench/zoo_table.py --shapes                       # the grid below; prints each row as it comes
    python bench/zoo_table.py --shapes --write               # ... and rewrites docs/models.md's "Shapes" section
    python bench/zoo_table.py --shapes --only olmo2,olmoe --work /tmp/zoo   # a part of it (resumable in --work)

Each row is a zoo model (`jobs.models.zoo.build_zoo_model` at a size of `jobs.models.zoo.SIZES`) through
`bench.zoo_table.try_one`: refused at submit (and why), or two optimizer steps counted against the prediction.
The grid is every size x length x checkpointing x method for `SHAPE_FAMILIES`: a representative subset of the
zoo (dense, mixture-of-experts and hybrid), so that the whole grid runs in about an hour on two busy cores.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

SHAPE_FAMILIES = {
    "dense": ("llama", "olmo2", "glm4", "gemma2", "qwen3", "gpt2"),
    "moe": ("mixtral", "olmoe", "qwen3_moe", "deepseek_v3"),
    "hybrid": ("bamba", "granitemoehybrid", "qwen3_next", "lfm2"),
}
SIZES = ("tiny", "small")
LENGTHS = (512, 1024)  # the long one within 768-2,048 tokens, where checkpointing was over-predicted
METHODS = ("lora", "qlora")
WITHIN = 0.15
HEADING = "## Shapes"


@dataclass(frozen=True)
class ShapeOutcome:
    family: str
    size: str
    length: int
    checkpointing: bool
    method: str
    status: str  # "works", "refused", "fails"
    detail: str = ""
    predicted: int = 0
    measured: int = 0

    @property
    def key(self) -> tuple[str, str, int, bool, str]:
        return (self.family, self.size, self.length, self.checkpointing, self.method)

    @property
    def error(self) -> float | None:
        return (self.predicted - self.measured) / self.measured if self.measured else None

    @property
    def kind(self) -> str:
        return next((k for k, fams in SHAPE_FAMILIES.items() if self.family in fams), "other")


def shape_grid(families: list[str], full: bool = False) -> list[tuple[str, str, int, bool, str]]:
    """(family, size, length, checkpointing, method), family by family: every combination when `full`, else the
    half of them where the four choices have an even count of "second" values (a half fraction that still holds
    each pair of choices in all four combinations, long checkpointed rows at both sizes among them)."""
    rows = [
        (f, size, length, ckpt, method)
        for f in families
        for size in SIZES
        for length in LENGTHS
        for ckpt in (False, True)
        for method in METHODS
    ]
    seconds = lambda r: (r[1] == SIZES[1]) + (r[2] == LENGTHS[1]) + r[3] + (r[4] == METHODS[1])  # noqa: E731
    return rows if full else [r for r in rows if seconds(r) % 2 == 0]


def run_shapes(families: list[str], work: Path, log=sys.stdout, full: bool = False) -> list[ShapeOutcome]:
    """Each grid row, kept in `work`/shapes.jsonl as it comes: a later run in the same folder resumes. The long
    checkpointed rows run first (the misses seen before were there); the outcomes come back in grid order."""
    from bench.memory_truth import build_data
    from bench.zoo_table import try_one
    from jobs.models.zoo import build_zoo_model

    kept = work / "shapes.jsonl"
    lines = kept.read_text().splitlines() if kept.is_file() else []
    done = {o.key: o for o in (ShapeOutcome(**json.loads(line)) for line in lines)}
    grid = shape_grid(families, full)
    for key in sorted(grid, key=lambda r: not (r[3] and r[2] == LENGTHS[1])):
        o = done.get(key)
        if o is None:
            family, size, length, ckpt, method = key
            model = build_zoo_model(work / f"{family}-{size}", family, size)
            data = build_data(work, model, "sft", length)
            t = try_one(family, method, model, data, work / "out", length, ckpt)
            o = ShapeOutcome(family, size, length, ckpt, method, t.status, t.detail, t.predicted, t.measured)
            with kept.open("a") as fh:
                fh.write(json.dumps(asdict(o)) + "\n")
            done[key] = o
        print(shape_row(o), file=log, flush=True)
    return [done[key] for key in grid]


def repredict(work: Path, log=sys.stdout) -> list[ShapeOutcome]:
    """The trained rows kept in `work`/shapes.jsonl predicted again by the current predictor (the counted peaks
    stay: they do not depend on it), each printed with its kept error beside it. Nothing is written."""
    from bench.memory_truth import build_data
    from bench.zoo_table import predicted_bytes, zoo_spec
    from jobs.models.zoo import build_zoo_model

    outcomes = []
    for line in (work / "shapes.jsonl").read_text().splitlines():
        o = ShapeOutcome(**json.loads(line))
        if o.status == "works":
            model = build_zoo_model(work / f"{o.family}-{o.size}", o.family, o.size)
            spec = zoo_spec(model, build_data(work, model, "sft", o.length), o.method, o.length, o.checkpointing)
            was = o.error
            o = replace(o, predicted=predicted_bytes(spec, model))
            print(f"{shape_row(o)} (kept: {100 * (was or 0):+.1f}%, now {100 * (o.error or 0):+.1f}%)", file=log)
        outcomes.append(o)
    return outcomes


def shape_row(o: ShapeOutcome) -> str:
    error = f"{100 * o.error:+.0f}%" if o.error is not None else ""
    cells = [o.family, o.size, str(o.length), "on" if o.checkpointing else "off", o.method, o.status, error]
    return "| " + " | ".join([*cells, o.detail.replace("|", "/")]) + " |"


def shape_summary(outcomes: list[ShapeOutcome], within: float = WITHIN) -> list[str]:
    """The share within `within`, the worst over and under, and the checkpointing rows at 768+ tokens per kind."""
    trained = [o for o in outcomes if o.error is not None]
    close = [o for o in trained if abs(o.error or 0) <= within]
    errors = [o.error for o in trained if o.error is not None]
    refused = sum(o.status == "refused" for o in outcomes)
    fails = sum(o.status == "fails" for o in outcomes)
    lines = [
        f"{len(close)} of {len(trained)} trained rows within {within:.0%} of the counted peak "
        f"({100 * len(close) / max(1, len(trained)):.0f}%); most over: {100 * max(errors, default=0):+.0f}%, "
        f"most under: {100 * min(errors, default=0):+.0f}%; {refused} refused at submit, {fails} failed after."
    ]
    for kind in SHAPE_FAMILIES:
        rows = [o for o in trained if o.kind == kind and o.checkpointing and 768 <= o.length <= 2048]
        ok = [o for o in rows if abs(o.error or 0) <= within]
        span = [o.error for o in rows if o.error is not None]
        if rows:
            lines.append(
                f"Checkpointing at 768-2,048 tokens, {kind}: {len(ok)} of {len(rows)} within {within:.0%} "
                f"({100 * min(span):+.0f}% to {100 * max(span):+.0f}%)."
            )
    return lines


def section(outcomes: list[ShapeOutcome]) -> str:
    """docs/models.md's "Shapes" section (from its heading to the end of its summary)."""
    from jobs.models.zoo import SIZES as ZOO_SIZES

    small = ZOO_SIZES["small"]
    kinds = "; ".join(f"{kind}: {', '.join(fams)}" for kind, fams in SHAPE_FAMILIES.items())
    lines = [
        HEADING,
        "",
        "The same check at other shapes: generated by `python bench/zoo_table.py --shapes --write`. Each family of a",
        f"representative subset ({kinds}) at two sizes (`tiny`: hidden 64, 2 layers; `small`: hidden "
        f"{small['hidden_size']}, {small['num_hidden_layers']} layers, {small['num_attention_heads']} heads, "
        f"{small['num_experts']} experts where it has experts),",
        f"{' and '.join(f'{n:,}' for n in LENGTHS)} tokens a row, gradient checkpointing off and on, LoRA and QLoRA "
        "(half of the 16 combinations a family and size, each pair of choices in all four combinations); batch 2, "
        "two optimizer steps. At the small size the activations are a large share of the peak (the tiny one's is",
        "mostly the output layer's 32,768-column tile), so a miss that depends on the shape shows here.",
        'The grid found, and the predictor now counts (docs/memory.md "Activations"): an eager attention\'s',
        "probabilities (gemma2: -18% to -41% before), GPT-2's dropout, `gelu_new` and MLP width (-71% at hidden",
        "512, 1,024 tokens), and, with checkpointing, peft's folded expert copy inside the recomputed block",
        "(mixtral, olmoe: +19% before).",
        "",
        "| family | size | length | checkpointing | method | status | error | reason |",
        "|---|---|---|---|---|---|---|---|",
        *[shape_row(o) for o in outcomes],
        "",
        *[f"{line}  " for line in shape_summary(outcomes)[:-1]],
        shape_summary(outcomes)[-1],
        "",
    ]
    return "\n".join(lines)


def splice(doc: str, new_section: str, next_heading: str) -> str:
    """`doc` with its "Shapes" section replaced by `new_section` (put before `next_heading` when it has none)."""
    head, found, rest = doc.partition(HEADING)
    if found:
        rest = rest.partition(next_heading)
        return head + new_section + ("\n" + rest[1] + rest[2] if rest[1] else "")
    head, found, rest = doc.partition(next_heading)
    return head + new_section + "\n" + found + rest if found else doc.rstrip("\n") + "\n\n" + new_section


def all_families() -> list[str]:
    return [f for fams in SHAPE_FAMILIES.values() for f in fams]
