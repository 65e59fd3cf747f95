"""The always-visible GPU panel: device facts and a live graph of the last minutes of memory.

The device line shows what the workers published (`jobs.devices`), not the dashboard's own
device: in a deployment the dashboard may have no GPU while the worker has one. Reads stored
memory samples (whatever the worker's sampler wrote, also when no run is active), bucketed in
SQL by `Store.memory_buckets`. The graph follows the device: on a GPU it draws NVML's used memory
and torch's allocated/reserved; without NVIDIA GPU the panel says so plainly and the graph draws
the host memory (RSS) of the training process only (`series.MEMORY_SERIES`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from app import charts, series, ui_data
from storage.store import Store

WINDOW_S = charts.GPU_WINDOW_S
NO_GPU_NOTE = "No NVIDIA GPU found: showing host memory of the training process"


def device_markdown(store: Store | None = None) -> str:
    """The workers' device as they published it (`jobs.devices`); without a store, this machine's."""
    if store is not None:
        from jobs.devices import target

        chosen = target(store)
        if chosen.worker_id is not None:
            if not chosen.facts.cuda:
                return f"**{NO_GPU_NOTE}** · the worker trains on the CPU ({chosen.note})"
            return f"**Worker GPU: {chosen.facts.name}** · {chosen.note}"
        return device_markdown() + " · no worker has published its device yet: this is the dashboard's machine"
    info = ui_data.device_info()
    if info is None or not info.available:
        host = f" ({info.host_total_bytes / 1024 ** 3:.1f} GiB host RAM)" if info is not None else ""
        return f"**{NO_GPU_NOTE}**{host}"
    lines = [f"**GPU {d.index}: {d.name}** · {d.total_bytes / 1024 ** 3:.1f} GiB" for d in info.devices]
    return " · ".join(lines) + f" · NVIDIA driver {info.driver}"


def gpu_frames(store: Store, window_s: float = WINDOW_S, now: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(memory GiB, utilization %) over the last window, x in seconds relative to now (negative)."""
    now = time.time() if now is None else now
    origin = now - window_s
    buckets = store.memory_buckets(None, origin, max(window_s / 500, 0.25))
    return series.memory_frame(buckets, now), series.utilization_frame(buckets, now)


@dataclass
class GpuPanel:
    info: gr.Markdown
    memory: gr.LinePlot
    utilization: gr.LinePlot
    styles: gr.State


def build_panel() -> GpuPanel:
    """Lay out the panel; call inside a gr.Blocks context."""
    with gr.Accordion("GPU", open=True, elem_id="gpu-panel"):
        info = gr.Markdown(device_markdown())
        with gr.Row():
            memory = charts.GPU_MEMORY.build(scale=3)
            utilization = charts.GPU_UTILIZATION.build(scale=2, visible=ui_data.has_cuda())
    return GpuPanel(info, memory, utilization, gr.State({}))


def wire(panel: GpuPanel, store: Store, timer: gr.Timer) -> None:
    plots = [(charts.GPU_MEMORY, panel.memory), (charts.GPU_UTILIZATION, panel.utilization)]

    def tick() -> list[Any]:
        frames = gpu_frames(store)
        styles = {chart.elem_id: chart.style(frame) for (chart, _), frame in zip(plots, frames)}
        return [chart.update(frame) for (chart, _), frame in zip(plots, frames)] + [styles]

    ticked = timer.tick(tick, None, [plot for _, plot in plots] + [panel.styles], show_progress="hidden",
                        api_visibility="private", concurrency_id="gpu-graphs", concurrency_limit=1)
    charts.redraw_after(ticked, plots, panel.styles, "gpu-graphs")
    # The device line follows the workers' published facts (a worker may start after the page).
    timer.tick(lambda: device_markdown(store), None, panel.info, show_progress="hidden", api_visibility="private")
