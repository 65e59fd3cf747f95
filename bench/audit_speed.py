"""What the data audit costs on 100k rows (issue 43, part 4: goal under 10 s on this machine).

    .venv/bin/python bench/audit_speed.py                   # 100k chat rows, 2% exact and 2% near copies
    .venv/bin/python bench/audit_speed.py --rows 20000 --repeat 3

Writes a chat JSONL of `--rows` rows into a temporary folder (removed afterwards, never committed): a user
question of 10-30 words and an answer of 30-80 words drawn from a 5,000-word vocabulary, with 2% of the rows
exact copies of earlier ones and 2% earlier rows with one word changed, plus an eval file of 1,000 rows of which
100 are training rows. Then times `jobs.data.audit.report.audit` on a spec naming both, in this process after
its imports: the reading (`jobs.data.audit.reading.read_rows`: each row read and checked as the checks read it,
and tallied for the findings as it streams past) and the findings (near-duplicate groups, eval overlap, the
counts turned into findings), and prints rows/s, seconds (wall and this process's CPU), the findings' counts and
the process's peak RSS. The machine's load is printed too: the wall figure is only as good as the idle cores it
had; on a shared machine the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def write_rows(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    rows: list[dict] = []
    for i in range(n):
        roll = rng.random()
        if rows and roll < 0.02:
            rows.append(rows[rng.randrange(len(rows))])
        elif rows and roll < 0.04:
            q, a = (m["content"] for m in rows[rng.randrange(len(rows))]["messages"])
            parts = a.split()
            parts[rng.randrange(len(parts))] = f"changed{i}"
            rows.append(chat(q, " ".join(parts)))
        else:
            q = " ".join(rng.choices(words, k=rng.randint(10, 30)))
            rows.append(chat(q, " ".join(rng.choices(words, k=rng.randint(30, 80)))))
    train, evals = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = [chat(f"eval question {i}", f"eval answer {i} " + " ".join(rng.choices(words, k=40))) for i in range(900)]
    held += rng.sample(rows, 100)
    evals.write_text("".join(json.dumps(r) + "\n" for r in held))
    return train, evals


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=1, help="audits timed (the best and each one printed)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from jobs.data.audit.reading import read_rows
    from jobs.data.audit.report import audit
    from jobs.spec.job import JobSpec

    with tempfile.TemporaryDirectory(prefix="tunedeck-audit-") as tmp:
        train, evals = write_rows(Path(tmp), args.rows)
        spec = JobSpec(dataset=str(train), eval_dataset=str(evals))
        print(
            f"{args.rows} training rows ({train.stat().st_size / 1e6:.0f} MB), 1000 eval rows; load {os.getloadavg()}"
        )
        times = []
        for _ in range(args.repeat):
            start, cpu = time.perf_counter(), time.process_time()
            data = read_rows(spec)
            read = time.perf_counter() - start
            found = audit(spec, data)
            total = time.perf_counter() - start
            times.append(total)
            used = time.process_time() - cpu
            print(f"audit: {total:.1f} s ({args.rows / total:,.0f} rows/s; {used:.1f} s CPU): reading {read:.1f} s, findings {total - read:.1f} s")  # fmt: skip
        for f in found.findings:
            print(f"  {f.code}: {f.count}")
        print(f"best of {len(times)}: {min(times):.1f} s (goal < 10 s); load after {os.getloadavg()}")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(f"peak RSS of this process: {peak:.0f} MiB (imports included; the rows stream, none is held)")


if __name__ == "__main__":
    main()
