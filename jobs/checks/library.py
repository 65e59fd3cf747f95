"""The libraries' own verdict at submit: peft places the adapters and the model runs a step, on no memory.

The model is built from its config.json on torch's meta device (no weights), the expert keys trl reads are
filled as training fills them (`jobs.models.expert_keys`), peft wraps it with the spec's own config
(`jobs.config.peft.peft_config`, so its refusals of a module, such as a Mamba `out_proj` or fused experts,
come before queueing), and one micro-batch of the spec's `max_length` tokens runs forward and backward
under torch's FakeTensorMode (shapes only, nothing computed; transformers treats fake tensors as tracing, so
its data-dependent checks step aside). Only the decoder layers up to the last layer of a kind not seen before
run (a 61-layer model whose first three are dense runs four), so the cost does not grow with depth. A shape
transformers cannot run (attention heads that disagree) fails there with the library's message.

What cannot run this way (4-bit weights, a vision-language model, a kernel without a meta implementation) is
skipped with a note saying so; no error of this check is swallowed silently: each is a problem or a note.

    problems, notes = library_problems(spec)     # [Problem("lora_target_modules", ...)], ["... skipped: ..."]
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import LORA_FAMILY, Method
from jobs.spec.job import JobSpec

# Messages of errors that say the meta device or fake tensors cannot run an operation (not that the model is
# wrong): the forward is then skipped, with a note.
UNRUNNABLE = re.compile(
    r"meta tensor|on meta|fake|data.dependent|Expected inputs of BF16|unsupported scalarType|"
    r"metadata mutating|non-Fake|not implemented|unbacked|symbolic|_local_scalar_dense",
    re.IGNORECASE,
)


def library_problems(spec: JobSpec) -> tuple[list[Problem], list[str]]:
    """peft's and transformers' refusals of the spec's model and method, as problems; notes for what was skipped.
    Kept per config.json and spec in this process (a sweep checks many variants of one spec)."""
    from jobs.memory.model_config import model_config

    config, _ = model_config(spec.model)
    if config is None or not isinstance(config.get("model_type"), str):
        return [], []  # no config.json here: the model check says why
    problems, notes = _library_verdict(json.dumps(config, sort_keys=True), spec)
    return list(problems), list(notes)


@functools.lru_cache(maxsize=32)
def _library_verdict(config_text: str, spec: JobSpec) -> tuple[tuple[Problem, ...], tuple[str, ...]]:
    problems, notes = _verdict(json.loads(config_text), spec)
    return tuple(problems), tuple(notes)


def _verdict(config: dict[str, Any], spec: JobSpec) -> tuple[list[Problem], list[str]]:
    if isinstance(config.get("vision_config"), dict):
        return [], ["the meta-device check of adapters and one step was skipped: vision-language models are not built"]
    model, why = _meta_model(config)
    if model is None:
        return ([why] if isinstance(why, Problem) else []), ([why] if isinstance(why, str) else [])
    model, refused = _adapted(spec, model)
    if refused is not None:
        return [refused], []
    if spec.method in {Method.QLORA, Method.LORA_8BIT}:
        note = "the one-step check ran without quantization (4/8-bit weights need the device)"
        return _step_problems(spec, model, [note])
    return _step_problems(spec, model, [])


def _meta_model(config: dict[str, Any]) -> tuple[Any, Problem | str | None]:
    """(the causal LM built on the meta device, None), or (None, the problem or the note saying why not)."""
    from jobs.memory.shape import meta_causal_lm, transformers_config
    from jobs.models.expert_keys import fill_expert_keys
    from jobs.models.moe_layout import moe_layout

    try:
        built = transformers_config(config)
    except (ValueError, TypeError) as exc:  # the config's own validation (huggingface_hub's strict dataclasses)
        return None, Problem("model", f"transformers refuses this config.json: {_said(exc)}", _CONFIG_FIX)
    if built is None:
        return None, None  # not a causal LM transformers knows: the prediction says "no readable config"
    try:
        model = meta_causal_lm(built)
    except (ValueError, TypeError, RuntimeError, AttributeError, KeyError, IndexError) as exc:
        return None, Problem("model", f"transformers cannot build this model: {_said(exc)}", _CONFIG_FIX)
    layout = moe_layout(model, built.get_text_config())
    fill_expert_keys(model, layout)
    if layout is not None:  # the fused experts' batched matmul: static shapes (grouped_mm's meta kernel wants bf16)
        model.set_experts_implementation("batched_mm")
    return model, None


def _adapted(spec: JobSpec, model: Any) -> tuple[Any, Problem | None]:
    """(the model with the spec's adapters, None), or (the model, peft's refusal of the spec's adapter config on
    the model's real module tree, as a problem naming the field)."""
    from jobs.config.peft import peft_config
    from jobs.models.moe_layout import moe_layout

    if spec.method is Method.FULL:
        return model, None
    text = model.config.get_text_config()
    config = peft_config(spec, str(model.config.model_type), moe_layout(model, text))
    if config is None:
        return model, None
    from peft import get_peft_model

    try:
        return get_peft_model(model, config), None
    except (ValueError, TypeError, RuntimeError, KeyError, AttributeError, NotImplementedError) as exc:
        return model, _peft_refusal(spec, exc)


def _peft_refusal(spec: JobSpec, exc: BaseException) -> Problem:
    said = _said(exc)
    if spec.method in LORA_FAMILY:
        names = sorted(set(re.findall(r"'([A-Za-z_][\w.]*)'", said)) - {"model_type"})
        listed = f" (peft names {', '.join(names)})" if names else ""
        return Problem(
            "lora_target_modules",
            f"peft refuses the adapters {spec.lora_target_modules!r} on this model: {said}",
            f"list the layers to adapt without the ones peft refuses{listed}, e.g. lora_target_modules: "
            "q_proj,k_proj,v_proj,o_proj (the model's linear names: `tunedeck plan` lists them)",
        )
    return Problem(
        "method",
        f"peft refuses method {spec.method.value} on this model: {said}",
        "pick another method (lora works on every linear layer peft accepts)",
    )


def _step_problems(spec: JobSpec, model: Any, notes: list[str]) -> tuple[list[Problem], list[str]]:
    """One micro-batch forward and backward of `spec.max_length` tokens under FakeTensorMode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    _keep_one_layer_of_each_kind(model)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            _to_fake(model)
            ids = torch.zeros(1, spec.max_length, dtype=torch.long)
            out = model(input_ids=ids, labels=ids, use_cache=False)
            out.loss.backward()
    except Exception as exc:  # noqa: BLE001 - each is a problem or a note, said below
        said = _said(exc)
        if "_local_scalar_dense" in said:
            said = "the method reads a tensor's value back, which a run of shapes alone cannot"
        if _unrunnable(exc) or UNRUNNABLE.search(said):
            return [], [*notes, f"the one-step check on the meta device was skipped: it cannot run here ({said})"]
        if not isinstance(exc, (RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError)):
            raise
        return [
            Problem(
                "model",
                f"transformers cannot run one training step of this model at max_length {spec.max_length}: {said}",
                _CONFIG_FIX,
            )
        ], notes
    return [], notes


def _to_fake(model: Any) -> None:
    """The model's meta parameters and buffers as fake CPU tensors (call inside FakeTensorMode: no memory is taken):
    the step then takes the paths a CPU run takes (peft's expert wrapper asks autocast about its weights' device,
    which the meta device has no answer for)."""
    import torch

    def fake(t: Any) -> Any:
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")

    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[name] = torch.nn.Parameter(fake(param), requires_grad=param.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = fake(buffer)


def _unrunnable(exc: BaseException) -> bool:
    """Whether fake tensors cannot run what raised `exc` (a value read back: LoKr's and LoHa's `.item()`, an
    operator without a meta kernel), rather than the model being wrong."""
    from torch._subclasses import fake_tensor

    fake_limits = (
        fake_tensor.DataDependentOutputException,
        fake_tensor.DynamicOutputShapeException,
        fake_tensor.UnsupportedOperatorException,
    )
    return isinstance(exc, (NotImplementedError, *fake_limits)) or isinstance(exc.__cause__, fake_limits)


def _keep_one_layer_of_each_kind(model: Any) -> None:
    """Cut the decoder's layer list after the last layer of a kind (its parameters' names and shapes) not seen
    before: the shapes a step meets are the same, the cost no longer grows with depth."""
    import torch

    count = int(getattr(model.config.get_text_config(), "num_hidden_layers", 0) or 0)
    for module in model.modules():
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.ModuleList) and len(child) == count > 1:
                seen: set[Any] = set()
                last = 0
                for i, layer in enumerate(child):
                    kind = (type(layer).__name__, tuple((n, tuple(p.shape)) for n, p in layer.named_parameters()))
                    if kind not in seen:
                        seen.add(kind)
                        last = i
                setattr(module, name, torch.nn.ModuleList(list(child)[: last + 1]))
                return


def _said(exc: BaseException) -> str:
    """The library's own message, first line, without peft's `[PEFT:...]` prefix, at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[PEFT:[^\]]*\]\s*", "", text)
    return text[:300]


_CONFIG_FIX = (
    "correct the model's config.json (its shape fields must agree: heads x head_dim, hidden_size, the expert and "
    "state-space sizes) or pick a model transformers loads; nothing was queued"
)
