"""The training child's runtime baseline: how much memory it holds before it loads a model.

    python -m jobs.train.baseline      # one JSON line: {"runtime_bytes": 601595904,
                                       #   "trainer_bytes": {"orpo": 122880, "cpo": 159744, "grpo": 56508416},
                                       #   "libraries": [...]}

On the CPU a run's measured memory curve is the RSS of its training process tree, and that holds
more than the tensors the prediction counts (`jobs/memory/predict.py`): the interpreter, the
libraries as imported, the tunedeck modules, torch's thread pools. This process does what
`python -m jobs.train.child` does before it loads a model, by importing what the child imports and
calling its own set-up, and prints its RSS (psutil, the figure the sampler adds up for the curve).
The worker runs it once per host and interpreter with the child's environment, caches the figure
(`jobs.worker.runtime`) and publishes it as `DeviceFacts.runtime_bytes`; see docs/memory.md,
"Overhead".

Included: the interpreter; what `jobs.train.child` imports (`jobs.train.recipe`, `jobs.train.training`,
the callbacks, the pure mapping: torch, transformers, peft, accelerate, bitsandbytes); the child's
`setup_logging` (datasets, transformers' logging); the modules it imports lazily before the model
and for the whole run (the store and SQLAlchemy, the data and model loaders, trl's trainers, which
`jobs.train.trainers.build_trainer` imports once the model is loaded but which stay for the run);
`detect_device()` as the child calls it; one small forward and backward, which starts torch's
intra-op thread pool and the autograd engine.

Not included, because it depends on the run: the model's own modeling module (transformers imports
`modeling_llama` and the like when it loads one), the weights, the tokenizer and its vocabulary,
the data, the database connection, and the allocator's slack around the run's tensors. On CUDA the
run's curve is torch's reserved memory, which has none of this.

Per trainer (`trainer_bytes`): the common figure holds the trl trainers most runs use (SFT, DPO, KTO,
Reward); a trainer whose classes it does not hold (GRPO, and trl.experimental's ORPO and CPO) imports more
once its model is loaded. After reading the common figure, this process imports each trainer's trl classes
as `build_trainer` does (`TrainerRecord.config_type()`, `.trainer_type()`) and records the RSS they add. A
trainer whose import loads no new module (the common set's) adds nothing and is not listed. They are imported
one after another in the records' order, so a later trainer's figure leaves out what an earlier one already
loaded; measured here, GRPO's is the same alone and after ORPO's and CPO's (53.9 MiB), theirs a few
hundred KiB.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# What the baseline must have imported; the test reads them back from the output.
LIBRARIES = ("torch", "transformers", "peft", "trl", "datasets", "accelerate", "bitsandbytes", "sqlalchemy")


def prepare() -> None:
    """Do what the training child does before it loads a model (imports and one-off set-up)."""
    import jobs.train.parent_watch  # noqa: F401 - with the recipe, everything the child's module imports at its start
    from jobs.train import recipe

    recipe.setup_logging()  # as `child.main` does first: datasets, transformers' logging (to stdout)
    # What `run` and `train_spec` import lazily before (or, for trl, right after) the model loads.
    from trl import DPOTrainer, KTOTrainer, RewardTrainer, SFTTrainer  # noqa: F401 - as build_trainer does

    import jobs.data.loading  # noqa: F401
    import jobs.models.loading  # noqa: F401
    import jobs.models.references  # noqa: F401
    import storage.store  # noqa: F401
    from jobs.devices.probe import detect_device

    detect_device()  # as the recipe asks torch for its device (on a GPU host, torch initialises CUDA here)
    import torch

    # Thread pools and the autograd engine start on first use, whatever the model: a 64 x 64 step
    # starts them and leaves nothing else behind (a few KiB of tensors, freed).
    x = torch.ones(64, 64, requires_grad=True)
    (x @ x).sum().backward()


def trainer_bytes() -> dict[str, int]:
    """The RSS each trainer's own trl classes add, imported now as `build_trainer` imports them ({"grpo": N});
    a trainer whose import loads no new module (the common set's, `prepare`) adds nothing and is left out."""
    import psutil

    from jobs.spec.trainer_records import RECORDS

    process, added = psutil.Process(), {}
    for trainer, record in RECORDS.items():
        modules, before = len(sys.modules), process.memory_info().rss
        record.config_type()
        record.trainer_type()
        grown = int(process.memory_info().rss) - before
        if len(sys.modules) > modules and grown > 0:
            added[trainer.value] = grown
    return added


def measure() -> dict[str, Any]:
    """This process's RSS once prepared, which of the libraries it has imported, then each trainer's own increment."""
    import psutil

    prepare()
    runtime = int(psutil.Process().memory_info().rss)
    libraries = [name for name in LIBRARIES if name in sys.modules]
    return {"runtime_bytes": runtime, "trainer_bytes": trainer_bytes(), "libraries": libraries}


def main() -> int:
    """Print the measurement as the last line of stdout (the set-up above may log before it)."""
    print(json.dumps(measure()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
