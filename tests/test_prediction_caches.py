"""The caches behind a fast memory panel and `tunedeck plan`: each remembered figure is the one a fresh
computation gives, and each is forgotten when what it was worked out from changes
(`bench/prediction_speed.py` measures the time they save)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobs.data.tokens.lengths import RowLengths
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


LLAMA = dict(
    model_type="llama",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    tie_word_embeddings=False,
)


def _config_folder(folder: Path, **changes: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    return folder


def test_an_arch_is_read_again_when_its_config_changes(data_home: Path, tmp_path: Path) -> None:
    from jobs.memory.model_config import arch_for

    folder = _config_folder(tmp_path / "model")
    first = arch_for(str(folder))
    assert first is not None and first.hidden == 64
    _config_folder(folder, hidden_size=96)
    again = arch_for(str(folder))
    assert again is not None and again.hidden == 96 and again.total_params > first.total_params


def test_an_arch_read_back_from_disk_is_the_one_built(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.memory import arch_cache
    from jobs.memory.params import trainable_params
    from jobs.memory.parts import arch_from_config
    from jobs.memory.shape import transformers_config
    from jobs.models import library

    text = json.dumps(LLAMA, sort_keys=True)
    assert arch_cache.read_arch(text) is None  # nothing kept yet
    built = arch_from_config(transformers_config(LLAMA))
    arch_cache.keep_arch(text, built)
    read = arch_cache.read_arch(text)
    assert read is not None and read == built  # every field, the layer shapes included
    lokr = JobSpec.from_dict({"method": "lokr"})  # peft counts it on a model built from the config read back
    assert trainable_params(lokr, read.shape) == trainable_params(lokr, built.shape)
    real = library.stamp
    monkeypatch.setattr(library, "stamp", lambda package: real(package) + (" upgraded" if package == "torch" else ""))
    assert arch_cache.read_arch(text) is None  # another torch: not the kept one, built again


def test_plan_of_a_known_config_imports_neither_torch_nor_datasets_nor_the_store(
    data_home: Path, tmp_path: Path
) -> None:
    """`tunedeck plan` on a config.json folder: after the first plan of this config on this install, the
    architecture and transformers' model types are read back, and nothing heavy is imported (the 2 s target)."""
    import subprocess
    import sys

    from jobs.memory.model_config import arch_for
    from jobs.models.library import known_model_types

    folder = _config_folder(tmp_path / "model", vocab_size=640)  # a config no other test has read in this process
    assert arch_for(str(folder)) is not None and "llama" in known_model_types()  # both kept in data_home
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {folder}\ndataset: sample:chat-format\n")
    code = (
        "import sys\nfrom app.cli.main import main\n"
        f"code = main(['plan', {str(spec)!r}])\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'datasets', 'trl', 'sqlalchemy') if m in sys.modules))\n"
        "sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Will not fit" in done.stdout or "Fits" in done.stdout or "Tight" in done.stdout
    assert "HEAVY []" in done.stdout, done.stdout
