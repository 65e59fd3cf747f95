"""Helpers of bench/ui.py: trees, servers, the store feeder, process-tree CPU and the Chromium pages.

Each tree (the baseline checkout and the current one) gets its own `tunedeck serve --no-worker`
(cwd and PYTHONPATH = that tree, this interpreter) with its own TUNEDECK_HOME, and its store is
written by a feeder process of that same tree (`python bench/ui_browser.py --feed HOME` with
PYTHONPATH = the tree): a server refuses a database of a newer schema, so each side's rows are
written by its own code. The feeder answers one JSON line per command on stdin/stdout.

This module never puts a tree on sys.path itself: the feeder must import the tree it is given.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve()
# Chromium's path and offline flags, a free port and stopping a server: the Chromium tests' helpers.
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from browser_helpers import CHROMIUM, CHROMIUM_ARGS, free_port, stop_server  # noqa: E402

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "PYTHONUNBUFFERED": "1",
}
VIEWPORT = {"width": 1400, "height": 1600}
GIB = 1 << 30

# The loss plot's largest y drawn: the new chart's `div.td-chart[data-ymax]` (exact), else the Vega
# plot's y axis top (its SVG aria-label "... values from A to B"; a rounded-up axis end).
LOSS_TOP_JS = """() => {
  const c = document.querySelector('#run-loss-plot div.td-chart');
  if (c) { const y = parseFloat(c.getAttribute('data-ymax')); return Number.isFinite(y) ? y : null; }
  const el = document.querySelector("#run-loss-plot g.role-axis[aria-label^='Y-axis']");
  const m = el && el.getAttribute('aria-label').match(/to (-?[0-9.,e+]+)\\s*$/);
  return m ? parseFloat(m[1].replace(/,/g, '')) : null;
}"""
CHART_KIND_JS = """() => document.querySelector('#run-loss-plot div.td-chart') ? 'td-chart'
  : document.querySelector('#run-loss-plot svg') ? 'vega' : 'none'"""


# ---------------------------------------------------------------------- trees
@contextmanager
def baseline_tree(repo: Path, rev: str) -> Iterator[Path]:
    """An existing checkout (a path), or REV of `repo` in a temporary detached worktree removed at the end."""
    if Path(rev).is_dir():
        yield Path(rev).resolve()
        return
    tmp = Path(tempfile.mkdtemp(prefix="tunedeck-bench-tree-"))
    tree = tmp / "baseline"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def describe(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "-uno"], capture_output=True, text=True)
    return (done.stdout.strip() or "?") + ("+dirty" if dirty.stdout.strip() else "")


def tree_env(tree: Path, home: Path) -> dict[str, str]:
    env = {**os.environ, **OFFLINE_ENV, "TUNEDECK_HOME": str(home), "PYTHONPATH": str(tree)}
    env.pop("TUNEDECK_DATABASE_URL", None)
    return env


# ---------------------------------------------------------------------- servers
def start_server(tree: Path, home: Path, port: int) -> subprocess.Popen:
    log = (home / "server.log").open("wb")
    cmd = [sys.executable, "-m", "app.cli.main", "serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, cwd=tree, env=tree_env(tree, home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError(f"server of {tree} did not come up:\n{(home / 'server.log').read_text()[-4000:]}")


# ---------------------------------------------------------------------- the feeder (child side)
def _store(home: Path) -> Any:
    from storage.store import Store

    return Store(f"sqlite:///{home / 'tunedeck.db'}")


def _new_running(store: Any, name: str, total: int) -> int:
    """Queued, then claimed on device 0 as a worker would (one run at a time: `_finish` frees it)."""
    from jobs.spec.job import JobSpec

    run_id = store.create_run(JobSpec(model="tiny-llama", run_name=name))
    claimed = store.claim_next_on_device("bench-ui", "0", os.getpid())
    assert claimed is not None and claimed.id == run_id, (claimed, run_id)
    store.heartbeat(run_id)
    store.set_progress(run_id, 0, total)
    return run_id


def _finish(store: Any, run_id: int, steps: int | None = None) -> None:
    if steps is not None:
        store.set_progress(run_id, steps, steps)
    assert store.mark_succeeded(run_id, {"train_loss": 1.0})
    store.release_device("0", "bench-ui")


def _metric_rows(step: int, t: float, loss: float | None) -> list[Any]:
    from storage.store import MetricPoint

    rng = random.Random(step)
    loss = 3.0 * 0.995**step + rng.random() * 0.05 if loss is None else loss
    return [
        MetricPoint(step, "loss", loss, t),
        MetricPoint(step, "learning_rate", 2e-4 * (1 - step / 1_000_000), t),
        MetricPoint(step, "tokens_per_second", 5000.0 + rng.random() * 100, t),
    ]


def _memory_rows(run_id: int, t: float) -> list[Any]:
    """What the sampler writes each second on a GPU: the device (nvml) and the process (torch)."""
    from storage.store import MemoryPoint

    used = int((20 + random.random()) * GIB)
    return [
        MemoryPoint(t, "nvml", run_id, 0, used, 141 * GIB, 90.0, 60.0, 500.0),
        MemoryPoint(
            t, "torch", run_id, 0, torch_allocated=18 * GIB, torch_reserved=19 * GIB, torch_max_allocated=19 * GIB
        ),
    ]


def _history(store: Any, run_id: int, steps: int, t0: float, only_loss: bool = False) -> None:
    """`steps` steps of the three series and memory samples; only the `loss` series with `only_loss`."""
    rows = [r for step in range(steps) for r in _metric_rows(step, t0 + step, None)[: 1 if only_loss else None]]
    store.add_metrics(run_id, rows)
    if not only_loss:
        store.add_memory_samples([m for step in range(steps) for m in _memory_rows(run_id, t0 + step)])


def _feed_command(store: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "finished":  # a succeeded run of `steps` steps, one step and one memory sample a second
        run_id = _new_running(store, "bench-finished", cmd["steps"])
        _history(store, run_id, cmd["steps"], time.time() - cmd["steps"])
        _finish(store, run_id, cmd["steps"])
        return {"run_id": run_id}
    if op == "running":  # a running run with `steps` steps of history
        run_id = _new_running(store, "bench-live", 1_000_000)
        _history(store, run_id, cmd["steps"], time.time() - cmd["steps"], cmd.get("only_loss", False))
        store.set_progress(run_id, cmd["steps"] - 1)
        return {"run_id": run_id}
    if op == "tick":  # one training step: its metric rows (or only `loss`), a memory sample, progress
        run_id, step, now = cmd["run_id"], cmd["step"], time.time()
        rows = _metric_rows(step, now, cmd.get("loss"))
        store.add_metrics(run_id, rows[:1] if cmd.get("only_loss") else rows)
        if not cmd.get("only_loss"):
            store.add_memory_samples(_memory_rows(run_id, now))
        store.heartbeat(run_id)
        store.set_progress(run_id, step)
        return {"ok": True}
    if op == "finish":
        _finish(store, cmd["run_id"])
        return {"ok": True}
    raise ValueError(f"unknown feeder command {op!r}")


def feed_main(home: Path, tree: Path) -> int:
    import storage

    where = Path(storage.__file__).resolve()
    if not where.is_relative_to(tree.resolve()):
        print(json.dumps({"error": f"storage imported from {where}, not {tree}"}), flush=True)
        return 1
    store = _store(home)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        print(json.dumps(_feed_command(store, cmd)), flush=True)
    store.dispose()
    return 0


# ---------------------------------------------------------------------- the feeder (parent side)
class Feeder:
    """Writes one tree's store through that tree's own code, in a child process."""

    def __init__(self, tree: Path, home: Path):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--feed", str(home), "--tree", str(tree)],
            cwd=tree,
            env=tree_env(tree, home),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the feeder exited ({self.proc.wait()})")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(out["error"])
        return out

    def __call__(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.close()
            self.proc.wait(30)


@dataclass
class Side:
    """One tree under test: its server, its store's feeder, its runs."""

    name: str
    tree: Path
    home: Path
    server: subprocess.Popen | None = None
    port: int = 0
    feeder: Feeder | None = None
    finished_run: int = 0

    def start(self, finished_steps: int) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.feeder = Feeder(self.tree, self.home)
        self.finished_run = self.feed("finished", steps=finished_steps)["run_id"]
        self.port = free_port()
        self.server = start_server(self.tree, self.home, self.port)
        self.warm_up()

    def warm_up(self) -> None:
        """Open the dashboard once and wait for its load event's output (the form's memory bar).

        A fresh server's first page builds the memory predictor (it imports transformers' modelling
        code: seconds of CPU, once per process); without this that one-time cost fell into the first
        page's window. A tree whose form draws no bar is measured unwarmed, with a warning."""
        from playwright.sync_api import TimeoutError as PageTimeout

        with chromium() as browser:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(self.url())
            try:
                page.wait_for_selector("#memory-bar", state="attached", timeout=180_000)
            except PageTimeout as exc:  # the bench goes on, and says so
                print(
                    f"warm-up of {self.name}: no memory bar ({type(exc).__name__}); measured unwarmed", file=sys.stderr
                )

    def feed(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.feeder is not None
        return self.feeder(op, **kw)

    def new_live_run(self, steps: int, only_loss: bool = False) -> int:
        return self.feed("running", steps=steps, only_loss=only_loss)["run_id"]

    def url(self, query: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{query}"

    def pause(self, paused: bool) -> None:
        """Freeze (SIGSTOP) this side's server while the other side is measured, so its idle cost stays out."""
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        if self.feeder is not None:
            self.feeder.close()
        if self.server is not None:
            self.pause(False)
            stop_server(self.server)


# ---------------------------------------------------------------------- process-tree CPU
class TreeCPU:
    """CPU seconds of a changing set of processes: sampled every call, last seen times kept per process."""

    def __init__(self, roots: Any) -> None:
        self.roots = roots  # () -> list[psutil.Process]
        self.start: dict[tuple[int, float], float] = {}
        self.last: dict[tuple[int, float], float] = {}

    def _times(self) -> dict[tuple[int, float], float]:
        import psutil

        out = {}
        for p in self.roots():
            try:
                t = p.cpu_times()
                out[(p.pid, p.create_time())] = t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return out

    def begin(self) -> None:
        self.start = self._times()
        self.last = dict(self.start)

    def sample(self) -> None:
        self.last.update(self._times())

    def seconds(self) -> float:
        """CPU seconds since begin(); a process started since counts from zero."""
        return sum(t - self.start.get(key, 0.0) for key, t in self.last.items())


def browser_processes() -> list[Any]:
    """The Chromium processes among this process's descendants (playwright's node driver is not one)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name().startswith("chrom"):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def server_processes(proc: subprocess.Popen) -> Any:
    import psutil

    def roots() -> list[Any]:
        try:
            root = psutil.Process(proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    return roots


# ---------------------------------------------------------------------- one page in Chromium
@dataclass
class PageResult:
    browser_pct: float
    server_pct: float
    requests: int
    window_s: float
    paths: Counter[str] = field(default_factory=Counter)
    chart: str = ""


@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh Chromium (its own process tree) for one measurement."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, url: str, run_id: int | None, settle_s: float) -> Any:
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(url)
    if run_id is None:
        page.wait_for_selector(".gradio-container", timeout=60_000)
    else:
        page.wait_for_function(
            f"(document.querySelector('#run-header') || {{}}).innerText?.includes('Run {run_id}:')",
            timeout=60_000,
        )
    page.wait_for_timeout(settle_s * 1000)
    return page


def measure_window(
    side: Side, url: str, run_id: int | None, window_s: float, settle_s: float, tick: Any = None
) -> PageResult:
    """Open `url` in a fresh Chromium, let it settle, then measure `window_s`; `tick(i)` runs once a second."""
    assert side.server is not None
    requests: list[str] = []
    with chromium() as browser:
        page = open_page(browser, url, run_id, settle_s)
        chart = page.evaluate(CHART_KIND_JS) if run_id is not None else ""
        page.on("request", lambda r: requests.append(f"{r.method} {urlsplit(r.url).path}"))
        browser_cpu, server_cpu = TreeCPU(browser_processes), TreeCPU(server_processes(side.server))
        page.evaluate("1")  # deliver the events queued so far; count from here
        requests.clear()
        browser_cpu.begin()
        server_cpu.begin()
        t0 = time.perf_counter()
        for i in range(int(window_s)):
            if tick is not None:
                tick(i)
            browser_cpu.sample()
            server_cpu.sample()
            page.wait_for_timeout(max(0.0, t0 + i + 1 - time.perf_counter()) * 1000)
        browser_cpu.sample()
        server_cpu.sample()
        wall = time.perf_counter() - t0
        page.evaluate("1")
        seen = list(requests)
    return PageResult(
        100 * browser_cpu.seconds() / wall, 100 * server_cpu.seconds() / wall, len(seen), wall, Counter(seen), chart
    )


def measure_latency(side: Side, samples: int, seed: int = 1) -> tuple[list[float], str]:
    """Write one `loss` row twice the previous maximum; seconds until the loss plot shows it.

    As the first bench/ui.py did (the issue's figures): the run has 100 steps of `loss` only, so the
    page redraws one plot, not four (with all four series the Vega page's latency was ~4x longer).
    """
    run_id = side.new_live_run(steps=100, only_loss=True)
    rng = random.Random(seed)
    latencies: list[float] = []
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(side.url(f"?run={run_id}"))
        page.wait_for_function(f"({LOSS_TOP_JS})() !== null", timeout=60_000)
        chart = page.evaluate(CHART_KIND_JS)
        value, step = 10.0, 100
        for _ in range(samples):
            time.sleep(rng.random())  # a random phase of the page's refresh
            value *= 2
            step += 1
            t0 = time.perf_counter()
            side.feed("tick", run_id=run_id, step=step, loss=value, only_loss=True)
            page.wait_for_function(f"({LOSS_TOP_JS})() >= {value}", timeout=30_000, polling=10)
            latencies.append(time.perf_counter() - t0)
    side.feed("finish", run_id=run_id)
    return latencies, chart


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="bench/ui.py's store feeder (one tree's own code)")
    parser.add_argument("--feed", type=Path, required=True, help="TUNEDECK_HOME whose store to write")
    parser.add_argument("--tree", type=Path, required=True, help="the tree whose code must be imported")
    ns = parser.parse_args()
    sys.exit(feed_main(ns.feed, ns.tree))
