"""The always-visible GPU panel: device facts and a live graph of the last minutes of memory.

The device line shows what the workers published (`jobs.devices.target`), not the dashboard's own
device: in a deployment the dashboard may have no GPU while the worker has one. Reads stored
memory samples (whatever the worker's sampler wrote, also when no run is active), bucketed in
SQL by `Store.memory_buckets`. The graph follows the device: on a GPU it draws NVML's used memory
and torch's allocated/reserved; without NVIDIA GPU the panel says so plainly and the graph draws
the host memory (RSS) of the training process only (`series.MEMORY_SERIES`). With several
workers on one store (a worker per GPU, many hosts), a device picker appears and the graph draws
the chosen worker's device only: every sample carries the worker that took it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.ui import charts, series
from jobs.devices import probe
from storage.roles_pages import DeviceMemory

WINDOW_S = charts.GPU_WINDOW_S
NO_GPU_NOTE = "No NVIDIA GPU found: showing host memory of the training process"


def device_markdown(store: DeviceMemory | None = None) -> str:
    """The workers' device as they published it (`jobs.devices.target`); without a store, this machine's."""
    if store is not None:
        from jobs.devices.target import target

        chosen = target(store)
        if chosen.worker_id is not None:
            if not chosen.facts.cuda:
                return f"**{NO_GPU_NOTE}** · the worker trains on the CPU ({chosen.note})"
            return f"**Worker GPU: {chosen.facts.name}** · {chosen.note}"
        return device_markdown() + " · no worker has published its device yet: this is the dashboard's machine"
    info = probe.gpu_info()
    if info is None or not info.available:
        host = f" ({info.host_total_bytes / 1024**3:.1f} GiB host RAM)" if info is not None else ""
        return f"**{NO_GPU_NOTE}**{host}"
    lines = [f"**GPU {d.index}: {d.name}** · {d.total_bytes / 1024**3:.1f} GiB" for d in info.devices]
    return " · ".join(lines) + f" · NVIDIA driver {info.driver}"


def device_choices(store: DeviceMemory) -> list[tuple[str, str]]:
    """(label, worker id) of every running worker's device, the largest GPU first (`jobs.devices.facts`)."""
    from jobs.devices.facts import DeviceFacts
    from jobs.devices.target import LIVE_WITHIN_S

    live = {w.get("worker_id") for w in store.live_workers(within_s=LIVE_WITHIN_S)}
    rows = [
        (DeviceFacts.from_dict(p["facts"]), p["worker_id"]) for p in store.published_devices() if p["worker_id"] in live
    ]
    rows.sort(key=lambda r: (not r[0].cuda, -r[0].total_bytes, r[1]))
    return [(f"{facts.summary()} · worker {worker}", worker) for facts, worker in rows]


def worker_device(store: DeviceMemory, worker_id: str | None) -> int | None:
    """The CUDA index a worker published (None: a CPU worker, or unknown)."""
    for p in store.published_devices():
        if p["worker_id"] == worker_id:
            return p["facts"].get("index") if p["facts"].get("kind") == "cuda" else None
    return None


def device_picker(store: DeviceMemory, current: str | None) -> Any:
    """The device dropdown: running workers' devices; shown only when there is more than one."""
    choices = device_choices(store)
    ids = [worker for _, worker in choices]
    value = current if current in ids else (ids[0] if ids else None)
    return gr.Dropdown(choices=choices, value=value, visible=len(choices) > 1)


def live_rows(
    store: DeviceMemory, worker_id: str | None, now: float, window_s: float = WINDOW_S, width: float = 1.0
) -> tuple[list[series.Row], list[series.Row]]:
    """(memory GiB, utilization %) rows over the last window for the page's live charts (`app.ui.live`):
    x is the clock time, buckets aligned on multiples of `width`, so a tick changes only the newest."""
    _, memory, utilization = LiveWindow(store, worker_id, window_s, width).read(now)  # a first read: the whole window
    return memory, utilization


class LiveWindow:
    """The GPU panel's reads for one page: the first reads the whole window, each later one
    only the buckets from `series.LATE_SAMPLES_S` before the newest sample seen; the page keeps the
    older points (`app.ui.live.ChartState`). Reading, comparing and sending all 300 buckets a second,
    per open panel, was about a quarter of a live page's server cost. Make a new one when the worker changes."""

    def __init__(self, store: DeviceMemory, worker_id: str | None, window_s: float = WINDOW_S, width: float = 1.0):
        self.store, self.worker_id, self.window_s, self.width = store, worker_id, window_s, width
        self.device = worker_device(store, worker_id) if worker_id is not None else None  # read once, not per tick
        self._newest: float | None = None  # the newest sample time read

    def read(self, now: float) -> tuple[float, list[series.Row], list[series.Row]]:
        """(start, memory GiB rows, utilization % rows) of the window's buckets from `start` on, a multiple of
        width (x is the clock time at a bucket's middle: older buckets lie before start)."""
        w = self.width
        origin = (now - self.window_s) // w * w
        start = origin if self._newest is None else max(origin, (self._newest - series.LATE_SAMPLES_S) // w * w)
        buckets = self.store.memory_buckets(None, start, w, worker_id=self.worker_id, device_index=self.device)
        self._newest = max((b.last_time for b in buckets), default=self._newest)
        return start, series.memory_rows(buckets, 0.0), series.utilization_rows(buckets, 0.0)


@dataclass
class GpuPanel:
    info: gr.Markdown
    device: gr.Dropdown
    memory: gr.HTML
    utilization: gr.HTML
    poll: gr.Button  # pressed by the page (app/ui/static/live.js) when the workers' devices changed


def build_panel() -> GpuPanel:
    """Lay out the panel; call inside a gr.Blocks context. Its charts are drawn by the page from the
    live stream (`app.ui.live`), only while the panel is open and on screen."""
    with gr.Accordion("GPU", open=True, elem_id="gpu-panel"):
        info = gr.Markdown(device_markdown(), elem_id="gpu-info")
        device = gr.Dropdown(
            label="Device (one graph per worker's device)",
            choices=[],
            value=None,
            visible=False,
            elem_id="gpu-device",
            allow_custom_value=False,
        )
        with gr.Row():
            memory = charts.GPU_MEMORY.live(scale=3)
            utilization = charts.GPU_UTILIZATION.live(scale=2, visible=probe.has_cuda())
        poll = gr.Button("devices changed", visible="hidden", elem_id="gpu-poll")
    return GpuPanel(info, device, memory, utilization, poll)


def wire(panel: GpuPanel, store: DeviceMemory) -> None:
    """The device line and the device choices follow the workers' published facts (a worker may
    start after the page, or stop): read when the page's stream says they changed."""
    panel.poll.click(
        lambda current: (device_markdown(store), device_picker(store, current)),
        panel.device,
        [panel.info, panel.device],
        show_progress="hidden",
        api_visibility="private",
    )
