"""glibc's retained heap in a CPU prediction (jobs.memory.trick_effects, docs/memory.md "The memory tricks").

The shapes are bench/memory_runs.py's small model (the grid's packing and checkpointing rows), built on the
meta device from a config: no weights, no training.
"""

from __future__ import annotations

import pytest

from jobs.devices.probe import cpu_facts
from jobs.memory.parts import arch_from_config
from jobs.memory.predict import predict
from jobs.memory.trick_effects import GLIBC_HOLES, GLIBC_MMAP_MAX, HEAD_TEMPORARIES
from jobs.spec.job import JobSpec

SMALL = dict(
    model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=2, vocab_size=8192, tie_word_embeddings=False, max_position_embeddings=8192,
)  # fmt: skip
LORA = dict(method="lora", lora_r=16, lora_alpha=32, lora_target_modules="all-linear", max_length=512)


def S(**fields) -> JobSpec:
    return JobSpec.from_dict({**LORA, **fields})


@pytest.fixture(scope="module")
def small():
    return arch_from_config(dict(SMALL))


@pytest.fixture(scope="module")
def wide_vocab():
    return arch_from_config({**SMALL, "vocab_size": 4 * 8192})


def test_the_heads_own_temporaries_are_not_counted_again_in_the_heap(small, wide_vocab) -> None:
    # packing-on: 2 x 512 tokens, a tile of 1023 x 8192 fp32 (just under 32 MiB: heap blocks). They are alive at
    # the peak they would be added to, so the heap part is the activations' holes alone (measured +28% when the
    # head's bytes were counted a second time), whatever the vocabulary.
    spec = S(per_device_train_batch_size=2)
    p = predict(spec, small, cpu_facts())
    assert 0 < p.part("overhead") < p.part("activations") < p.part("logits")
    wide = predict(spec, wide_vocab, cpu_facts())
    assert wide.part("logits") > 2 * p.part("logits")
    assert wide.part("overhead") == p.part("overhead")
    assert predict(spec.replace(cpu_return_freed_memory=True), small, cpu_facts()).part("overhead") == 0


def test_checkpointing_keeps_the_recomputed_block_resident_beside_the_heads_tiles(small) -> None:
    # ckpt-on-b8: 8 x 512 tokens. The head's tiles (4095 x 8192 fp32, 128 MiB each) are mmapped; the recomputed
    # block's heap blocks, freed in the last step's backward, stay resident beside them: the two add up in the
    # RSS (measured -17% when only the larger counted), though one absorbs the other in the allocated figure.
    ckpt = S(gradient_checkpointing=True)
    no_ckpt = predict(S(gradient_checkpointing=False, cpu_return_freed_memory=True), small, cpu_facts())
    one_block = no_ckpt.part("activations") / small.layers
    glibc = predict(ckpt, small, cpu_facts())
    exact = predict(ckpt.replace(cpu_return_freed_memory=True), small, cpu_facts())
    assert glibc.part("overhead") >= one_block
    assert "recomputed block" in glibc.to_dict()["formulas"]["overhead"]
    allocated = predict(ckpt, small, cpu_facts(), resident=False)
    assert allocated.part("overhead") == 0 and exact.part("overhead") == 0
    assert glibc.total_bytes - exact.total_bytes == glibc.part("overhead")


def test_checkpointing_counts_the_no_grad_forwards_holes_and_the_recomputed_block_beside_heap_tiles(small) -> None:
    # ckpt-on-b1 (issue #49): 1 x 512 tokens, the head's tiles 511 x 8192 fp32 (16 MiB: under 32 MiB, heap blocks,
    # yet larger than any freed activation block). The no-grad forward frees every block's temporaries under the
    # block's output, and the recomputed block's stay from the last step: bench/heap_phases.py --checkpointing
    # --batch 1 --length 505 measured 59 MiB free in the heap before the second step's head, which grew the heap
    # 150 MiB on top of them (predicted 1.5 MiB of holes before: the run measured -15.9% under).
    spec = S(gradient_checkpointing=True, per_device_train_batch_size=1)
    glibc = predict(spec, small, cpu_facts())
    assert glibc.part("logits") / HEAD_TEMPORARIES < GLIBC_MMAP_MAX
    plain = predict(spec.replace(gradient_checkpointing=False, cpu_return_freed_memory=True), small, cpu_facts())
    one_block = plain.part("activations") / small.layers
    assert glibc.part("overhead") >= GLIBC_HOLES * plain.part("activations") + one_block
    assert glibc.part("overhead") == pytest.approx(59 * 2**20, rel=0.25)
    formula = glibc.to_dict()["formulas"]["overhead"]
    assert "checkpointed forward" in formula and "recomputed block" in formula
    exact = predict(spec.replace(cpu_return_freed_memory=True), small, cpu_facts())
    assert exact.part("overhead") == 0 and glibc.total_bytes - exact.total_bytes == glibc.part("overhead")
