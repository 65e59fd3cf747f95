"""Memory of saving (and previewing) a big upload: the old whole-file read against the streamed save.

    python bench/upload_memory.py               # ~200 MiB JSONL, generated in a temp folder, removed after
    python bench/upload_memory.py --mib 20 --old-preview   # also the old whole-file preview (slow: ~40 s at 20 MiB)

Each way runs in its own child process (a fresh TUNEDECK_HOME in the temp folder), so its RSS growth is its
own: the peak resident size (`ru_maxrss`) minus the size before. Python's own peak is tracemalloc's.
"old" is what `app.ui.data.store_upload` did before issue 48 (`read_bytes()` to hash, then `copyfile`); "new"
is `store_upload` now (`storage.uploads.keep_upload`: 1 MiB chunks, hashed as copied). "preview" is the
form's `preview_with_lengths` now (the first 2000 rows; a big file's lengths are measured at launch);
"old-preview" (with --old-preview) is what it did before: every row checked, then every row loaded to count
those over max_length (tiny-llama's tokenizer, built first, outside the measurement).
Nothing is written outside the temp folder; the generated file is never kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def generate(path: Path, mib: int) -> Path:
    """A chat JSONL of about `mib` MiB (varied rows, written line by line)."""
    target = mib * 2**20
    with path.open("w") as fh:
        written, i = 0, 0
        while written < target:
            row = {
                "messages": [
                    {"role": "user", "content": f"question {i}: " + "lorem ipsum " * 40},
                    {"role": "assistant", "content": f"answer {i}: " + "dolor sit amet " * 40},
                ]
            }
            line = json.dumps(row) + "\n"
            fh.write(line)
            written, i = written + len(line), i + 1
    return path


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def old_save(src: Path) -> Path:
    """The save before issue 48: the whole file read to hash it, then copied."""
    from storage.settings import uploads_dir

    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:10]
    dest = uploads_dir() / f"{src.stem}-{digest}{src.suffix}"
    shutil.copyfile(src, dest)
    return dest


def child(way: str, src: Path) -> None:
    """One measurement in this (fresh) process; prints one JSON line."""
    from app.ui.data import preview_with_lengths, store_upload

    before = rss_mib()
    tracemalloc.start()
    started = time.perf_counter()
    if way == "old":
        old_save(src)
    elif way == "new":
        store_upload(str(src))
    elif way == "tokenizer":
        from jobs.models.references import ensure_builtin

        ensure_builtin("tiny-llama")
    elif way == "preview":
        text, _ = preview_with_lengths(str(src), "sft", "tiny-llama", 512)
        assert text.startswith("Detected format"), text
    elif way == "old-preview":  # every row checked, then every row loaded to measure lengths (a local tokenizer)
        from app.ui.data import length_warning_text
        from jobs.data.loading import check_sources
        from jobs.spec.enums import Trainer

        check_sources(str(src), Trainer.SFT)
        length_warning_text(str(src), "sft", "tiny-llama", 512)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        json.dumps(
            {"way": way, "tracemalloc_peak_mib": peak / 2**20, "rss_growth_mib": peak_rss_mib() - before, "s": seconds}
        )
    )


def measure(way: str, src: Path, home: Path) -> dict:
    env = {
        **os.environ,
        "TUNEDECK_HOME": str(home / way),
        "TUNEDECK_MODELS_DIR": str(home / "models"),  # tiny-llama's tokenizer, built once for the old preview
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
    }
    out = subprocess.run(
        [sys.executable, __file__, "--child", way, "--src", str(src)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=200, help="size of the generated JSONL (default 200)")
    parser.add_argument("--old-preview", action="store_true", help="also run the old whole-file check (slow)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.src))
        return
    with tempfile.TemporaryDirectory(prefix="tunedeck-upload-bench-") as tmp:
        src = generate(Path(tmp) / "big.jsonl", args.mib)
        print(f"{src.stat().st_size / 2**20:.0f} MiB JSONL, each way in a fresh process")
        ways = ["old", "new", "preview"] + (["old-preview"] if args.old_preview else [])
        if args.old_preview:
            measure("tokenizer", src, Path(tmp))  # builds tiny-llama before anything is measured
        print(f"{'way':<12} {'tracemalloc peak':>17} {'RSS growth':>11} {'seconds':>8}")
        for way in ways:
            r = measure(way, src, Path(tmp))
            print(f"{way:<12} {r['tracemalloc_peak_mib']:>13.1f} MiB {r['rss_growth_mib']:>7.0f} MiB {r['s']:>8.1f}")


if __name__ == "__main__":
    main()
