"""Every memory prediction the tricks touch, printed as `tunedeck plan` prints it: for a before/after diff.

    python bench/trick_predictions.py > /tmp/before.txt      # ... change the tricks' code ...
    python bench/trick_predictions.py | diff /tmp/before.txt -  # nothing: the predictions are byte-identical

Two parts: each examples/*.yaml through the one check `tunedeck plan` runs (`jobs.checks.pipeline.check`), on a
fixed CPU and a fixed 24 GiB GPU (its table, its fit to 24 GiB and its problems); then every zoo family
(`jobs.models.zoo`, the config only: no weights are built) under a grid of methods x memory tricks x devices,
straight through `jobs.memory.predict.predict` and `jobs.memory.planner.fit`. The devices are fixed
(no probe), so the output depends on the code only.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from app.cli.plan import fit_text, table  # noqa: E402
from jobs.devices.facts import DeviceFacts  # noqa: E402

GiB = 2**30
CPU = DeviceFacts(kind="cpu", name="cpu", total_bytes=64 * GiB, runtime_bytes=400 * 2**20)
GPU = DeviceFacts(kind="cuda", name="24 GiB GPU", total_bytes=24 * GiB, compute_capability="8.9", bf16=True, fp16=True)
# (name, spec changes): each memory trick alone, and a few together.
VARIANTS: list[tuple[str, dict]] = [
    ("plain", {}),
    ("checkpointing", {"gradient_checkpointing": True}),
    ("accumulation", {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}),
    ("8bit", {"optim": "adamw_bnb_8bit"}),
    ("paged", {"optim": "paged_adamw_8bit"}),
    ("liger", {"use_liger_kernel": True}),
    ("offloading", {"activation_offloading": True}),
    ("offloading+ckpt", {"activation_offloading": True, "gradient_checkpointing": True}),
    ("compile", {"torch_compile": True}),
    ("allocator", {"cpu_return_freed_memory": True}),
    ("neftune+loraplus", {"neftune_noise_alpha": 5.0, "loraplus_lr_ratio": 16.0}),
    ("bf16", {"precision": "bf16"}),
    ("fp16", {"precision": "fp16"}),
    ("packing", {"packing": True}),
]
FULL_VARIANTS: list[tuple[str, dict]] = [
    ("galore", {"optim": "galore_adamw"}),
    ("galore8bit", {"optim": "galore_adamw_8bit", "optim_rank": 16}),
    ("galore-layerwise", {"optim": "galore_adamw_layerwise", "optim_target_modules": "q_proj,v_proj"}),
    ("apollo", {"optim": "apollo_adamw", "optim_target_modules": ".*mlp.*"}),
]


def fitted(spec, arch, device, target: int, lengths=None) -> str:
    """`tunedeck plan --fit`'s text, or the error it stops with (kto at micro-batch 1 is refused mid-fit)."""
    try:
        return fit_text(spec, arch, device, target, (), lengths)
    except Exception as e:  # noqa: BLE001 - printed, so a change in it shows in the diff
        return f"fit failed: {type(e).__name__}: {e}"


def examples() -> None:
    from app.cli.usage import load_spec
    from jobs.checks.pipeline import check

    for path in sorted((REPO / "examples").glob("*.yaml")):
        for device in (CPU, GPU):
            print(f"===== {path.name} on {device.name}")
            try:
                spec = load_spec(str(path))
            except Exception as e:  # noqa: BLE001 - an example the spec refuses is printed as such
                print("refused:", type(e).__name__, e)
                continue
            checked = check(spec, device=device)
            if checked.prediction is None:
                print("no prediction:", checked.problems)
                continue
            print(table(checked.prediction, checked.memory.source))
            print("fit:\n" + fitted(spec, checked.memory.arch, device, 24 * GiB, checked.memory.lengths))
            print("problems:", [str(p) for p in checked.problems])
            print("warnings:", list(checked.warnings))


def zoo() -> None:
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict
    from jobs.models.tiny import train_tokenizer
    from jobs.models.zoo import FAMILIES, zoo_config
    from jobs.spec.job import JobSpec

    tokenizer = train_tokenizer()
    base = {"model": "zoo", "dataset": "sample:chat-format", "max_length": 256, "per_device_train_batch_size": 4}
    for family in FAMILIES:
        arch = arch_from_config(zoo_config(family, tokenizer))
        for method in ("lora", "qlora", "full"):
            variants = VARIANTS + (FULL_VARIANTS if method == "full" else [])
            for (name, changes), device in itertools.product(variants, (CPU, GPU)):
                print(f"===== {family} {method} {name} on {device.name}")
                try:
                    spec = JobSpec.from_dict({**base, "method": method, **changes})
                except Exception as e:  # noqa: BLE001 - a refused combination is printed as such
                    print("refused:", type(e).__name__, e)
                    continue
                try:
                    print(table(predict(spec, arch, device), "zoo"))
                except Exception as e:  # noqa: BLE001 - a family the predictor cannot take, printed as such
                    print(f"predict failed: {type(e).__name__}: {e}")
                    continue
                if name in ("plain", "checkpointing", "liger", "galore"):
                    print("fit:\n" + fitted(spec, arch, replace(device, total_bytes=GiB), GiB))


if __name__ == "__main__":
    examples()
    zoo()
