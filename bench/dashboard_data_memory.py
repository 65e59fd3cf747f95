"""A dashboard's memory while a big upload is sent, its tokens shown and its data audited (issue 43, part 4).

    python bench/dashboard_data_memory.py              # ~200 MiB chat JSONL (goal: RSS growth under 300 MiB)
    python bench/dashboard_data_memory.py --mib 10     # a quick look

Starts a real `tunedeck serve --no-worker` (a fresh TUNEDECK_HOME and model cache in a temp folder, tiny-llama's
tokenizer built there first), generates a chat JSONL of `--mib` MiB in the temp folder, uploads it over HTTP
(Gradio's upload route, as the form's upload button does), then calls the API's `/tokens` (the first rows, as the
form's token panel shows them) and `/audit` on a spec naming the uploaded file. Prints each step's seconds and the
dashboard process's resident size: cold, after a five-row warm-up (the first calls import torch, trl and datasets:
~400 MiB whatever the data), after each step, and its peak (`VmHWM`), with the growth over the warm-up. Nothing is kept: the temp folder is removed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=200)
    args = parser.parse_args()

    import httpx
    from browser_helpers import free_port, start_server, stop_server
    from gradio_client import Client
    from upload_memory import generate

    folder = Path(tempfile.mkdtemp(prefix="tunedeck-data-memory-"))
    try:
        home, models = folder / "home", folder / "models"
        home.mkdir()
        import os

        os.environ["TUNEDECK_MODELS_DIR"] = str(models)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # this checkout
        from jobs.models.tiny import build_tiny_model

        build_tiny_model(models / "tiny-llama")
        data = generate(folder / "big.jsonl", args.mib)
        port = free_port()
        proc = start_server(home, port, folder / "server.log", extra_env={"TUNEDECK_MODELS_DIR": str(models)},
                            args=["--no-worker"])  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}/"
            client = Client(url, analytics_enabled=False, verbose=False)
            cold = status_kib(proc.pid, "VmRSS")
            small = folder / "small.jsonl"  # a few rows: the first calls import torch, trl, datasets
            with data.open() as fh:
                small.write_text("".join(next(fh) for _ in range(5)))
            warm_spec = f"model: tiny-llama\ndataset: {small}\nmax_length: 256\n"
            client.predict(spec_yaml=warm_spec, row=0, api_name="/tokens")
            client.predict(spec_yaml=warm_spec, api_name="/audit")
            start = status_kib(proc.pid, "VmRSS")
            print(
                f"file {data.stat().st_size / 2**20:.0f} MiB; dashboard RSS {cold / 1024:.0f} MiB cold, "
                f"{start / 1024:.0f} MiB after a five-row warm-up (the imports); growth below is over the warm-up"
            )
            t = time.perf_counter()
            with data.open("rb") as fh, httpx.Client(timeout=600) as web:
                sent = web.post(url + "gradio_api/upload", files={"files": (data.name, fh, "application/jsonl")})
            sent.raise_for_status()
            uploaded = sent.json()[0]
            step(proc.pid, start, "upload", t)
            spec = f"model: tiny-llama\ndataset: {uploaded}\nmax_length: 256\n"
            t = time.perf_counter()
            shown = client.predict(spec_yaml=spec, row=0, api_name="/tokens")
            step(proc.pid, start, f"tokens ({len(shown['rows'])} rows of {shown['total']})", t)
            t = time.perf_counter()
            audit = client.predict(spec_yaml=spec, api_name="/audit")
            step(proc.pid, start, f"audit ({audit['train_rows']} rows, {len(audit['findings'])} findings)", t)
            peak = status_kib(proc.pid, "VmHWM")
            print(
                f"peak RSS {peak / 1024:.0f} MiB: growth {(peak - start) / 1024:.0f} MiB over the warm-up "
                f"(goal < 300), {(peak - cold) / 1024:.0f} MiB over the cold start"
            )
        finally:
            stop_server(proc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def step(pid: int, start: int, what: str, t: float) -> None:
    now = status_kib(pid, "VmRSS")
    print(f"{what}: {time.perf_counter() - t:.1f} s, RSS {now / 1024:.0f} MiB (+{(now - start) / 1024:.0f})")


if __name__ == "__main__":
    main()
