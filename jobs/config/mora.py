"""MoRA: high-rank updating with one square matrix per layer (Jiang et al. 2024, arXiv 2405.12130).

LoRA of rank r trains two thin matrices, A (r x k) and B (d x r), so its update B A has rank <= r.
MoRA spends the same parameter budget on one square matrix M (r^ x r^) with

    r^ = floor(sqrt((k + d) * r))                          (same count: r^2 <= r (k + d))

and wraps it in fixed, parameter-free operators that compress the input to r^ and expand the
output back to d:

    h = W0 x + f_decomp(M f_comp(x))                       (paper, Eq. 3)

so the update can reach rank r^ instead of r (r^ = 64 for r = 8 on a 256 x 256 layer). M starts at
zero, so training starts from the base model, like LoRA's B = 0. The paper uses two operators:

- ``sharing`` (Eq. 6, for large ranks): consecutive groups of input features are summed, and
  each output feature copies the value of its group:
      f_comp(x) = [sum_{j in g_1} x_j, ..., sum_{j in g_r^} x_j],   g_i = {j : floor(j r^ / k) = i}
      f_decomp(y) = [y_{g'_1}, ..., y_{g'_d}],                     g'_l = floor(l r^ / d)
  hence  dW[l, j] = M[g'_l, g_j].
- ``rope`` (Eq. 9, for small ranks): the input is cut into n = ceil(k / r^) chunks x_1..x_n of size
  r^ (the last one zero-padded) and chunk i is rotated by a RoPE rotation R_i (angle i * theta_p on
  the p-th pair, theta_p = 10000^(-2p / r^)) before M, so that chunks stay distinguishable:
      dW = diag(M R_1, M R_2, ..., M R_n)        (truncated, or tiled, to d rows)
  which is of rank up to min(d, k) rather than r^.

Both operators are linear, so dW is an ordinary d x k matrix and merges into W0 (`merge_and_unload`).
MoRA has no alpha scaling (the paper drops it; `lora_alpha` is ignored).

The method plugs into peft 0.21 as a LoRA *variant* on a custom LoRA layer (`MoraLinear`,
registered through `LoraConfig._register_custom_module`): peft's own code saves, loads, merges,
and the trl trainers see an ordinary `PeftModel`. The saved adapter is a LoRA adapter whose
`adapter_config.json` carries `use_mora` and `mora_type`; it loads with this module importable:

    from jobs.config.mora import MoraConfig, load_mora
    model = load_mora(base_model, "path/to/adapter")   # PeftModel.from_pretrained with MoraConfig
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from peft import LoraConfig
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import LoraLayer, LoraVariant
from torch import nn

MORA_TYPES = ("rope", "sharing")


def mora_rank(in_features: int, out_features: int, r: int, mora_type: str = "rope") -> int:
    """r^ = floor(sqrt((k + d) r)); even for the RoPE operator (it rotates pairs)."""
    rank = math.isqrt((in_features + out_features) * r)
    return rank - rank % 2 if mora_type == "rope" else rank


# ---------------------------------------------------------------------- the operators
@functools.lru_cache(maxsize=256)  # constants per layer shape: built once, not every forward
def _groups(features: int, rank: int, device: torch.device) -> torch.Tensor:
    """Eq. 6's grouping: feature j belongs to group floor(j * r^ / features)."""
    with torch.inference_mode(False):  # cached: must stay usable by autograd after a generate()
        return torch.arange(features, device=device) * rank // features


@functools.lru_cache(maxsize=256)
def _rotation(chunks: int, rank: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (chunks x r^) of RoPE angles i * theta_p for chunk i, rotate-half layout."""
    with torch.inference_mode(False):
        theta = 10000.0 ** (-torch.arange(0, rank, 2, device=device, dtype=torch.float32) / rank)
        angles = torch.outer(torch.arange(chunks, device=device, dtype=torch.float32), theta)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


@functools.lru_cache(maxsize=256)
def _tiling(out_features: int, width: int, device: torch.device) -> torch.Tensor:
    """Output l reads entry l mod width: truncates a longer vector, repeats a shorter one."""
    with torch.inference_mode(False):
        return torch.arange(out_features, device=device) % width


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_i x_i for every chunk i: x cos + rotate_half(x) sin (the RoPE identity)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def mora_delta_x(x: torch.Tensor, matrix: torch.Tensor, out_features: int, mora_type: str) -> torch.Tensor:
    """f_decomp(M f_comp(x)) for inputs x (..., k); `matrix` is M (r^ x r^)."""
    rank, k = matrix.shape[0], x.shape[-1]
    if mora_type == "sharing":
        compressed = x.new_zeros(*x.shape[:-1], rank).index_add_(-1, _groups(k, rank, x.device), x)
        return (compressed @ matrix.T).index_select(-1, _groups(out_features, rank, x.device))
    chunks = -(-k // rank)
    padded = nn.functional.pad(x, (0, chunks * rank - k)).view(*x.shape[:-1], chunks, rank)
    cos, sin = _rotation(chunks, rank, x.device, x.dtype)
    out = (_rotate(padded, cos, sin) @ matrix.T).reshape(*x.shape[:-1], chunks * rank)
    return out.index_select(-1, _tiling(out_features, chunks * rank, x.device))


def mora_delta_weight(matrix: torch.Tensor, in_features: int, out_features: int, mora_type: str) -> torch.Tensor:
    """The update as a d x k matrix, so that mora_delta_x(x) == x @ dW.T (what merging adds to W0)."""
    rank = matrix.shape[0]
    if mora_type == "sharing":
        rows, cols = _groups(out_features, rank, matrix.device), _groups(in_features, rank, matrix.device)
        return matrix.index_select(0, rows).index_select(1, cols)
    chunks = -(-in_features // rank)
    cos, sin = _rotation(chunks, rank, matrix.device, matrix.dtype)
    # M R_i: R_i as a matrix is the rotation applied to the identity's rows (x R^T convention).
    eye = torch.eye(rank, device=matrix.device, dtype=matrix.dtype)
    blocks = [matrix @ _rotate(eye, cos[i], sin[i]).T for i in range(chunks)]
    wide = torch.block_diag(*blocks)[:, :in_features]
    return wide.index_select(0, _tiling(out_features, chunks * rank, matrix.device))


# ---------------------------------------------------------------------- peft integration
def _mora_layer(module: LoraLayer) -> MoraLinear:
    """The layer a MoraVariant method is called on: always a MoraLinear, the only layer listing the variant."""
    assert isinstance(module, MoraLinear), f"MoRA runs on MoraLinear layers, not {type(module).__name__}"
    return module


def _features(layer: MoraLinear) -> tuple[int, int]:
    """(k, d) of the layer; peft reads both from the nn.Linear or Conv1D base before any variant runs."""
    k, d = layer.in_features, layer.out_features
    assert k is not None and d is not None, "peft found no in/out features on a MoRA layer's base"
    return k, d


def _a_weight(layer: MoraLinear, adapter: str) -> torch.Tensor:
    """The weight in `lora_A`: peft's nn.Linear A before `MoraVariant.init`, MoRA's square M (r^ x r^) after."""
    linear = layer.lora_A[adapter]
    assert isinstance(linear, nn.Linear), f"lora_A[{adapter!r}] is a {type(linear).__name__}, not nn.Linear"
    return linear.weight


class MoraVariant(LoraVariant):
    """The LoRA variant that swaps A/B for MoRA's square matrix (kept in `lora_A`, B unused)."""

    def supports_lora_conversion(self) -> bool:
        return False  # a high-rank update has no exact rank-r LoRA form

    @staticmethod
    def init(module: LoraLayer, adapter_name: str, config: LoraConfig | None = None, **kwargs: Any) -> None:
        layer = _mora_layer(module)
        mora_type = getattr(config, "mora_type", "rope")
        if mora_type not in MORA_TYPES:
            raise ValueError(f"mora_type must be one of {MORA_TYPES}, got {mora_type!r}")
        rank = mora_rank(*_features(layer), layer.r[adapter_name], mora_type)
        old = _a_weight(layer, adapter_name)
        square = nn.Linear(rank, rank, bias=False, device=old.device, dtype=old.dtype)
        nn.init.zeros_(square.weight)  # dW = 0 at the start, as in the paper
        layer.lora_A[adapter_name] = square
        layer.lora_B[adapter_name] = nn.Identity()  # no parameters; peft's loops still find a key
        layer.mora_type = {**getattr(layer, "mora_type", {}), adapter_name: mora_type}

    @staticmethod
    def _delta(layer: MoraLinear, adapter: str) -> torch.Tensor:
        weight = _a_weight(layer, adapter)
        compute = weight.float() if weight.device.type == "cpu" and weight.dtype != torch.float32 else weight
        delta = mora_delta_weight(compute, *_features(layer), layer.mora_type[adapter])
        return delta.T if layer.fan_in_fan_out else delta

    @staticmethod
    def merge_safe(module: LoraLayer, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return orig_weight + MoraVariant._delta(_mora_layer(module), active_adapter).to(orig_weight.dtype)

    @staticmethod
    def merge_unsafe(module: LoraLayer, active_adapter: str, orig_weight: torch.Tensor) -> None:
        orig_weight.data += MoraVariant._delta(_mora_layer(module), active_adapter).to(orig_weight.dtype)

    @staticmethod
    def unmerge(module: LoraLayer, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return orig_weight - MoraVariant._delta(_mora_layer(module), active_adapter).to(orig_weight.dtype)

    @staticmethod
    def forward(
        module: LoraLayer, active_adapter: str, x: torch.Tensor, result: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        layer = _mora_layer(module)
        x = layer.lora_dropout[active_adapter](x)
        matrix = _a_weight(layer, active_adapter)
        delta = mora_delta_x(x.to(matrix.dtype), matrix, _features(layer)[1], layer.mora_type[active_adapter])
        return result + delta.to(result.dtype)


class MoraLinear(LoraLinear):
    """peft's LoRA Linear layer that also knows the MoRA variant (torch Linear, or GPT-2's Conv1D)."""

    mora_type: dict[str, str]  # adapter name -> one of MORA_TYPES; set by MoraVariant.init

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: Any, **kwargs: Any) -> None:
        super().__init__(base_layer, adapter_name, config=config, **kwargs)
        # Conv1D stores its weight as (in, out): merging must add dW transposed (peft's fan_in_fan_out).
        self.fan_in_fan_out = not isinstance(self.get_base_layer(), nn.Linear)

    @property
    def lora_variants(self) -> dict[tuple[str, ...], type[LoraVariant]]:
        return {**super().lora_variants, ("use_mora",): MoraVariant}


@dataclass
class MoraConfig(LoraConfig):
    """A LoraConfig with MoRA switched on; `r` is the LoRA rank whose parameter budget MoRA uses."""

    use_mora: bool = field(
        default=True, metadata={"help": "Use MoRA's square matrix instead of A and B.", "is_lora_variant": True}
    )
    mora_type: str = field(
        default="rope", metadata={"help": "rope (Eq. 9, small ranks) or sharing (Eq. 6, large ranks)."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mora_type not in MORA_TYPES:
            raise ValueError(f"mora_type must be one of {MORA_TYPES}, got {self.mora_type!r}")
        from transformers.pytorch_utils import Conv1D

        self._register_custom_module({nn.Linear: MoraLinear, Conv1D: MoraLinear})

    @classmethod
    def from_peft_type(cls, **kwargs: Any) -> MoraConfig:
        """Keep this class when loading (peft would pick LoraConfig from peft_type LORA)."""
        return cls(**kwargs)


def load_mora(base_model: Any, path: str, **kwargs: Any) -> Any:
    """A saved MoRA adapter on `base_model`: peft's PeftModel.from_pretrained with the MoraConfig."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model, path, config=MoraConfig.from_pretrained(path), **kwargs)
