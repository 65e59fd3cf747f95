"""How fast is the run page? (a) write-to-screen latency in Chromium, (b) server-side graph build.

    .venv/bin/python bench/ui.py                       # both parts, full size (~1-2 min)
    .venv/bin/python bench/ui.py --part build --metric-points 200000 --memory-samples 20000
    .venv/bin/python bench/ui.py --part latency --samples 30

(a) Starts `python -m app.cli.main serve --no-worker` on a free port with a temporary TUNEDECK_HOME,
    creates a running run in the store directly and opens `?run=N` in Debian's Chromium (the
    playwright package, the offline flags of tests/browser_helpers.py). Each sample writes one `loss` row with
    `Store.add_metrics` (as the training callback does) at the next step, with a value twice the
    previous maximum, and waits until the loss plot's y axis (its SVG aria-label, "... values from
    A to B") reaches that value: the axis can only get there once the new point is drawn. The time
    is taken from just before the write; samples start at random phases of the page's 1 s timer.
    Goal: p95 <= 2 s.
(b) Fills a temporary database with one run of N metric rows (4 series: loss, eval_loss,
    learning_rate, tokens_per_second, N/4 steps each, with spikes) and M memory samples (nvml and
    torch, one second apart, a spike), then times `RunPageData.graphs` (what each page refresh
    calls): cold (fresh store and caches) and warm (the 1 s refresh after one more callback flush).
    The baseline is the old raw-row path: `metric_buckets`/`memory_buckets` GROUP BY over every raw
    row, done the way the previous cache built a page from scratch. Also reports ingest: bulk
    rows/s, and the cost of a callback-sized write (7 metric rows) and a sampler-sized one
    (3 memory samples) now that each write also updates the rollup tables. Goal: <= 200 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "PYTHONUNBUFFERED": "1",
}
LATENCY_GOAL_S = 2.0
BUILD_GOAL_S = 0.200
INGEST_GOAL_ROWS_S = 10_000


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    s = sorted(values)
    i = (len(s) - 1) * q
    lo, hi = int(i), min(int(i) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def open_store(home: Path) -> Any:
    from storage.store import Store

    return Store(f"sqlite:///{home / 'tunedeck.db'}")


def new_running_run(store: Any) -> int:
    from jobs.spec.job import JobSpec

    run_id = store.create_run(JobSpec(model="tiny-llama", run_name="bench"))
    claimed = store.claim_next_on_device("bench-ui", "0", os.getpid())
    assert claimed is not None and claimed.id == run_id
    store.set_progress(run_id, 0, 1_000_000)
    return run_id


# ---------------------------------------------------------------------- (b) server-side build
def fill(store: Any, run_id: int, metric_points: int, memory_samples: int) -> dict[str, float]:
    """Bulk-load one long run; returns ingest rates (rows/s)."""
    from storage.store import MemoryPoint, MetricPoint

    steps = metric_points // 4
    rng = random.Random(0)
    t0 = 1.7e9
    spike_step = steps * 2 // 3
    batch: list[MetricPoint] = []
    start = time.perf_counter()
    for step in range(steps):
        t = t0 + step * 0.5
        loss = 3.0 * (0.9999 ** (step / 10)) + rng.random() * 0.05 + (40.0 if step == spike_step else 0.0)
        batch += [
            MetricPoint(step, "loss", loss, t),
            MetricPoint(step, "eval_loss", loss + 0.1, t),
            MetricPoint(step, "learning_rate", 2e-4 * (1 - step / steps), t),
            MetricPoint(step, "tokens_per_second", 5000.0 + rng.random() * 100, t),
        ]
        if len(batch) >= 8000:
            store.add_metrics(run_id, batch)
            batch = []
    store.add_metrics(run_id, batch)
    metric_rate = 4 * steps / (time.perf_counter() - start)

    samples: list[MemoryPoint] = []
    start = time.perf_counter()
    gib = 1 << 30
    for i in range(memory_samples):
        t = t0 + (i // 2)
        if i % 2 == 0:
            used = (20 + (i % 50) / 10) * gib + (60 * gib if i == memory_samples // 3 * 2 else 0)
            samples.append(MemoryPoint(t, "nvml", run_id, 0, int(used), 141 * gib, 90.0, 60.0, 500.0))
        else:
            samples.append(
                MemoryPoint(
                    t,
                    "torch",
                    run_id,
                    0,
                    torch_allocated=18 * gib,
                    torch_reserved=19 * gib,
                    torch_max_allocated=19 * gib,
                )
            )
        if len(samples) >= 3000:
            store.add_memory_samples(samples)
            samples = []
    store.add_memory_samples(samples)
    memory_rate = memory_samples / (time.perf_counter() - start)
    return {"metric_rows_per_s": metric_rate, "memory_rows_per_s": memory_rate}


def small_writes(store: Any, calls: int = 400) -> dict[str, float]:
    """Callback- and sampler-sized writes on a fresh run: seconds per call."""
    from storage.store import MemoryPoint, MetricPoint

    run_id = new_running_run(store)
    names = ["loss", "grad_norm", "learning_rate", "epoch", "entropy", "mean_token_accuracy", "tokens_per_second"]
    now = time.time()
    metric = [
        timed(lambda s=s: store.add_metrics(run_id, [MetricPoint(s, n, 1.0 / (s + 1), now) for n in names]))
        for s in range(calls)
    ]
    memory = [
        timed(
            lambda i=i: store.add_memory_samples(
                [MemoryPoint(now + i + j / 3, "host", run_id, process_rss=(1 << 30) + j) for j in range(3)]
            )
        )
        for i in range(calls)
    ]
    return {
        "metric_call_s": statistics.median(metric),
        "metric_call_p95_s": pct(metric, 0.95),
        "memory_call_s": statistics.median(memory),
    }


def baseline_graphs(store: Any, run_id: int) -> Any:
    """The old first build: GROUP BY over every raw row, per series, with the same widths and frames."""
    from app.ui import series

    def metric(name: str) -> list[Any]:
        extent = store.metric_extent(run_id, name)
        if extent is None:
            return []
        width = int(series.pow2_at_least((extent[1] + 1) / (series.MAX_POINTS // 2)))
        return store.metric_buckets(run_id, name, width)

    lo, hi = store.memory_extent(run_id)
    width = series.pow2_at_least((hi - lo) / (series.MAX_POINTS // 2), 1 / 16)
    memory = series.memory_frame(store.memory_buckets(run_id, lo, width), lo)
    loss = series.metric_frame({"train": metric("loss"), "eval": metric("eval_loss")})
    lr = series.metric_frame({"learning rate": metric("learning_rate")})
    tps = series.metric_frame({"tokens/s": metric("tokens_per_second")})
    return memory, loss, lr, tps


def bench_build(metric_points: int, memory_samples: int, repeats: int) -> dict[str, float]:
    from app.ui.run import RunPageData
    from storage.store import MemoryPoint, MetricPoint

    home = Path(tempfile.mkdtemp(prefix="tunedeck-bench-"))
    try:
        store = open_store(home)
        run_id = new_running_run(store)
        print(f"filling {metric_points:,} metric rows and {memory_samples:,} memory samples ...", flush=True)
        out: dict[str, float] = fill(store, run_id, metric_points, memory_samples)
        out.update(small_writes(store))
        store.dispose()
        # One-time process warm-up (pandas loads its arrow string arrays lazily, ~150 ms), not timed.
        s = open_store(home)
        RunPageData(s).graphs(run_id + 1)
        s.dispose()

        base = []
        for _ in range(max(1, repeats // 2)):
            s = open_store(home)
            base.append(timed(lambda s=s: baseline_graphs(s, run_id)))
            s.dispose()
        cold, frames = [], None
        for _ in range(repeats):
            s = open_store(home)
            page = RunPageData(s)
            cold.append(timed(lambda page=page: page.graphs(run_id)))
            frames = page.graphs(run_id)
            s.dispose()
        # Warm: the 1 s refresh after one callback flush (7 metric rows) and one sampler batch.
        s = open_store(home)
        page = RunPageData(s)
        page.graphs(run_id)
        steps = metric_points // 4
        warm = []
        for i in range(repeats * 4):
            step = steps + i
            t = 1.7e9 + step
            s.add_metrics(
                run_id,
                [MetricPoint(step, n, 1.0, t) for n in ("loss", "eval_loss", "learning_rate", "tokens_per_second")],
            )
            s.add_memory_samples([MemoryPoint(1.7e9 + memory_samples // 2 + i, "nvml", run_id, 0, 1 << 34, 141 << 30)])
            warm.append(timed(lambda: page.graphs(run_id)))
        memory, loss, lr, tps = frames
        points = {"memory": len(memory), "loss": len(loss), "lr": len(lr), "tokens/s": len(tps)}
        ref = baseline_graphs(s, run_id)
        s.dispose()
        print(
            f"points per graph (new): {points}; loss max {loss['value'].max():.1f} (spike kept), "
            f"memory max {memory['GiB'].max():.1f} GiB (spike kept)"
        )
        print(f"points per graph (baseline): { {k: len(f) for k, f in zip(points, ref)} }")
        out.update(
            baseline_cold_s=statistics.median(base),
            cold_s=statistics.median(cold),
            cold_max_s=max(cold),
            warm_s=statistics.median(warm),
            warm_p95_s=pct(warm, 0.95),
        )
        return out
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ---------------------------------------------------------------------- (a) latency in Chromium
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(home: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, **OFFLINE_ENV, "TUNEDECK_HOME": str(home)}
    env.pop("TUNEDECK_DATABASE_URL", None)
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError(f"server did not come up:\n{(home / 'server.log').read_text()[-4000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


_Y_TOP_JS = """() => {
  const el = document.querySelector("#run-loss-plot g.role-axis[aria-label^='Y-axis']");
  const m = el && el.getAttribute('aria-label').match(/to (-?[0-9.,e+]+)\\s*$/);
  return m ? parseFloat(m[1].replace(/,/g, '')) : null;
}"""


def bench_latency(samples: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    from storage.store import MetricPoint

    home = Path(tempfile.mkdtemp(prefix="tunedeck-bench-"))
    os.environ["TUNEDECK_HOME"] = str(home)
    store = open_store(home)
    run_id = new_running_run(store)
    store.add_metrics(run_id, [MetricPoint(s, "loss", 2.0 - s / 200, time.time()) for s in range(100)])
    port = free_port()
    proc = start_server(home, port)
    rng = random.Random(1)
    latencies: list[float] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(f"http://127.0.0.1:{port}/?run={run_id}")
            page.wait_for_function(f"({_Y_TOP_JS})() !== null", timeout=60_000)
            value, step = 10.0, 100
            for _ in range(samples):
                time.sleep(rng.random())  # a random phase of the page's 1 s timer
                value *= 2
                step += 1
                t0 = time.perf_counter()
                store.add_metrics(run_id, [MetricPoint(step, "loss", value, time.time())])
                store.set_progress(run_id, step)
                page.wait_for_function(f"({_Y_TOP_JS})() >= {value}", timeout=30_000, polling=10)
                latencies.append(time.perf_counter() - t0)
            browser.close()
    finally:
        stop_server(proc)
        store.dispose()
        shutil.rmtree(home, ignore_errors=True)
    return latencies


# ---------------------------------------------------------------------- report
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "build", "latency"], default="all")
    parser.add_argument("--metric-points", type=int, default=1_000_000)
    parser.add_argument("--memory-samples", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5, help="cold builds (baseline: half as many)")
    parser.add_argument("--samples", type=int, default=25, help="latency samples (>= 20)")
    args = parser.parse_args(argv)
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)

    rows: list[tuple[str, str, str, str, str]] = []  # what, measured, goal, baseline, ratio
    ok = True
    if args.part in ("all", "latency"):
        lat = bench_latency(args.samples)
        p50, p95 = statistics.median(lat), pct(lat, 0.95)
        ok &= p95 <= LATENCY_GOAL_S
        rows.append((f"write -> visible p50 (n={len(lat)})", f"{p50 * 1000:.0f} ms", "", "", ""))
        rows.append(
            (
                f"write -> visible p95 (max {max(lat) * 1000:.0f} ms)",
                f"{p95 * 1000:.0f} ms",
                f"<= {LATENCY_GOAL_S * 1000:.0f} ms",
                "",
                "pass" if p95 <= LATENCY_GOAL_S else "FAIL",
            )
        )
    if args.part in ("all", "build"):
        b = bench_build(args.metric_points, args.memory_samples, args.repeats)
        ok &= b["cold_s"] <= BUILD_GOAL_S and b["warm_s"] <= BUILD_GOAL_S
        ok &= b["metric_rows_per_s"] >= INGEST_GOAL_ROWS_S
        size = f"{args.metric_points / 1e6:g}M pts + {args.memory_samples / 1e3:g}k mem"
        ratio = b["baseline_cold_s"] / b["cold_s"]
        rows += [
            (
                f"graphs, cold first build ({size})",
                f"{b['cold_s'] * 1000:.1f} ms (max {b['cold_max_s'] * 1000:.1f})",
                f"<= {BUILD_GOAL_S * 1000:.0f} ms",
                f"{b['baseline_cold_s'] * 1000:.0f} ms",
                f"{ratio:.0f}x faster",
            ),
            (
                "graphs, warm 1 s refresh (median)",
                f"{b['warm_s'] * 1000:.1f} ms (p95 {b['warm_p95_s'] * 1000:.1f})",
                f"<= {BUILD_GOAL_S * 1000:.0f} ms",
                "",
                "",
            ),
            (
                "ingest, bulk metric rows (8k/call)",
                f"{b['metric_rows_per_s']:,.0f} rows/s",
                f">= {INGEST_GOAL_ROWS_S:,} rows/s",
                "",
                "",
            ),
            ("ingest, bulk memory samples (3k/call)", f"{b['memory_rows_per_s']:,.0f} rows/s", "", "", ""),
            (
                "callback flush, 7 metric rows",
                f"{b['metric_call_s'] * 1000:.2f} ms (p95 {b['metric_call_p95_s'] * 1000:.2f})",
                "",
                "",
                f"{7 / b['metric_call_s']:,.0f} rows/s",
            ),
            ("sampler batch, 3 memory samples", f"{b['memory_call_s'] * 1000:.2f} ms", "", "", ""),
        ]
    widths = [
        max(len(r[i]) for r in rows + [("what", "measured", "goal", "baseline (raw rows)", "new vs baseline")])
        for i in range(5)
    ]
    header = ("what", "measured", "goal", "baseline (raw rows)", "new vs baseline")
    for r in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
