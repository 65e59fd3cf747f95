"""What the meta-device check (`jobs.checks.library`: peft on the real module tree, one step on no memory) adds
to `tunedeck plan`, family by family over the zoo (`jobs.models.zoo`), side by side with the plan without it.

    .venv/bin/python bench/meta_check.py                    # every zoo family, max_length 512, lora
    .venv/bin/python bench/meta_check.py --only mixtral,llama --max-length 2048 --method qlora

Each family's tiny model is built once under --home. For each, the one check `tunedeck plan` runs
(`jobs.checks.pipeline.check`, this machine's device) is timed warm (a first call, not timed, reads the
architecture and measures the data), median of --repeat, once with the library step replaced by a no-op
and once as it is (its per-process cache cleared before each call: a spec never seen); the difference is the meta check's cost. Its outcome (passed, refused, skipped) is
printed with it. Target: well under 1 s per family.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path
from typing import Any


def _timed(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _unseen(plan: Any, verdicts: Any) -> None:
    verdicts.cache_clear()  # a spec this process never checked
    plan()


def _no_library_check(spec: Any) -> tuple[list[Any], list[str]]:
    return [], []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default="/tmp/tunedeck-meta-check")
    parser.add_argument("--only", default="", help="comma-separated zoo families (default: all)")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--method", default="lora")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import jobs.checks.pipeline as pipeline
    from jobs.checks.library import _library_verdict, library_problems
    from jobs.devices.probe import cpu_facts
    from jobs.models.zoo import FAMILIES, build_zoo_model
    from jobs.spec.job import JobSpec

    home = Path(args.home)
    families = [f for f in args.only.split(",") if f] or list(FAMILIES)
    print(f"{'family':<18} {'plan without':>12} {'plan with':>10} {'added':>8}  outcome")
    added = []
    for family in families:
        model = build_zoo_model(home / family, family)
        spec = JobSpec.from_dict(
            {"model": str(model), "dataset": "sample:chat-format", "max_length": args.max_length, "method": args.method}
        )
        facts = cpu_facts()
        pipeline.check(spec, device=facts)  # warm: imports, architecture, measured lengths
        plan = functools.partial(pipeline.check, spec, device=facts)
        pipeline.library_problems = _no_library_check
        without = _timed(plan, args.repeat)
        pipeline.library_problems = library_problems
        with_it = _timed(functools.partial(_unseen, plan, _library_verdict), args.repeat)
        problems, notes = library_problems(spec)
        outcome = f"refused: {problems[0]}" if problems else (f"skipped: {notes[0]}" if notes else "passed")
        added.append(with_it - without)
        print(
            f"{family:<18} {without:>11.2f}s {with_it:>9.2f}s {with_it - without:>7.2f}s  {outcome[:110]}", flush=True
        )
    print(f"added: median {statistics.median(added):.2f}s, max {max(added):.2f}s over {len(added)} families")


if __name__ == "__main__":
    main()
