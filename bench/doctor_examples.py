"""No false alarms: each example run through the product, and the training doctor's findings on it.

    .venv/bin/python bench/doctor_examples.py                          # every examples/*.yaml, as written
    .venv/bin/python bench/doctor_examples.py --max-steps 10 examples/smollm2-dpo.yaml examples/tiny-llama-quick.yaml
    .venv/bin/python bench/doctor_examples.py --keep-evals             # also the after-run scoring (eval_tasks, judge)

Each example is run by `tunedeck run EXAMPLE.yaml` (a subprocess; its worker in that process, the doctor in
the worker) in one throw-away data folder, with the example's own settings; `--max-steps N` cuts a longer
one to N steps. The scoring after the run (eval_tasks, judge) is left out unless `--keep-evals`: it adds
minutes and the doctor does not read it. SmolLM2 comes from TUNEDECK_MODELS_DIR (default: the tests' shared
cache, ~/.cache/tunedeck/test-models), so it is converted once. Prints, per example: status, steps logged,
wall time, and every finding (severity, rule, step, message). Expected: no warning or fatal finding; notes
(severity info, e.g. the forgetting meter's rise on a narrow-format fine-tune) are allowed and listed. Exit
1 when an example failed or got a warning/fatal finding.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_example(example: Path, max_steps: int | None, keep_evals: bool, env: dict[str, str]) -> tuple[int | None, str]:
    """`tunedeck run` the example; (the run id, or None if it was not queued; the tail of its stderr)."""
    import yaml

    own = (yaml.safe_load(example.read_text()) or {}).get("max_steps")
    sets = []
    if max_steps is not None and (own is None or own <= 0 or own > max_steps):
        sets += ["--set", f"max_steps={max_steps}"]
    if not keep_evals:
        sets += ["--set", "eval_tasks=", "--set", "judge="]
    cmd = [sys.executable, "-m", "app.cli.main", "run", str(example), *sets]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    queued = re.search(r"queued run (\d+)", out.stderr)
    return (int(queued.group(1)) if queued else None), out.stderr[-1500:]


def report(example: Path, run_id: int | None, tail: str, seconds: float) -> bool:
    """Print the example's status and findings; True when it succeeded with no warning or fatal finding."""
    from jobs.doctor.findings import Severity, findings_of
    from storage.store import Store

    if run_id is None:
        print(f"{example.name}: not queued\n{tail}")
        return False
    store = Store()
    try:
        run = store.get_run(run_id)
        status = run.status.value if run is not None else "missing"
        steps = len(store.metrics(run_id, ["loss"]))
        found = findings_of(store.run_events(run_id))
    finally:
        store.dispose()
    alarms = [f for f in found if f.severity is not Severity.INFO]
    verdict = "OK" if status == "succeeded" and not alarms else "ALARM" if alarms else "FAILED"
    print(f"{example.name}: run {run_id} {status}, {steps} loss rows, {seconds:.0f} s: {verdict}")
    for f in found:
        print(f"    {f.severity.value} {f.code.value} at step {f.step}: {f.message}")
    if not found:
        print("    no finding")
    if status != "succeeded":
        print(tail)
    sys.stdout.flush()
    return verdict == "OK"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", nargs="*", type=Path, help="example specs (default: examples/*.yaml)")
    parser.add_argument("--max-steps", type=int, default=None, help="cut an example longer than this")
    parser.add_argument("--keep-evals", action="store_true", help="also run the scoring after the run")
    parser.add_argument("--home", default=None, help="the data folder (default: a new temporary one)")
    args = parser.parse_args()
    examples = args.examples or sorted((ROOT / "examples").glob("*.yaml"))
    home = args.home or tempfile.mkdtemp(prefix="tunedeck-doctor-examples-")
    models = os.environ.get("TUNEDECK_MODELS_DIR") or str(Path.home() / ".cache" / "tunedeck" / "test-models")
    os.environ.update(TUNEDECK_HOME=home, TUNEDECK_MODELS_DIR=models, HF_HUB_OFFLINE="1")
    os.environ.pop("TUNEDECK_DATABASE_URL", None)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"data folder {home}; models from {models}; max_steps cut to {args.max_steps}")
    ok = True
    for example in examples:
        start = time.monotonic()
        run_id, tail = run_example(example.resolve(), args.max_steps, args.keep_evals, env)
        ok = report(example, run_id, tail, time.monotonic() - start) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
