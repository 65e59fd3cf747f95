"""A vision-language run's vision tower and projector as llama.cpp's mmproj GGUF, beside its language model's file.

    problem = projector_problem(config)              # None, or why the converter writes no projector for it
    check = write_projector(source, dest, model=lm)  # ProjectorCheck: the file read back, compared with `source`
    pair_command("model-f16.gguf", "model-mmproj-f16.gguf")    # llama-mtmd-cli -m ... --mmproj ...

llama.cpp reads a vision-language model as two files: the language model (written and checked like a text
model's GGUF) and the vision tower with its projector (`convert_hf_to_gguf.py --mmproj`), which llama-mtmd-cli
and llama-server take together (`-m` and `--mmproj`). The projector stays in f16 whatever the language model's
type (llama.cpp's own releases ship their mmproj files so).

The projector file is read back twice. By llama.cpp itself, with the language model file `model` (`lm`):
llama-mtmd-cli loads the pair, encodes the check image and answers the check question, and its first token must
be the merged model's in transformers (`jobs.export.mtmd`); where `./dev.sh gguf` could not build llama-mtmd-cli
the check says so in its `notes` and the file is read by gguf-py alone (the pinned llama-cpp-python binding has
no mtmd library: `./dev.sh`, LLAVA_BUILD=OFF). And by gguf-py's GGUFReader, which holds the file to
the model it was written from: a `clip` mmproj file with a vision encoder and a projector type, the tower's
image size, patch size, width and depth, and each tensor's values equal to one of the source's vision tensors
(compared sorted, so the converter's transposes and head permutations do not matter; f16 rounding allowed),
except the ones the converter knowingly changes (`CORRECTED`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.export.converter import architecture, convert, converter_problem

log = logging.getLogger("jobs.export.merged")

PROJECTOR_TYPE = "f16"
# classes the converter registers for one vision tower only (its LlavaVisionModel raises "Unsupported model
# type" for LLaVA 1.5's CLIP tower): class -> the vision_config model_types it converts
TOWERS = {"LlavaForConditionalGeneration": ("pixtral",)}
# tensors the converter writes changed (Gemma 3's projector norm is stored as 1 + weight, as llama.cpp applies it)
CORRECTED = ("soft_emb_norm",)
LANGUAGE_PARTS = ("language_model.", "text_model.", "lm_head")  # the language model's tensors: not compared
VISION_KEYS = {  # the file's key -> the source's vision_config key
    "clip.vision.image_size": "image_size",
    "clip.vision.patch_size": "patch_size",
    "clip.vision.embedding_length": "hidden_size",
    "clip.vision.block_count": "num_hidden_layers",
}
# language model types whose pair must answer the check image with the merged model's first token (llama-mtmd-cli);
# a quantized one's other first token is recorded, not refused (its own check allows some disagreement)
PAIR_STRICT = ("f16", "q8_0")
READ_BY = "gguf-py's GGUFReader"
READ_BY_PAIR = "gguf-py's GGUFReader and llama.cpp's llama-mtmd-cli (with the language model file, on the check image)"


@dataclass
class ProjectorCheck:
    """The mmproj file read back against the model folder it was written from."""

    file: str
    read_by: str
    projector_type: str
    vision: dict[str, Any]  # the file's image size, patch size, width and depth
    tensors: int
    tensors_equal: int  # of `tensors`: values equal to one of the source's vision tensors
    corrected: list[str]  # tensors the converter changes on purpose (`CORRECTED`), not compared
    tensor_types: dict[str, int]
    problems: list[str] = field(default_factory=list)
    llama_cpp: dict[str, Any] | None = None  # llama-mtmd-cli's answer to the check image (`jobs.export.mtmd`)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def projector_problem(config: dict[str, Any]) -> str | None:
    """Why llama.cpp's converter cannot write this vision-language model's projector (None: it can)."""
    if problem := converter_problem(config, mmproj=True):
        return problem
    towers = TOWERS.get(architecture(config))
    tower = (config.get("vision_config") or {}).get("model_type", "?")
    if towers is not None and tower not in towers:
        family = f"{config.get('model_type', '?')} ({architecture(config)})"
        return (
            f"llama.cpp's converter writes no vision projector (mmproj) for the model's family {family} with a "
            f"{tower} vision tower (it converts this class for {', '.join(towers)} towers only)"
        )
    return None


def pair_command(model: str, mmproj: str) -> str:
    """llama.cpp's command line that loads the language model and its projector together."""
    return f'llama-mtmd-cli -m {model} --mmproj {mmproj} --image picture.png -p "Describe the image."'


def mmproj_name(stem: str) -> str:
    """The projector's file name beside `<stem>-<type>.gguf` files: `<stem>-mmproj-f16.gguf`."""
    return f"{stem}-mmproj-{PROJECTOR_TYPE}.gguf"


def write_projector(
    source: Path, dest: Path, name: str = "", model: Path | None = None, strict: bool = True
) -> ProjectorCheck:
    """Write the vision tower and projector of the model folder `source` as the mmproj file `dest`, under a
    temporary name until its check passes (a failed check leaves no file: the returned check says why); with
    `model`, the language model's GGUF file, the pair is also read back by llama.cpp (`read_pair`; `strict`: its
    first token must be the merged model's, else it is recorded only)."""
    partial = dest.with_name(f".{dest.stem}.partial.gguf")
    try:
        convert(source, partial, PROJECTOR_TYPE, mmproj=True, name=name)
        check = read_back(source, partial)
        if model is not None and check.passed:
            read_pair(check, source, model, partial, strict)
    except BaseException:  # cleanup only, and re-raised (Ctrl-C and a cancelled task too)
        partial.unlink(missing_ok=True)
        raise
    check.file = dest.name
    log.info(
        "mmproj %s: %s (%d of %d tensors equal to the source's, %s)",
        dest.name,
        "passed" if check.passed else f"FAILED: {'; '.join(check.problems)}",
        check.tensors_equal,
        check.tensors,
        check.read_by,
    )
    if check.passed:
        os.replace(partial, dest)
    else:
        partial.unlink(missing_ok=True)
    return check


def read_pair(check: ProjectorCheck, source: Path, model: Path, mmproj: Path, strict: bool = True) -> None:
    """llama-mtmd-cli's answer to the check image from `model` + `mmproj`, against the merged model `source`'s, in
    `check` (a load failure, or with `strict` another first token: a problem; no llama-mtmd-cli here, or another
    first token from a quantized language model: a note)."""
    from jobs.export.mtmd import PairFailed, mtmd_problem, pair_check

    if problem := mtmd_problem():
        check.notes.append(problem)
        return
    check.read_by = READ_BY_PAIR
    try:
        pair = pair_check(source, model, mmproj)
    except PairFailed as exc:
        check.problems.append(f"llama.cpp did not read the pair: {exc}")
        return
    check.llama_cpp = pair.record()
    if not pair.agrees:
        differs = f"llama.cpp's first token to the check image is {pair.llama_cpp!r}, the merged model's "
        differs += repr(pair.transformers)
        (check.problems if strict else check.notes).append(differs if strict else f"{differs} (a quantized model)")


def read_back(source: Path, path: Path) -> ProjectorCheck:
    """The mmproj file `path` read with GGUFReader and compared with the vision tensors of `source`."""
    from collections import Counter

    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    vision_config = json.loads((source / "config.json").read_text()).get("vision_config") or {}
    problems = [
        f"{key} is {fields.get(key)!r}, not {want!r}"
        for key, want in {"general.architecture": "clip", "general.type": "mmproj"}.items()
        if fields.get(key) != want
    ]
    if not fields.get("clip.has_vision_encoder"):
        problems.append("the file has no vision encoder (clip.has_vision_encoder)")
    if not fields.get("clip.projector_type"):
        problems.append("the file names no projector type (clip.projector_type)")
    vision = {key: fields.get(key) for key in VISION_KEYS}
    problems += [
        f"{key} is {vision[key]}, the model's vision_config.{theirs} {vision_config.get(theirs)}"
        for key, theirs in VISION_KEYS.items()
        if theirs in vision_config and vision[key] != vision_config[theirs]
    ]
    compared = [t for t in reader.tensors if not any(c in t.name for c in CORRECTED)]
    equal = _equal_tensors(source, compared)
    if equal < len(compared):
        problems.append(f"{len(compared) - equal} of {len(compared)} tensors differ from the model's vision tensors")
    return ProjectorCheck(
        path.name,
        READ_BY,
        str(fields.get("clip.projector_type", "")),
        vision,
        len(reader.tensors),
        equal,
        [t.name for t in reader.tensors if any(c in t.name for c in CORRECTED)],
        dict(Counter(t.tensor_type.name for t in reader.tensors)),
        problems,
    )


def _equal_tensors(source: Path, tensors: list[Any]) -> int:
    """How many of the file's `tensors` hold the values of one of the source's tensors outside its language model
    (the vision tower and projector, whatever the family names them: `vision_tower`, `visual`, `connector`...)."""
    import math

    import numpy as np
    from safetensors import safe_open

    sizes = {int(math.prod(int(n) for n in t.shape)) for t in tensors}
    theirs: dict[int, list[Any]] = {}
    for shard in sorted(source.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                size = math.prod(f.get_slice(key).get_shape())
                if size in sizes and not any(part in key for part in LANGUAGE_PARTS):
                    theirs.setdefault(size, []).append(np.sort(f.get_tensor(key).float().numpy().ravel()))
    equal = 0
    for tensor in tensors:
        values = np.sort(np.asarray(tensor.data, dtype=np.float32).ravel())
        if any(np.allclose(values, other, rtol=1e-3, atol=1e-3) for other in theirs.get(values.size, [])):
            equal += 1
    return equal
