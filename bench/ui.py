"""How cheap and how fast is the dashboard? CPU at rest and live, write-to-screen latency, graph build.

    .venv/bin/python bench/ui.py                                 # everything, baseline HEAD~1 (~12-15 min, busy 2 cores)
    .venv/bin/python bench/ui.py --part cpu --window 10 --baseline HEAD
    .venv/bin/python bench/ui.py --part latency --samples 30 --baseline c0ffee1
    .venv/bin/python bench/ui.py --part build --metric-points 200000 --memory-samples 20000

Two trees side by side in one invocation: the baseline (`--baseline REV`, default HEAD~1, checked
out into a temporary `git worktree add --detach` removed at the end; or the path of an existing
checkout) and the current one (`--current PATH`, default this script's repository). Each tree
gets its own `python -m app.cli.main serve --no-worker` (cwd and PYTHONPATH = that tree, this
interpreter) on a free port with a temporary TUNEDECK_HOME, whose store is written by a feeder
process running that tree's own code (bench/ui_browser.py). Pages run in Debian's Chromium
(playwright, the offline flags of tests/browser_helpers.py), a fresh browser per measurement;
per page the two trees alternate which goes first, so the machine's load hits both alike, and
the side not being measured has its server frozen (SIGSTOP; an idle `serve` costs a few % of a core).
Each server is warmed first: one page opened until its load event has drawn the form's memory verdict
(a fresh server's first page imports transformers once, which is no page's steady cost).

(cpu) For each page: open it, wait until loaded (`#run-header` shows the run; the Launch tab:
    the Gradio container), let it settle `--settle` s, then measure `--window` s: CPU seconds
    (user+system) of the browser's process tree (every Chromium process descending from this
    one, sampled each second, last seen times kept per process, so renderers that come and go
    count) and of the server's process tree, each as % of one core; and the browser's HTTP
    requests in the window (all of them, `page.on("request")`). Pages:
      launch    `/`, nothing running;
      finished  `/?run=F`, a succeeded run of `--finished-steps` steps (loss, learning_rate,
                tokens_per_second; nvml + torch memory samples one a second);
      live      `/?run=L`, a running run: each second of the window the feeder writes the next
                step's three metric rows (`Store.add_metrics`), one nvml + torch memory sample,
                the heartbeat and the progress, as the training callback and sampler would.
(latency) On a running run's page (100 steps of `loss` only, as the first version of this bench
    measured: one plot redrawn, not four), each sample writes one `loss` row twice the previous maximum
    at the next step and waits until the loss plot shows it: the new chart's contract
    (`#run-loss-plot div.td-chart[data-ymax]`, the largest y drawn) where the page has it, else
    the Vega plot's y axis top (its SVG aria-label "... values from A to B"): either can only get
    there once the new point is drawn. Time from just before the write; samples start at random
    phases (0-1 s) of the page's refresh. Both trees, p50/p95.
(build) Current tree only: fills a temporary database with one run of N metric rows (loss,
    eval_loss, learning_rate, tokens_per_second, N/4 steps each, with spikes) and M memory
    samples, then times `RunPageData.rows` (every chart's points, what the live stream sends) cold (fresh store and caches) and warm (after one
    more callback flush), against the old raw-row GROUP BY path; plus ingest rates.

Goals (issue 23), judged on the current tree: Launch tab and finished run page <= 2% of a core in
the browser and <= 1% on the server; live run page <= 15% / <= 5%; write -> visible p95 <= 500 ms,
p50 <= 250 ms; the 1M-point run page builds in <= 200 ms. Exit status 1 when a goal is not met.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ui_browser import OFFLINE_ENV, PageResult, Side, baseline_tree, describe, measure_latency, measure_window

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("launch", "finished", "live")
CPU_GOALS = {"launch": (2.0, 1.0), "finished": (2.0, 1.0), "live": (15.0, 5.0)}  # browser %, server % of a core
LATENCY_GOALS_S = {"p50": 0.250, "p95": 0.500}
BUILD_GOAL_S = 0.200
INGEST_GOAL_ROWS_S = 10_000
LIVE_HISTORY_STEPS = 100
Row = tuple[str, str, str, str, str, str, str]  # page, metric, baseline, current, ratio, goal, verdict


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    s = sorted(values)
    i = (len(s) - 1) * q
    lo, hi = int(i), min(int(i) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def timed(fn: Callable[..., Any], *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
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
        timed(store.add_metrics, run_id, [MetricPoint(s, n, 1.0 / (s + 1), now) for n in names]) for s in range(calls)
    ]
    memory = [
        timed(
            store.add_memory_samples,
            [MemoryPoint(now + i + j / 3, "host", run_id, process_rss=(1 << 30) + j) for j in range(3)],
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
        RunPageData(s).rows(run_id + 1, "sft")
        s.dispose()

        base = []
        for _ in range(max(1, repeats // 2)):
            s = open_store(home)
            base.append(timed(baseline_graphs, s, run_id))
            s.dispose()
        cold: list[float] = []
        frames: Any = None
        for _ in range(repeats):
            s = open_store(home)
            page = RunPageData(s)
            cold.append(timed(page.rows, run_id, "sft"))
            frames = page.frames(run_id, "sft")[:4]
            s.dispose()
        # Warm: the 1 s refresh after one callback flush (7 metric rows) and one sampler batch.
        s = open_store(home)
        page = RunPageData(s)
        page.rows(run_id, "sft")
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
            warm.append(timed(lambda: page.rows(run_id, "sft")))
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


# ---------------------------------------------------------------------- (cpu) both trees, page by page
def measure_page(side: Side, page: str, window_s: float, settle_s: float) -> PageResult:
    if page == "launch":
        return measure_window(side, side.url(), None, window_s, settle_s)
    if page == "finished":
        run = side.finished_run
        return measure_window(side, side.url(f"?run={run}"), run, window_s, settle_s)
    run = side.new_live_run(LIVE_HISTORY_STEPS)
    try:
        return measure_window(
            side,
            side.url(f"?run={run}"),
            run,
            window_s,
            settle_s,
            tick=lambda i: side.feed("tick", run_id=run, step=LIVE_HISTORY_STEPS + i),
        )
    finally:
        side.feed("finish", run_id=run)


@contextmanager
def only(sides: list[Side], active: Side) -> Iterator[None]:
    """`active`'s server runs, the others' are frozen (SIGSTOP) meanwhile."""
    for side in sides:
        side.pause(side is not active)
    try:
        yield
    finally:
        for side in sides:
            side.pause(False)


def bench_cpu(
    sides: list[Side], pages: list[str], window_s: float, settle_s: float
) -> dict[str, dict[str, PageResult]]:
    out: dict[str, dict[str, PageResult]] = {}
    for k, page in enumerate(pages):
        out[page] = {}
        for side in sides if k % 2 == 0 else sides[::-1]:
            print(f"cpu: {page} page, {side.name} ({window_s:g} s window) ...", file=sys.stderr, flush=True)
            with only(sides, side):
                out[page][side.name] = measure_page(side, page, window_s, settle_s)
    return out


def bench_latency(sides: list[Side], samples: int, first: int) -> dict[str, tuple[list[float], str]]:
    out = {}
    for side in sides if first % 2 == 0 else sides[::-1]:
        print(f"latency: {side.name}, {samples} samples ...", file=sys.stderr, flush=True)
        with only(sides, side):
            out[side.name] = measure_latency(side, samples)
    return out


# ---------------------------------------------------------------------- report
def ratio(current: float, baseline: float) -> str:
    return f"{current / baseline:.2f}" if baseline else ("1.00" if current == baseline else "-")


def verdict(value: float, goal: float | None) -> str:
    return "" if goal is None else ("met" if value <= goal else "NOT met")


def figure_row(page: str, metric: str, b: float, c: float, fmt: str, goal: float | None, unit: str = "") -> Row:
    goal_text = "" if goal is None else f"<= {goal:{fmt}}{unit}"
    return (page, metric, f"{b:{fmt}}{unit}", f"{c:{fmt}}{unit}", ratio(c, b), goal_text, verdict(c, goal))


def cpu_rows(cpu: dict[str, dict[str, PageResult]], names: tuple[str, str]) -> list[Row]:
    rows = []
    for page, by_side in cpu.items():
        b, c = by_side[names[0]], by_side[names[1]]
        browser_goal, server_goal = CPU_GOALS[page]
        rows += [
            figure_row(page, "browser % core", b.browser_pct, c.browser_pct, ".1f", browser_goal, "%"),
            figure_row(page, "server % core", b.server_pct, c.server_pct, ".1f", server_goal, "%"),
            figure_row(page, "requests in window", b.requests, c.requests, ".0f", None),
        ]
    return rows


def latency_rows(lat: dict[str, tuple[list[float], str]], names: tuple[str, str]) -> list[Row]:
    (b, b_chart), (c, c_chart) = lat[names[0]], lat[names[1]]
    page = f"latency ({b_chart} | {c_chart})"
    return [
        figure_row(page, f"write->visible {q} ms", 1000 * pct(b, x), 1000 * pct(c, x), ".0f", 1000 * LATENCY_GOALS_S[q])
        for q, x in (("p50", 0.5), ("p95", 0.95))
    ]


def build_rows(b: dict[str, float], metric_points: int, memory_samples: int) -> list[Row]:
    size = f"{metric_points / 1e6:g}M pts + {memory_samples / 1e3:g}k mem"
    goal = BUILD_GOAL_S * 1000 if metric_points >= 1_000_000 else None  # the goal is about the 1M-point page
    cold = figure_row(size, "graphs cold build ms", 1000 * b["baseline_cold_s"], 1000 * b["cold_s"], ".1f", goal)
    warm = figure_row(size, "graphs warm refresh ms", float("nan"), 1000 * b["warm_s"], ".1f", goal)
    return [
        cold,
        (*warm[:2], "", *warm[3:4], "", *warm[5:]),
        (size, "ingest metric rows/s", "", f"{b['metric_rows_per_s']:,.0f}", "", f">= {INGEST_GOAL_ROWS_S:,}", ""),
        ("", "callback flush (7 rows) ms", "", f"{b['metric_call_s'] * 1000:.2f}", "", "", ""),
        ("", "sampler batch (3 samples) ms", "", f"{b['memory_call_s'] * 1000:.2f}", "", "", ""),
    ]


def print_table(header: Row, rows: list[Row]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def print_latencies(lat: dict[str, tuple[list[float], str]]) -> None:
    for name, (values, chart) in lat.items():
        print(f"  latency  {name:<24} {chart}, ms in order: {' '.join(f'{1000 * v:.0f}' for v in values)}")


def print_requests(cpu: dict[str, dict[str, PageResult]]) -> None:
    for page, by_side in cpu.items():
        for name, r in by_side.items():
            top = ", ".join(f"{path} x{n}" for path, n in r.paths.most_common(4))
            print(
                f"  {page:<8} {name:<24} requests in window: {r.requests} ({r.window_s:.1f} s){': ' + top if top else ''}"
            )


# ---------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", choices=["all", "cpu", "latency", "build"], default="all")
    parser.add_argument("--baseline", default="HEAD~1", help="a revision of this repository, or a checkout's path")
    parser.add_argument("--current", type=Path, default=ROOT, help="the tree under test (default: this repository)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured per page and tree")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after a page has loaded, not measured")
    parser.add_argument("--pages", default=",".join(PAGES), help="comma-separated subset of " + ",".join(PAGES))
    parser.add_argument("--finished-steps", type=int, default=400)
    parser.add_argument("--samples", type=int, default=25, help="latency samples per tree (>= 20)")
    parser.add_argument("--metric-points", type=int, default=1_000_000)
    parser.add_argument("--memory-samples", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5, help="cold builds (raw-row path: half as many)")
    args = parser.parse_args(argv)
    args.current = args.current.resolve()
    args.pages = [p for p in args.pages.split(",") if p]
    if unknown := set(args.pages) - set(PAGES):
        parser.error(f"unknown pages {sorted(unknown)}")
    return args


Results = tuple[list[Row], dict[str, dict[str, PageResult]], dict[str, tuple[list[float], str]]]


def browser_parts(args: argparse.Namespace, tmp: Path) -> Results:
    """The cpu and latency parts on both trees: their rows, the cpu results and the latencies (for the details)."""
    rows: list[Row] = []
    cpu: dict[str, dict[str, PageResult]] = {}
    lat: dict[str, tuple[list[float], str]] = {}
    with baseline_tree(ROOT, args.baseline) as base:
        sides = [
            Side(f"baseline {describe(base)}", base, tmp / "home-baseline"),
            Side(f"current {describe(args.current)}", args.current, tmp / "home-current"),
        ]
        names = (sides[0].name, sides[1].name)
        try:
            for side in sides:
                side.start(args.finished_steps)
            if args.part in ("all", "cpu"):
                cpu = bench_cpu(sides, args.pages, args.window, args.settle)
                rows += cpu_rows(cpu, names)
            if args.part in ("all", "latency"):
                lat = bench_latency(sides, args.samples, len(args.pages))
                rows += latency_rows(lat, names)
        finally:
            for side in sides:
                side.stop()
    return rows, cpu, lat


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    sys.path.insert(0, str(args.current))  # the build part runs in this process, on the current tree
    load = os.getloadavg()
    rows: list[Row] = []
    cpu: dict[str, dict[str, PageResult]] = {}
    lat: dict[str, tuple[list[float], str]] = {}
    if args.part != "build":
        tmp = Path(tempfile.mkdtemp(prefix="tunedeck-bench-ui-"))
        try:
            rows, cpu, lat = browser_parts(args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    build: list[Row] = []
    if args.part in ("all", "build"):
        b = bench_build(args.metric_points, args.memory_samples, args.repeats)
        build = build_rows(b, args.metric_points, args.memory_samples)
    print(f"\nload average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f}; window {args.window:g} s per page")
    if rows:
        print_table(("page", "metric", "baseline", "current", "ratio (cur/base)", "goal", "current"), rows)
    if cpu:
        print_requests(cpu)
    if lat:
        print_latencies(lat)
    if build:
        print("\nrun page build, current tree (baseline column: the old raw-row GROUP BY path)")
        print_table(("size", "metric", "raw rows", "current", "ratio (cur/raw)", "goal", "current"), build)
    return 1 if any(r[6] == "NOT met" for r in rows + build) else 0


if __name__ == "__main__":
    sys.exit(main())
