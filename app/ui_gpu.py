"""The always-visible GPU panel: device facts and a live graph of the last minutes of memory.

The device line shows what the workers published (`jobs.devices`), not the dashboard's own
device: in a deployment the dashboard may have no GPU while the worker has one. Reads stored memory samples (whatever the worker's sampler wrote, also when no run is active),
bucketed in SQL by `Store.memory_buckets`. Without NVIDIA GPU the panel says so plainly and the
graph shows the host memory (RSS) of the training process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from app import series, ui_data
from storage.store import Store

WINDOW_S = 300.0
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


def build_panel() -> GpuPanel:
    """Lay out the panel; call inside a gr.Blocks context."""
    with gr.Accordion("GPU", open=True, elem_id="gpu-panel"):
        info = gr.Markdown(device_markdown())
        with gr.Row():
            # color_title="": the legend names each line; gradio would title it "series" (the column).
            # No fixed height: with one, gradio 6.31 clips the legend below the x axis.
            memory = gr.LinePlot(x="seconds", y="GiB", color="series", color_title="", x_lim=[-WINDOW_S, 0],
                                 x_title="seconds ago", y_title="GiB", label="Memory, last 5 minutes",
                                 elem_id="gpu-memory-plot", scale=3)
            utilization = gr.LinePlot(x="seconds", y="percent", color="series", colors_in_legend=[],
                                      x_lim=[-WINDOW_S, 0], y_lim=[0, 100], x_title="seconds ago",
                                      label="GPU utilization", scale=2, visible=ui_data.has_cuda())
    return GpuPanel(info, memory, utilization)


def wire(panel: GpuPanel, store: Store, timer: gr.Timer) -> None:
    def tick() -> tuple[pd.DataFrame, pd.DataFrame]:
        return gpu_frames(store)

    timer.tick(tick, None, [panel.memory, panel.utilization], show_progress="hidden", api_visibility="private")
    # The device line follows the workers' published facts (a worker may start after the page).
    timer.tick(lambda: device_markdown(store), None, panel.info, show_progress="hidden", api_visibility="private")
