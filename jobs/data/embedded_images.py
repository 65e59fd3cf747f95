"""Images held in the data itself (Parquet files and hub data sets store them as bytes), read as `data:` URLs:
one reference form for files and embedded pictures alike (the row checks, the preview's thumbnails, trl's rows).

    ds = undecoded(ds)                   # Image columns give {"bytes", "path"} instead of decoded PIL images
    embedded_url({"bytes": b"\\x89PNG..."})  # "data:image/png;base64,..."; a PIL image too; None for anything else
"""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path
from typing import Any

SIGNATURES = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"), (b"RIFF", "image/webp"))


def _plain(feature: Any) -> Any:
    """`feature` with every Image in it left undecoded."""
    import datasets

    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False)
    if isinstance(feature, datasets.List):
        return datasets.List(_plain(feature.feature), length=feature.length)
    if isinstance(feature, dict):
        return {k: _plain(v) for k, v in feature.items()}
    if isinstance(feature, list):
        return [_plain(f) for f in feature]
    return feature


def undecoded(ds: Any) -> Any:
    """The data set with its images as {"bytes", "path"} (no picture decoded while rows are read and checked)."""
    import datasets

    features = datasets.Features({name: _plain(f) for name, f in ds.features.items()})
    return ds if features == ds.features else ds.cast(features)


def embedded_url(value: Any) -> str | None:
    """A `data:` URL of an image held as {"bytes": ...} (Arrow's image struct) or as a PIL image; None otherwise."""
    if isinstance(value, dict) and isinstance(value.get("bytes"), (bytes, bytearray)):
        data = bytes(value["bytes"])
    elif hasattr(value, "save") and hasattr(value, "getbbox"):  # a PIL image (a row made in Python)
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        data = buffer.getvalue()
    else:
        return None
    mime = next((m for sig, m in SIGNATURES if data.startswith(sig)), "image/png")
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def stored_png(folder: Path, picture: Any) -> str:
    """`picture` (a PIL image, a file, or a file object of image bytes) saved in `folder` as an RGB PNG named by
    its content, once (the same picture twice is one file; written whole or not at all); its path."""
    from PIL import Image

    if hasattr(picture, "seek"):
        picture.seek(0)
    if isinstance(picture, (str, Path)) or hasattr(picture, "read"):
        with Image.open(picture) as image:
            rgb = image.convert("RGB")
    else:
        rgb = picture.convert("RGB")
    buffer = io.BytesIO()
    rgb.save(buffer, format="PNG")
    data = buffer.getvalue()
    out = Path(folder) / f"{hashlib.sha256(data).hexdigest()[:24]}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file():
        partial = out.with_suffix(".part")
        partial.write_bytes(data)
        partial.replace(out)
    return str(out)
