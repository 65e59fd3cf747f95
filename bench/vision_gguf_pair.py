"""llama.cpp loads a vision-language GGUF pair as tunedeck writes it, and answers an image prompt like transformers.

    MTMD_CPP_LIB=DIR .venv/bin/python bench/vision_gguf_pair.py                # the tiny Gemma 3, built offline
    MTMD_CPP_LIB=DIR .venv/bin/python bench/vision_gguf_pair.py --model PATH   # a merged vision-language folder

The export reads the pair back with llama.cpp's llama-mtmd-cli (`jobs.export.mtmd`: the first answer token to the
check image, as text, against transformers') besides gguf-py's GGUFReader; the pinned llama-cpp-python binding is
built without llama.cpp's mtmd library (`./dev.sh`: LLAVA_BUILD=OFF). This script goes further, through the
library: it runs llama.cpp's image encoder on the two files, written as an export writes them (`jobs.export.converter.convert` for the language model
in f16, `jobs.export.projector.write_projector` for the mmproj), through the binding's `llama_cpp.mtmd_cpp` with a
libmtmd.so given by MTMD_CPP_LIB, built from the same sdist's tools/mtmd sources against the binding's libllama
(the library's .cpp files of tools/mtmd/CMakeLists.txt and vendor/hash, `-std=c++17 -fPIC -DLLAMA_SHARED
-DLLAMA_BUILD`, linked `-shared` with the binding's lib/libllama.so.0, libggml.so.0 and libggml-base.so.0).

For each of two pictures (the export's check image, a green square) the prompt is the model's chat template over
an image and "Describe the image."; it prints whether llama.cpp's token layout (text tokens, then the image's
tokens) equals the processor's input_ids, each side's next token, the largest difference of the next-token logits,
and how far the other picture moves them (the image must matter for the comparison to mean anything).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def llama_cpp_logits(mt: Any, llama_cpp: Any, llm: Any, ctx: Any, prompt: str, image: Any) -> tuple[list[Any], Any]:
    """(the prompt's layout: token ids and "IMG" per image token, the next-token logits) as llama.cpp reads it."""
    import numpy as np

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm._ctx.ctx), True)
    rgb = image.convert("RGB")
    data = rgb.tobytes()
    bitmap = mt.mtmd_bitmap_init(rgb.size[0], rgb.size[1], (ctypes.c_uint8 * len(data)).from_buffer_copy(data))
    text = mt.mtmd_input_text()
    body = prompt.encode()
    text.text, text.text_len, text.add_special, text.parse_special = body, len(body), True, True
    chunks = mt.mtmd_input_chunks_init()
    try:
        if mt.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mt.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        layout: list[Any] = []
        for i in range(mt.mtmd_input_chunks_size(chunks)):
            chunk = mt.mtmd_input_chunks_get(chunks, i)
            if mt.mtmd_input_chunk_get_type(chunk) == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ids = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                layout += [ids[j] for j in range(n.value)]
            else:
                layout += ["IMG"] * mt.mtmd_input_chunk_get_n_tokens(chunk)
        past = llama_cpp.llama_pos(0)
        if mt.mtmd_helper_eval_chunks(ctx, llm._ctx.ctx, chunks, 0, 0, llm.n_batch, True, ctypes.byref(past)) != 0:
            raise RuntimeError("mtmd_helper_eval_chunks failed")
        n_vocab = llama_cpp.llama_n_vocab(llama_cpp.llama_model_get_vocab(llm.model))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,)).copy()
    finally:
        mt.mtmd_input_chunks_free(chunks)
        mt.mtmd_bitmap_free(bitmap)
    return layout, logits


def main() -> int:
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from jobs.export.converter import convert
    from jobs.export.gguf_route import _pre_name
    from jobs.export.image_check import IMAGE_QUESTION, check_image, image_inputs
    from jobs.export.projector import write_projector

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="a vision-language model folder (default: the tiny Gemma 3)")
    args = p.parse_args()
    import llama_cpp
    import llama_cpp.mtmd_cpp as mt  # needs MTMD_CPP_LIB: see the docstring

    out = Path(tempfile.mkdtemp(prefix="vision-gguf-pair-"))
    if args.model is None:
        from jobs.models.tiny_gemma3 import build_tiny_gemma3

        args.model = build_tiny_gemma3(out / "tiny-gemma3")
    source = args.model
    text, mmproj = out / "model-f16.gguf", out / "model-mmproj-f16.gguf"
    tokenizer_json = source / "tokenizer.json"
    convert(source, text, "f16", _pre_name(json.loads(tokenizer_json.read_text())))
    check = write_projector(source, mmproj)
    print(f"projector read back by gguf-py: {'passed' if check.passed else check.problems}")
    processor = AutoProcessor.from_pretrained(source)
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).eval()
    llm = llama_cpp.Llama(str(text), n_ctx=512, verbose=False)
    params = mt.mtmd_context_params_default()
    params.use_gpu = False
    ctx = mt.mtmd_init_from_file(str(mmproj).encode(), llm.model, params)
    if not ctx:
        print("llama.cpp did not load the projector")
        return 1
    print(f"llama.cpp loaded the pair (vision: {mt.mtmd_support_vision(ctx)})")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": IMAGE_QUESTION}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    marker = mt.mtmd_default_marker().decode()
    # the processor's image sequence, its begin/end-of-image tokens written by llama.cpp around the marker
    prompt = prompt.replace(processor.boi_token, f"\n\n{marker}\n\n") if hasattr(processor, "boi_token") else prompt
    image_id = model.config.image_token_id
    before = None
    for label, image in [("check image", check_image()), ("green square", Image.new("RGB", (64, 64), (20, 200, 20)))]:
        inputs = image_inputs(processor, image)
        with torch.no_grad():
            theirs = model(**inputs).logits[0, -1].numpy()
        layout, mine = llama_cpp_logits(mt, llama_cpp, llm, ctx, prompt, image)
        expected = ["IMG" if t == image_id else t for t in inputs["input_ids"][0].tolist()]
        print(
            f"{label}: layout equal {layout == expected} ({len(layout)} positions); next token transformers "
            f"{theirs.argmax()}, llama.cpp {mine.argmax()}; largest logit difference "
            f"{np.abs(theirs[: mine.size] - mine).max():.3g}"
        )
        if before is not None:
            print(
                f"  the other picture moved the logits by up to {np.abs(before[0] - theirs).max():.3g} "
                f"(transformers), {np.abs(before[1] - mine).max():.3g} (llama.cpp)"
            )
        before = (theirs, mine)
    mt.mtmd_free(ctx)
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
