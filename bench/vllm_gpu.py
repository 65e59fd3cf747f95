"""GRPO with vLLM (use_vllm, trl's colocate mode): predicted vs measured peak of a short run, beside the same run
sampled by transformers' generate. The GPU check's `vllm` section (bench/gpu_check.sh --only vllm).

    python bench/vllm_gpu.py                    # a CUDA host with vllm installed (pip install 'tunedeck[vllm]')
    python bench/vllm_gpu.py --steps 2 --timeout 200 --share 0.3

The same path as `bench/memory_runs.py --device cuda` (its `run_grid`: a fresh data folder, a burst worker
publishes its device, each spec goes through `jobs.queue.submit.submit`, whose prediction is saved with the run,
then a burst worker trains them while its sampler records the peak): the GRPO example's LoRA settings on a
random-weight model of SmolLM2's shape, `--steps` optimizer steps, once with use_vllm and once without. Each
line: predicted, measured, the error; then the predicted `vllm` part (the share x the GPU's memory) and what the
prediction's generation phase holds. Without the vllm package, or without a CUDA GPU, it prints that the row was
skipped and why, and exits 0 (the GPU check's row says "skipped").

NOT RUN YET on a GPU: written where vllm cannot be installed; its import and its skip are tested on the CPU
(tests/test_vllm.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.grpo_memory import GRPO  # noqa: E402 - the GRPO example's LoRA run (its "lora-beta")
from bench.memory_runs import SMOLLM2, Job  # noqa: E402


def jobs(share: float) -> list[Job]:
    return [
        Job("grpo-generate", "transformers' generate samples the completions", dict(GRPO), model=SMOLLM2),
        Job(
            "grpo-vllm",
            f"vLLM in the training process (colocate), {share:.0%} of the GPU",
            {**GRPO, "use_vllm": True, "vllm_gpu_memory_utilization": share},
            model=SMOLLM2,
        ),
    ]


def skip_reason() -> str | None:
    """Why this host cannot run the row (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "the vllm package is not installed here (pip install 'tunedeck[vllm]' on the GPU host; trl 1.16 "
            "supports vLLM 0.22 to 0.31)"
        )
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU here (vLLM runs on CUDA GPUs only)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps a run (each generates first)")
    parser.add_argument("--share", type=float, default=0.3, help="vllm_gpu_memory_utilization")
    parser.add_argument("--timeout", type=float, default=200.0, help="seconds for both runs' training")
    parser.add_argument("--workdir", default=None, help="where the data folder and the models go (default: a new one)")
    parser.add_argument("--verbose", action="store_true", help="predicted parts and phases, measured phases")
    ns = parser.parse_args(argv)
    why = skip_reason()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    from bench.memory_runs import format_row, header, run_grid

    work = Path(ns.workdir) if ns.workdir else Path(tempfile.mkdtemp(prefix="tunedeck-vllm-"))
    grid = argparse.Namespace(device="cuda", steps=ns.steps, verbose=ns.verbose, timeout=ns.timeout)
    results = run_grid(jobs(ns.share), grid, work)
    print("\n" + header())
    for r in results:
        print(format_row(r))
        formulas = r.prediction.get("formulas") or {}
        if "vllm" in formulas:
            print(f"    vllm part {r.prediction['parts']['vllm'] / 2**20:,.0f} MiB: {formulas['vllm']}")
        if "generation" in formulas:
            print(f"    generation/scoring: {formulas['generation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
