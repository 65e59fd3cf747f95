"""Write examples/arithmetic-questions.jsonl: the prompts of examples/smollm2-grpo-arithmetic.yaml.

Short additions and subtractions of small numbers as chat prompts that ask for a final `Answer: <number>`,
each with its result in an `answer` column (read by the example's declared `numeric` reward). Deterministic
(a fixed seed), nothing downloaded; tests/test_examples.py checks the file is what this writes.

    python bench/make_arithmetic.py            # rewrites examples/arithmetic-questions.jsonl
    python bench/make_arithmetic.py --out F    # writes F instead
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "examples" / "arithmetic-questions.jsonl"
SEED = 45
ROWS = 48
INSTRUCTION = "End your reply with 'Answer: <number>'."


def rows(n: int = ROWS, seed: int = SEED) -> list[dict[str, Any]]:
    """`n` rows {"prompt": [user turn], "answer": "<result>"}: a + b or a - b (never below 0), a and b in 2..20."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        if rng.random() < 0.5:
            question, result = f"What is {a} + {b}?", a + b
        else:
            a, b = max(a, b), min(a, b)
            question, result = f"What is {a} - {b}?", a - b
        out.append({"prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}], "answer": str(result)})
    return out


def text(n: int = ROWS, seed: int = SEED) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows(n, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the .jsonl file to write")
    out = parser.parse_args(argv).out
    out.write_text(text(), encoding="utf-8")
    print(f"{out}: {ROWS} rows")


if __name__ == "__main__":
    main()
