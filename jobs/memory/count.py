"""Count the live tensor bytes of real work on the CPU, exactly: the measured side of the predictor.

`LiveBytes` is a `TorchDispatchMode`: every tensor an operator returns whose storage it has not
seen yet adds that storage's bytes, and a `weakref.finalize` on the storage subtracts them when
the storage dies. So `peak` is the most bytes ever alive at once, counted by storage (views and
in-place results are free). Tensors that existed before the mode was entered (weights loaded
from safetensors, quantization constants) are invisible to it: hand them over with `track()`.

    with LiveBytes() as counter:
        counter.track_module(model)           # the weights loaded outside
        loss = model(**batch).loss; loss.backward()
    counter.peak, counter.live

`LiveBytes(trace=True)` also keeps, at each new peak, the largest live storages with the operator
that made each one (slow; for finding which formula of `jobs.memory.parts` is off).

torch's own `MemTracker` registers hooks on frozen parameters and fails with peft, and fake
tensors cannot be moved by peft, so real (small) tensors are counted instead (see docs/memory.md).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class LiveBytes(TorchDispatchMode):
    """Live and peak bytes of every tensor storage created (or handed over) while the mode is on."""

    def __init__(self, trace: bool = False) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._trace = trace
        self._labels: dict[int, tuple[str, int]] = {}  # with trace: id -> (what made it, bytes)
        self.at_peak: list[tuple[str, int]] = []  # with trace: the largest live storages at the peak
        self._next = 0
        self._label = "before"

    def _free(self, nbytes: int, key: int) -> None:
        self.live -= nbytes
        self._labels.pop(key, None)

    def track(self, tensor: Any) -> None:
        """Count a tensor's storage once, until it is freed."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):  # sparse or otherwise storage-less tensors
            return
        if storage in self._seen:
            return
        nbytes = int(storage.nbytes())
        self._seen[storage] = nbytes
        if nbytes == 0:
            return
        self.live += nbytes
        self._next += 1
        if self._trace:
            self._labels[self._next] = (f"{self._label} {tuple(tensor.shape)} {tensor.dtype}", nbytes)
        if self.live > self.peak:
            self.peak = self.live
            if self._trace:
                self.at_peak = sorted(self._labels.values(), key=lambda x: -x[1])[:400]
        weakref.finalize(storage, self._free, nbytes, self._next)

    def track_module(self, module: Any) -> None:
        """Count a module's parameters, buffers and bitsandbytes quantization constants."""
        for tensor in [*module.parameters(), *module.buffers()]:
            self.track(tensor)
            state = getattr(tensor, "quant_state", None)
            for value in _quant_tensors(state):
                self.track(value)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._label = str(func)
        for value in tree_flatten(out)[0]:
            self.track(value)
        return out


def _quant_tensors(state: Any) -> list[Any]:
    """The tensors held by a bitsandbytes QuantState (absmax, code, nested state), if any."""
    if state is None:
        return []
    out = [getattr(state, name, None) for name in ("absmax", "code", "offset")]
    out.extend(_quant_tensors(getattr(state, "state2", None)))
    return [t for t in out if isinstance(t, torch.Tensor)]
