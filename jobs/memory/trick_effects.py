"""What the newer memory tricks change in a prediction, as named parts (docs/memory.md "The memory tricks").

The tricks themselves live in `jobs.spec.tricks` (one module each); this is the part of the prediction that
needs the model's architecture, which the tricks' package (below `jobs.memory`) cannot see.

`jobs.memory.predict.predict` computes the figures of a plain step and hands them here once
(`trick_effects`); each trick changes the figures it touches and says so in their formulas:

- GaLore / APOLLO: the optimizer state of the targeted linears at `optim_rank`, from the projection's
  shapes (galore-torch / apollo-torch keep two moments on the projected gradient and the projection);
  layer-wise variants step each weight in the backward pass, so no step holds every gradient at once.
- activation offloading (CUDA): the saved activations but about two layers' worth move from the
  device's figure to a host figure the worker's RAM must hold (`host_bytes`).
- the CPU allocator: without `cpu_return_freed_memory`, glibc's heap keeps freed activation-sized blocks
  resident (the `overhead` part on the CPU: the holes between saved activations, and with checkpointing the
  recomputed block beside the head's tiles); with it, nothing.
- Liger kernels and torch.compile: their savings are not modelled (labelled in the notes, not guessed: each
  trick's `memory_note`, which `jobs.memory.predict` adds after these);
  trl's own fused LM head already never materialises the logits. NEFTune and LoRA+ change no memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from jobs.memory.parts import Arch, adam8bit_state_bytes
from jobs.spec.enums import APOLLO_OPTIMS, LAYERWISE_OPTIMS, LOW_RANK_OPTIMS, Optim
from jobs.spec.job import JobSpec

# Offloaded activations: trl's context keeps a few tensors waiting on its side stream and brings each
# layer's back one layer ahead of its backward, so about this many layers' worth stay on the device.
OFFLOAD_DEVICE_LAYERS = 2
# glibc's heap on the CPU (its default, dynamic mmap threshold): blocks under the threshold, which rises to at most
# 32 MiB after the first large free, come from the heap, and a freed one stays resident. Read per phase with
# glibc's own counters (mallinfo2: the heap's size against its bytes in use; bench/heap_phases.py) through real
# LoRA steps, the forward's freed temporaries stranded between the blocks it saves leave the heap 0.38-0.82x
# the saved activations larger than its bytes in use at the peak (SmolLM2 8 x 43 tokens 0.38-0.46, a 4-layer
# Llama 8 x 500 0.58, 8 x 256 0.77-0.82): taken as 0.5. It is the one measured constant here: no formula derives glibc's
# fragmentation from the op sequence yet.
GLIBC_HOLES = 0.5
GLIBC_MMAP_MAX = 32 * 2**20  # glibc's dynamic mmap threshold stops here: larger blocks are always returned
HEAD_TEMPORARIES = 9  # the LM head's part is about this many tile-sized buffers (jobs.memory.parts.head_bytes)


@dataclass(frozen=True)
class Figures:
    """The parts of one step that the tricks change (bytes, and the formulas shown with them)."""

    grads: float
    opt_state: float
    opt_temp: float
    of: str  # the optimizer part's formula
    acts: float
    actf: str
    logits: float
    per_layer: float  # the saved activations of one layer (what offloading moves per layer)
    largest_activation: float  # bytes of the biggest single activation tensor (tokens x intermediate x elem)
    recompute_absorbed: float = 0.0  # checkpointing: the recomputed block's bytes the head's transient absorbs
    forward_freed: float = 0.0  # checkpointing: what the no-grad forward frees (a plain forward's saved bytes)


@dataclass(frozen=True)
class TrickEffect:
    figures: Figures
    host_bytes: float = 0.0  # moved to the host's RAM (activation offloading)
    heap_bytes: float = 0.0  # CPU: freed blocks glibc's heap keeps resident
    heap_formula: str = ""
    notes: tuple[str, ...] = ()


def trick_effects(spec: JobSpec, arch: Arch, cuda: bool, rss: bool, fig: Figures) -> TrickEffect:
    """The figures with the spec's tricks applied, and what they add elsewhere (host memory, heap, notes)."""
    notes: list[str] = []
    host = heap = 0.0
    heap_f = ""
    if spec.optim in LOW_RANK_OPTIMS:
        fig = _low_rank(spec, arch, fig)
    if spec.activation_offloading and cuda:
        keep = min(arch.layers, OFFLOAD_DEVICE_LAYERS)
        host = max(0.0, (arch.layers - keep) * fig.per_layer)
        fig = replace(
            fig,
            acts=fig.acts - host,
            actf=fig.actf + f" - {arch.layers - keep} layers' saved activations offloaded to host memory",
        )
        notes.append(f"activation offloading: {host / 2**30:.2f} GiB of activations in the worker's host RAM")
    if rss and not cuda and not spec.cpu_return_freed_memory:
        heap, heap_f = _glibc_heap(fig)
    return TrickEffect(fig, host, heap, heap_f, tuple(notes))


def _glibc_heap(fig: Figures) -> tuple[float, str]:
    """What glibc's heap keeps resident beyond the live tensors at the peak (docs/memory.md "The memory tricks").

    - the holes: freed temporaries stranded between the saved activations (GLIBC_HOLES x those bytes);
    - with checkpointing, the no-grad forward frees every block's temporaries (what a plain forward would
      have saved) under the block's output, the next saved input, allocated after them: the same holes, on
      those bytes (GLIBC_HOLES x `forward_freed`);
    - with checkpointing, the recomputed block: its blocks, freed in the previous step's backward, stay in the
      heap while the head's tiles peak, so the two transients add up instead of the larger one counting (the
      allocated figure's rule) whenever a tile is larger than the largest activation block: a tile then fits
      in none of the freed blocks, whether it is mmapped (over 32 MiB) or taken from the heap's top.
    Measured (bench/heap_phases.py --checkpointing --batch 1 --length 505, the grid's small model, 2026-12-05):
    before the second step's head the heap held 59 MiB free beside 201 MiB in use (these terms: 54 MiB; before
    this, 1.5), and the head's 16 MiB tiles grew the heap by 150 MiB on top of it, reusing none.
    The LM head's own temporaries are not counted again: they are alive at the peak they would add to."""
    if fig.largest_activation >= GLIBC_MMAP_MAX:
        return 0.0, "CPU allocator (glibc): the activation blocks are over its 32 MiB mmap limit (returned when freed)"
    tile = fig.logits / HEAD_TEMPORARIES
    recompute = fig.recompute_absorbed if tile > fig.largest_activation else 0.0
    heap = GLIBC_HOLES * (fig.acts + fig.forward_freed + recompute) + recompute
    formula = f"CPU allocator (glibc): freed temporaries between the saved activations x{GLIBC_HOLES:g}"
    if fig.forward_freed:
        formula += " + the checkpointed forward's freed block temporaries (holes)"
    if recompute:
        formula += " + the recomputed block (and its holes), resident beside the head's tiles"
    return heap, formula + " (cpu_return_freed_memory: true returns them)"


def low_rank_targets(spec: JobSpec, arch: Arch) -> list[tuple[int, int]]:
    """(out, in) of every linear weight whose state GaLore/APOLLO keep at low rank (transformers' matching:
    all-linear, a comma list of module names, or a regex; the untied LM head is a linear too)."""
    text = spec.optim_target_modules.strip()
    everything = text.replace("_", "-") == "all-linear"
    names = [n.strip() for n in text.split(",") if n.strip()]

    def picked(name: str) -> bool:
        if everything:
            return True
        if len(names) > 1:
            return name in names
        return name == text or re.fullmatch(text, name) is not None

    shapes = [(lin.out_features, lin.in_features) for lin in arch.block_linears if picked(lin.name)] * arch.layers
    if arch.head_params and picked("lm_head"):
        shapes.append((arch.vocab, arch.hidden))
    return shapes


def _low_rank(spec: JobSpec, arch: Arch, fig: Figures) -> Figures:
    """GaLore/APOLLO state: per targeted m x n weight, two moments of max(m,n) x r and the r x min(m,n)
    projection (r <= min(m,n) for GaLore's SVD; APOLLO's random projection takes r as given)."""
    targets = low_rank_targets(spec, arch)
    eight_bit = spec.optim in (Optim.GALORE_ADAMW_8BIT, Optim.GALORE_ADAMW_8BIT_LAYERWISE)
    galore = spec.optim not in APOLLO_OPTIMS
    state = 0.0
    projected: list[int] = []
    for m, n in targets:
        r = min(spec.optim_rank, m, n) if galore else spec.optim_rank
        projected.append(max(m, n) * r)
        state += 4.0 * min(m, n) * r  # the projection, fp32 (the weights' dtype in a full fine-tune)
    state += adam8bit_state_bytes(projected) if eight_bit else 8.0 * sum(projected)
    target_params = sum(m * n for m, n in targets)
    rest = arch.total_params - target_params
    state += (2.0 + 8 * 4 / 256) * rest if eight_bit else 8.0 * rest  # full AdamW for everything else
    m, n = max(targets, key=lambda s: s[0] * s[1], default=(0, 0))
    # One weight at a time: its projected gradient, the full-size update projected back, GaLore's SVD.
    temp = 4.0 * (2 * m * n + ((m + n) * min(m, n) if galore else 0))
    kind = "GaLore" if galore else "APOLLO"
    of = (
        f"{kind} rank {spec.optim_rank}: {len(targets):,} targeted linears' moments on max(m,n) x r "
        f"{'(8-bit)' if eight_bit else 'x 8 B'} + projections r x min(m,n) x 4 B; {rest:,} other params "
        f"x {'~2' if eight_bit else '8'} B"
    )
    if spec.optim in LAYERWISE_OPTIMS:
        # Each weight steps inside the backward as its gradient arrives and drops it: no step peak with every
        # gradient alive, and the backward's own peak (at its start, activations all alive) is unchanged
        # (counted: the same peak as galore_adamw on the CPU).
        return replace(fig, grads=0.0, opt_state=state, opt_temp=0.0, of=of + "; layer-wise: stepped in the backward")
    return replace(fig, opt_state=state, opt_temp=temp, of=of)
