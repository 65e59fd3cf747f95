"""The caches behind a fast memory panel and `tunedeck plan`: each remembered figure is the one a fresh
computation gives, and each is forgotten when what it was worked out from changes
(`bench/prediction_speed.py` measures the time they save)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from jobs.data.token_lengths import RowLengths
from jobs.spec.job import JobSpec


def test_remembered_length_figures_are_the_fresh_ones() -> None:
    rng = np.random.default_rng(0)
    lengths = RowLengths(rng.integers(5, 900, size=(500, 2)))
    with pytest.raises(ValueError):
        lengths.lengths[0, 0] = 1  # read-only: what is remembered cannot go stale
    grid = itertools.product((64, 512, 2048), (1, 8), (False, True), (False, True), ("sft", "dpo"))
    for max_length, batch, packing, padding_free, trainer in list(grid) * 2:  # twice: the second pass is remembered
        if packing and trainer != "sft":
            continue
        spec = JobSpec.from_dict(
            dict(
                max_length=max_length,
                per_device_train_batch_size=batch,
                packing=packing,
                padding_free=padding_free,
                trainer=trainer,
            )
        )
        fresh = RowLengths(lengths.lengths.copy())
        assert lengths.worst_batch(spec) == fresh.worst_batch(spec)
        assert lengths.stats(max_length) == fresh.stats(max_length)


def test_the_linears_a_target_picks_are_remembered_per_target() -> None:
    from jobs.memory.model_config import arch_for
    from jobs.memory.params import trainable_params

    arch = arch_for("smollm2-135m-instruct")
    assert arch is not None
    for targets in ("q_proj,v_proj", "all-linear", "down_proj", "q_proj,v_proj"):
        spec = JobSpec.from_dict({"lora_target_modules": targets})
        fresh = dataclasses.replace(arch.shape)  # nothing remembered yet
        assert trainable_params(spec, arch.shape) == trainable_params(spec, fresh)
    assert len(arch.shape.picked) == 3
