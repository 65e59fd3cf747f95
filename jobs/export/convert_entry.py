"""Run llama.cpp's convert_hf_to_gguf.py, naming a known split rule for a vocabulary it does not recognise.

    python convert_entry.py CONVERTER_DIR PRE_TOKENIZER convert_hf_to_gguf.py's arguments...

A script of its own (run by `jobs.export.converter.convert` with the venv's python, never imported by tunedeck):
the converter recognises a byte-level BPE pre-tokenizer by the hash of a test string's ids, so a retrained
vocabulary with a known split rule is refused ("BPE pre-tokenizer was not recognized"). When PRE_TOKENIZER is
given (llama.cpp's name of the rule tokenizer.json declares, e.g. llama-bpe), it is used for such a vocabulary;
a recognised one keeps llama.cpp's own name.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


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
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
