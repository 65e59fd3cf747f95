"""Run llama.cpp's convert_hf_to_gguf.py, naming a known split rule for a vocabulary it does not recognise.

    python convert_entry.py CONVERTER_DIR PRE_TOKENIZER convert_hf_to_gguf.py's arguments...

A script of its own (run by `jobs.export.converter.convert` with the venv's python, never imported by tunedeck):
the converter recognises a byte-level BPE pre-tokenizer by the hash of a test string's ids, so a retrained
vocabulary with a known split rule is refused ("BPE pre-tokenizer was not recognized"). When PRE_TOKENIZER is
given (llama.cpp's name of the rule tokenizer.json declares, e.g. llama-bpe), it is used for such a vocabulary;
a recognised one keeps llama.cpp's own name.

With --mmproj, the vision tower's tensor names of a model saved by transformers 5 are read with the level the
converter's tensor map expects (`TOWER_LEVELS`): transformers 5 saves Gemma 3's SigLIP tower as
`vision_tower.embeddings...`, the hub's checkpoints (and the converter) have `vision_tower.vision_model.embeddings...`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# converter module, class -> (the prefix transformers 5 saves, the prefix the converter maps)
TOWER_LEVELS = {("conversion.gemma", "Gemma3VisionModel"): ("vision_tower.", "vision_tower.vision_model.")}


def tower_name(name: str, saved: str, expected: str) -> str:
    """`name` with the level the converter expects (unchanged when it already has it or is not the tower's)."""
    if name.startswith(saved) and not name.startswith(expected):
        return expected + name[len(saved) :]
    return name


def read_towers_with_their_level() -> None:
    """Rename the vision towers' tensors of `TOWER_LEVELS` as each converter class indexes them."""
    import importlib

    for (module, name), (saved, expected) in TOWER_LEVELS.items():
        model_class = getattr(importlib.import_module(module), name)
        original = model_class.filter_tensors.__func__

        def filter_tensors(cls: Any, item: Any, original: Any = original, saved=saved, expected=expected) -> Any:
            return original(cls, (tower_name(item[0], saved, expected), item[1]))

        model_class.filter_tensors = classmethod(filter_tensors)


def main() -> None:
    folder, pre = sys.argv[1], sys.argv[2]
    sys.path.insert(0, folder)
    sys.argv = [str(Path(folder, "convert_hf_to_gguf.py")), *sys.argv[3:]]
    import convert_hf_to_gguf  # puts its own gguf-py first on the path
    from conversion.base import TextModel

    recognised = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return str(recognised(self, tokenizer))
        except NotImplementedError:
            if not pre:
                raise
            print(f"convert_entry: pre-tokenizer named by tokenizer.json's split rule: {pre}", file=sys.stderr)
            return pre

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    if "--mmproj" in sys.argv:
        read_towers_with_their_level()
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
