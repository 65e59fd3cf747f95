"""Every dashboard chart in real Chromium, checked by what it drew: marks, axis domains, legend.

Runs are seeded straight into the store (metrics and memory samples as the training callback and
the sampler write them), then `tunedeck serve` starts on them; nothing trains. For each chart the
test reads the SVG scene (tests/chart_scene.py) and checks that
- every series with data drew a line of more than one vertex (or one point per run);
- each axis is continuous and its domain covers the data written;
- the legend names exactly the series that have data on this machine;
- the plot keeps a sensible height.
A chart that renders empty, discrete or unbounded fails. Screenshots of the Compare tab with two
and with five runs go to test-artifacts/.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served
from chart_scene import Scene, number, wait_scene
from engines import engine_missing, import_or_missing
from training_helpers import claim_run

pytestmark = pytest.mark.browser
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")

ARTIFACTS = REPO / "test-artifacts"
GIB = 1024**3
STEPS = 30
MIN_HEIGHT, MAX_HEIGHT = 150, 600  # px: a plot between these is readable and fits the screen


@dataclass
class Seeded:
    run_id: int
    name: str
    losses: list[float]
    tps: list[float]
    peak: int
    memory: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # series -> (t, GiB)

    @property
    def label(self) -> str:
        return f"#{self.run_id} {self.name}"


def _seed(store, name: str, k: int, *, gpu: bool, mem_start: float):
    """A finished run with loss/eval/lr/tokens-per-second rows and 30 s of memory samples."""
    from jobs.spec.enums import Method
    from jobs.spec.job import JobSpec
    from storage.store import MemoryPoint, MetricPoint

    methods = [Method.LORA, Method.QLORA, Method.FULL, Method.DORA, Method.LORA]
    run_id = store.create_run(JobSpec(run_name=name, method=methods[k % len(methods)], lora_r=8 * (k + 1)))
    assert store.claim_next_on_device("seed", "0") is not None
    now = time.time()
    losses = [3.0 - k * 0.2 - 1.5 * i / STEPS for i in range(STEPS)]
    tps = [1000.0 * (k + 1) + 37.0 * (i % 5) for i in range(STEPS)]
    points = [MetricPoint(i + 1, "loss", losses[i], now) for i in range(STEPS)]
    points += [MetricPoint(i + 1, "tokens_per_second", tps[i], now) for i in range(STEPS)]
    points += [MetricPoint(i + 1, "step_time", 0.25 * (k + 1), now) for i in range(STEPS)]
    points += [MetricPoint(i + 1, "learning_rate", 2e-4 * (1 - i / STEPS), now) for i in range(STEPS)]
    points += [MetricPoint(s, "eval_loss", losses[s - 1] + 0.3, now) for s in (10, 20, 30)]
    points += [MetricPoint(s, "eval_perplexity", 2.0 * losses[s - 1], now) for s in (10, 20, 30)]
    store.add_metrics(run_id, points)
    memory: dict[str, list[tuple[float, float]]] = {}
    samples = []
    for i in range(30):
        t = mem_start + i
        gib = 0.4 + 0.1 * k + 0.5 * i / 30
        if gpu:
            samples.append(
                MemoryPoint(
                    time=t,
                    source="nvml",
                    run_id=run_id,
                    device_index=0,
                    used_bytes=int((gib + 1.0) * GIB),
                    total_bytes=80 * GIB,
                    process_rss=int(0.3 * GIB),
                )
            )
            samples.append(
                MemoryPoint(
                    time=t,
                    source="torch",
                    run_id=run_id,
                    device_index=0,
                    torch_allocated=int(gib * GIB),
                    torch_reserved=int((gib + 0.5) * GIB),
                )
            )
            memory.setdefault("GPU used (NVML)", []).append((t, gib + 1.0))
            memory.setdefault("torch allocated", []).append((t, gib))
            memory.setdefault("torch reserved", []).append((t, gib + 0.5))
        else:
            samples.append(
                MemoryPoint(
                    time=t,
                    source="host",
                    run_id=run_id,
                    used_bytes=int(gib * GIB),
                    total_bytes=24 * GIB,
                    process_rss=int(gib * GIB),
                )
            )
            memory.setdefault("host RSS", []).append((t, gib))
    store.add_memory_samples(samples)
    peak = int(max(v for series in memory.values() for _, v in series) * GIB)
    store.set_peak_memory(run_id, peak, "nvml" if gpu else "host")
    store.mark_succeeded(run_id, {"train_runtime": 30.0, "global_step": float(STEPS)})
    return Seeded(run_id, name, losses, tps, peak, memory)


@pytest.fixture(scope="module")
def dashboard_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("charts-home")


@pytest.fixture(scope="module")
def dashboard(dashboard_home: Path):
    from storage.store import Store

    home = dashboard_home
    store = Store(f"sqlite:///{home / 'tunedeck.db'}")
    now = time.time()
    # Two runs share a name; the last one trained on a GPU, an hour ago (outside the live panel's window).
    runs = [
        _seed(store, name, k, gpu=(k == 4), mem_start=now - 80 if k == 0 else now - 3600 - 100 * k)
        for k, name in enumerate(["lora-r8", "lora-r8", "full", "dora", "gpu-run"])
    ]
    store.dispose()
    with served(home) as url:
        yield url, runs


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    return page


def _span(values) -> tuple[float, float]:
    values = list(values)
    return min(values), max(values)


def _has_lines(series: dict[str, list[tuple[float, float]]], legend: bool = True):
    """A readiness check: every expected series drew a line, and (with a legend) nothing else is named."""

    def ready(scene: Scene) -> bool:
        drawn = scene.drawn_lines()
        return set(drawn) == set(series) and (not legend or sorted(scene.legend) == sorted(series))

    return ready


def _check_lines(scene: Scene, series: dict[str, list[tuple[float, float]]], legend: bool = True) -> None:
    """Lines of > 1 vertex for exactly these series, axes covering their data, the legend naming them."""
    drawn = scene.drawn_lines()
    assert set(drawn) == set(series), scene.describe()
    for name, pts in series.items():
        assert drawn[name] >= min(len(pts), 2), (name, scene.describe())
    xs, ys = zip(*[p for pts in series.values() for p in pts])
    assert scene.axis("X").covers(*_span(xs)), scene.describe()
    assert scene.axis("Y").covers(*_span(ys)), scene.describe()
    if legend:
        assert sorted(scene.legend) == sorted(series), scene.describe()
        assert scene.legend_clipped == [], scene.describe()
    else:
        assert scene.legend == [], scene.describe()
    assert MIN_HEIGHT <= scene.height <= MAX_HEIGHT, scene.describe()


def _metric_series(run: Seeded) -> dict[str, dict[str, list[tuple[float, float]]]]:
    steps = range(1, STEPS + 1)
    return {
        "run-loss-plot": {
            "train": list(zip(steps, run.losses)),
            "eval": [(s, run.losses[s - 1] + 0.3) for s in (10, 20, 30)],
        },
        "run-lr-plot": {"learning rate": [(s, 2e-4 * (1 - (s - 1) / STEPS)) for s in steps]},
        "run-tps-plot": {"tokens/s": list(zip(steps, run.tps))},
        # The trainer's own metrics (SFT: eval perplexity), where the dashboard has that plot.
        "run-trainer-plot": {"eval perplexity": [(s, 2.0 * run.losses[s - 1]) for s in (10, 20, 30)]},
    }


def _memory_since_start(run: Seeded) -> dict[str, list[tuple[float, float]]]:
    t0 = min(t for pts in run.memory.values() for t, _ in pts)
    return {name: [(t - t0, gib) for t, gib in pts] for name, pts in run.memory.items()}


# ---------------------------------------------------------------------- the always-visible panel
def test_gpu_panel_draws_only_this_machines_memory(dashboard, dashboard_home, browser):
    from jobs.devices import probe
    from storage.store import MemoryPoint, Store

    url, _ = dashboard
    # The panel shows the last 5 minutes: samples seeded with the module's runs could have left that
    # window while a loaded machine started the server and Chromium, so this test writes its own now.
    store = Store(f"sqlite:///{dashboard_home / 'tunedeck.db'}")
    now = time.time()
    seeded = [(now - 30 + i, 0.4 + 0.5 * i / 30) for i in range(30)]
    store.add_memory_samples(
        MemoryPoint(time=t, source="host", used_bytes=int(g * GIB), total_bytes=24 * GIB, process_rss=int(g * GIB))
        for t, g in seeded
    )
    store.dispose()
    page = _page(browser, url)
    # The worker's sampler adds idle samples (0 bytes, source host, or nvml on a GPU machine).
    expected = {"host RSS"} | ({"GPU used (NVML)"} if probe.has_cuda() else set())
    scene = wait_scene(
        page, "gpu-memory-plot", lambda s: set(s.drawn_lines()) == expected and sorted(s.legend) == sorted(expected)
    )
    assert scene.drawn_lines()["host RSS"] >= len(seeded), scene.describe()
    x = scene.axis("X")
    assert (x.lo, x.hi) == (-300.0, 0.0), scene.describe()
    assert scene.axis("Y").covers(0.0, max(g for _, g in seeded)), scene.describe()
    assert scene.axis("Y").title == "memory (GiB)"
    assert scene.legend_clipped == [], scene.describe()
    assert MIN_HEIGHT <= scene.height <= MAX_HEIGHT, scene.describe()
    # GPU utilization has no meaning without a GPU: the plot is shown only with one.
    assert page.locator("#gpu-utilization-plot").is_visible() == probe.has_cuda()
    page.close()


# ---------------------------------------------------------------------- the run page
@pytest.mark.parametrize("which", [0, 4], ids=["cpu-run", "gpu-run"])
def test_run_page_graphs_draw_every_series(dashboard, browser, which):
    url, runs = dashboard
    run = runs[which]
    page = _page(browser, f"{url}/?run={run.run_id}")
    memory = _memory_since_start(run)
    scene = wait_scene(page, "run-memory-plot", _has_lines(memory))
    _check_lines(scene, memory)
    assert scene.axis("Y").title == "memory (GiB)"
    assert scene.axis("Y").lo == 0.0, scene.describe()
    for elem_id, series in _metric_series(run).items():
        if elem_id == "run-trainer-plot" and page.locator(f"#{elem_id}").count() == 0:
            continue
        legend = elem_id in ("run-loss-plot", "run-trainer-plot")
        _check_lines(wait_scene(page, elem_id, _has_lines(series, legend)), series, legend)
    page.close()


# ---------------------------------------------------------------------- compare
def _pick(page, runs: list[Seeded]) -> None:
    picker = page.locator("#compare-runs input")
    for run in runs:
        picker.click()
        page.get_by_role("option", name=f"{run.run_id} · {run.name} · succeeded", exact=True).click()
    page.keyboard.press("Escape")


def _check_compare(page, runs: list[Seeded]) -> None:
    labels = sorted(r.label for r in runs)

    def scatter_ready(s: Scene) -> bool:
        return sorted(p.get("series", "") for p in s.point_fields()) == labels and sorted(s.legend) == labels

    scatter = wait_scene(page, "compare-tradeoff", scatter_ready)
    by_label = {p["series"]: p for p in scatter.point_fields()}
    assert len(scatter.points) == len(runs), scatter.describe()
    for run in runs:
        point = by_label[run.label]
        tps, gib = number(point["tokens/s (mean)"]), number(point["peak memory (GiB)"])
        assert tps == pytest.approx(sum(run.tps) / len(run.tps), abs=0.5), point
        assert gib == pytest.approx(run.peak / GIB, abs=0.006), point
    assert scatter.axis("X").covers(0.0, max(sum(r.tps) / len(r.tps) for r in runs)), scatter.describe()
    assert scatter.axis("Y").covers(0.0, max(r.peak / GIB for r in runs)), scatter.describe()
    assert MIN_HEIGHT <= scatter.height <= MAX_HEIGHT, scatter.describe()
    assert scatter.legend_clipped == [], scatter.describe()
    loss = {r.label: list(zip(range(1, STEPS + 1), r.losses)) for r in runs}
    _check_lines(wait_scene(page, "compare-loss", _has_lines(loss)), loss)


def test_compare_two_runs(dashboard, browser):
    url, runs = dashboard
    page = _page(browser, url)
    page.get_by_role("tab", name="Compare").click()
    _pick(page, runs[:2])  # same name, told apart by their ids
    _check_compare(page, runs[:2])
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#compare-tradeoff").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "compare-2-runs.png"), full_page=True)
    page.close()


def test_compare_five_runs(dashboard, browser):
    url, runs = dashboard
    page = _page(browser, url)
    page.get_by_role("tab", name="Compare").click()
    _pick(page, runs)
    _check_compare(page, runs)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#compare-tradeoff").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "compare-5-runs.png"), full_page=True)
    page.close()


# ---------------------------------------------------------------------- what an open page costs
def _text_shown(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([sel, text]) => (document.querySelector(sel)?.textContent || '').toLowerCase().includes(text.toLowerCase())",
        arg=[selector, text],
        timeout=60_000,
    )


def test_finished_run_page_and_launch_tab_make_no_requests_while_nothing_changes(dashboard, browser):
    """Nothing runs on a timer: once drawn, a finished run's page and the Launch tab send no request."""
    url, runs = dashboard
    pages = {"finished run": _page(browser, f"{url}/?run={runs[0].run_id}"), "launch tab": _page(browser, url)}
    requests: dict[str, list[str]] = {name: [] for name in pages}
    wait_scene(pages["finished run"], "run-loss-plot", _has_lines(_metric_series(runs[0])["run-loss-plot"]))
    wait_scene(pages["launch tab"], "gpu-memory-plot", lambda s: bool(s.drawn_lines()))
    # What the pages ask for once, answered: the run's text (its refresh, pressed by the stream) and
    # the Launch form's first memory budget (filled on load, in the run page's hidden tab too).
    _text_shown(pages["finished run"], "#run-header", "succeeded")
    for page in pages.values():
        _text_shown(page, "#budget", "Effective batch size")
    for name, page in pages.items():
        page.on("request", lambda r, name=name: requests[name].append(f"{r.method} {r.url}"))
    time.sleep(10.0)
    assert requests == {name: [] for name in pages}
    for page in pages.values():
        page.close()


def test_live_run_page_draws_a_new_metric_row_without_a_reload(dashboard, dashboard_home, browser):
    """A metric row written to a running run reaches its chart through the stream, without a reload
    (goal: within 1 s; bench/ui.py measures the latency; this checks only that it arrives: a loaded CI
    machine keeps no latency bound)."""
    from jobs.spec.job import JobSpec
    from storage.store import MetricPoint, Store

    url, _ = dashboard
    store = Store(f"sqlite:///{dashboard_home / 'tunedeck.db'}")
    # Pinned to a host no worker is on: the dashboard's own worker leaves it to this test.
    run_id = store.create_run(JobSpec(run_name="live", pin_host="elsewhere"))
    claim_run(store, run_id, "seed", "1", host="elsewhere")
    store.add_metrics(run_id, [MetricPoint(s, "loss", 2.0, time.time()) for s in range(1, 4)])
    page = _page(browser, f"{url}/?run={run_id}")
    wait_scene(page, "run-loss-plot", lambda s: s.drawn_lines().get("train", 0) >= 3)
    for step, value in ((4, 5.0), (5, 11.0)):
        store.add_metrics(run_id, [MetricPoint(step, "loss", value, time.time())])
        store.set_progress(run_id, step)
        page.wait_for_function(
            "(v) => Number(document.querySelector('#run-loss-plot .td-chart').dataset.ymax) >= v",
            arg=value,
            timeout=30_000,
        )
    page.wait_for_function("() => document.querySelector('#run-header').innerText.includes('loss 11')", timeout=30_000)
    store.mark_succeeded(run_id, {})
    page.wait_for_function(
        "() => document.querySelector('#run-header').innerText.includes('succeeded')", timeout=30_000
    )
    page.close()
    store.dispose()
