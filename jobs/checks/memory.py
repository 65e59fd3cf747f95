"""The memory step of the checks: the predicted peak of a spec on the device it will meet.

The model's architecture is read once (`jobs.memory.model_config.arch_with_source`: its config,
never its weights) and the prediction made once (`jobs.memory.predict.predict`); the pipeline keeps
both for the later steps (the method checks read the layer shapes, submit saves the prediction) and
the form's panel and `tunedeck plan` show the same object. No error is swallowed here: a predictor
bug fails the check instead of becoming "no prediction".

    memory = predict_memory(spec, facts, lengths=row_lengths)   # Memory(prediction or None, arch or None, source)
    memory.prediction.total_bytes          # the data's own figure (its worst micro-batch), when lengths are known
    memory.prediction.worst_case_bytes     # the bound: every row max_length tokens long

The data figure decides the verdict; the worst case stays next to it as the bound any data up to
max_length could reach.

The verdict as a problem, and the cheapest change that fits, are the pipeline's
(`jobs.checks.pipeline.memory_problem`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from jobs.devices.facts import DeviceFacts
from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.data.tokens.lengths import RowLengths
    from jobs.memory.breakdown import Prediction
    from jobs.memory.parts import Arch
    from storage.records import RunRecord
    from storage.roles import ArtifactReader, RunLister, RunReader


@dataclass(frozen=True)
class Memory:
    """The memory facts of one spec on one device."""

    prediction: Prediction | None  # None: no readable config.json for the model here
    arch: Arch | None
    source: str  # where the architecture came from ("" when unknown)
    lengths: RowLengths | None = None  # the training rows' token lengths, when measured

    @property
    def shape(self) -> Any:
        """The model's layer shapes (`jobs.memory.shape.ModelShape`), or None."""
        return self.arch.shape if self.arch is not None else None


NO_MEMORY = Memory(None, None, "")


def model_arch(model: str) -> tuple[Any, str]:
    """(the model's Arch, where its config came from), or (None, "")."""
    from jobs.memory.model_config import arch_with_source

    return arch_with_source(model)


def measured_lengths(spec: JobSpec, tokenizer: Callable[[], Any] | None = None) -> RowLengths | None:
    """The training rows' token lengths (`jobs.data.tokens.measurement`, cached per data, tokenizer and trainer); None
    when the model's tokenizer is not on this machine or the data does not load (the data check names why)."""
    from jobs.data.loading import load_data
    from jobs.data.sources import DataError
    from jobs.data.tokens.measurement import cached_lengths, measure, save_lengths
    from jobs.models.tokenizer import local_tokenizer, tokenizer_folder

    folder = tokenizer_folder(spec.model)
    found = cached_lengths(spec, folder)
    if found is not None:
        return found
    tok = tokenizer() if tokenizer is not None else local_tokenizer(spec.model)
    if tok is None:
        return None
    try:
        loaded = load_data(spec)
    except DataError:
        return None
    lengths = measure(loaded.train, tok, spec.trainer, loaded.origins)  # origins: the answers step names rows
    if loaded.train_info.images.count:  # image rows: each image's tokens in place of its placeholder
        from jobs.memory.vision import with_image_tokens

        lengths = with_image_tokens(lengths, loaded, spec.model, (spec.image_min_pixels, spec.image_max_pixels))
    save_lengths(spec, folder, lengths)
    return lengths


def predict_memory(
    spec: JobSpec,
    facts: DeviceFacts,
    arch: tuple[Any, str] | None = None,
    lengths: RowLengths | None = None,
    reward_arch: Arch | None = None,
    judge_archs: Mapping[str, Arch] | None = None,
) -> Memory:
    """The spec's predicted peak on `facts`, for the rows in `lengths` when measured (with the worst case
    kept next to it); `arch`: the model's (Arch, source) when already read; `reward_arch`: a grpo
    reward_model_run's model (`reward_model_arch`; None: the policy's shape stands in for it); `judge_archs`: its
    judge rewards' local models (`judge_reward_archs`)."""
    from jobs.memory.predict import predict

    found, source = arch if arch is not None else model_arch(spec.model)
    if found is None:
        return NO_MEMORY
    worst = predict(spec, found, facts, reward_arch=reward_arch, judge_archs=judge_archs)
    if lengths is None or not lengths.rows:
        return Memory(worst, found, source)
    data = predict(spec, found, facts, lengths, reward_arch=reward_arch, judge_archs=judge_archs)
    data = replace(data, worst_case_bytes=worst.total_bytes)
    return Memory(data, found, source, lengths)


def reward_model_arch(store: RunReader | None, spec: JobSpec) -> Arch | None:
    """The shape of a grpo spec's reward_model_run's model, whose weights stay loaded beside the policy (None: no
    reward run, none in `store`, or its model's config is not readable here)."""
    from jobs.spec.trainer_records import record_for

    if store is None or spec.reward_model_run is None or not record_for(spec.trainer).generates:
        return None
    run = store.get_run(spec.reward_model_run)
    if run is None:
        return None
    from jobs.spec.stored import spec_of

    found, _ = model_arch(spec_of(run).model)
    return found


def judge_reward_archs(store: ArtifactReader | None, spec: JobSpec) -> dict[str, Arch]:
    """The shapes of a grpo spec's judge rewards' local judge models by reference, read from their configs without
    their weights (`run:N`: its base's, which its adapter does not change; needs `store`); one not readable here is
    left out (the policy's shape stands in)."""
    from jobs.spec.trainer_records import record_for

    out: dict[str, Arch] = {}
    if not record_for(spec.trainer).generates:
        return out
    for ref in dict.fromkeys(r.local_judge for r in spec.declared_rewards if r.local_judge):
        assert ref is not None
        model: str | None = ref
        if ref.lower().startswith("run:"):
            run = store.get_run(int(ref[4:])) if store is not None else None
            from jobs.spec.stored import spec_of

            model = spec_of(run).model if run is not None else None
        found = model_arch(model)[0] if model else None
        if found is not None:
            out[ref] = found
    return out


def taken_memory_warning(prediction: Any, facts: DeviceFacts, store: RunLister | None = None) -> str | None:
    """At submit: a warning when other processes hold so much of the target GPU now that the run would
    not fit beside them (it is queued and waits; the claim judges again, `jobs.worker.fit`). Only a GPU of
    this host can be read (NVML); tunedeck's own running runs there are not counted as others."""
    import socket

    from jobs.devices.room import own_pids, read_room
    from jobs.units import human_bytes

    if prediction is None or not facts.cuda or (facts.host and facts.host != socket.gethostname()):
        return None
    room = read_room(facts.index or 0)
    if room is None:
        return None
    ours = own_pids(r.child_pid for r in _running(store) if r.child_pid)
    needed, available = int(prediction.total_bytes), room.available(ours)
    if needed <= available or needed > facts.total_bytes:
        return None  # fits now, or will not fit at all (the verdict says so)
    others = room.others_text(ours)
    return (
        f"other processes hold {human_bytes(facts.total_bytes - available)} of {facts.name} now"
        f"{f' ({others})' if others else ''}: {human_bytes(needed)} needed, {human_bytes(available)} free; "
        "the run stays queued until they release it"
    )


def _running(store: RunLister | None) -> list[RunRecord]:
    if store is None:
        return []
    from storage.models import RunStatus

    return list(store.list_runs(RunStatus.RUNNING))
