"""Data files whose rows name images, and zips of them, for the path and upload tests (issue 48)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path


def draw(path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), (200, 30, 30)).save(path)
    return path


def image_rows(path: Path, image: str, n: int = 4) -> Path:
    row = {
        "messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}],
        "images": [image],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(row) for _ in range(n)) + "\n")
    return path


def zipped(path: Path, rows: str, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data/train.jsonl", rows)
        for name, content in files.items():
            zf.writestr(name, content)
    return path


def rows_text(image: str) -> str:
    row = {
        "messages": [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "red"}],
        "images": [image],
    }
    return "\n".join(json.dumps(row) for _ in range(4))
