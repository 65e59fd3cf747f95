"""How sizes and counts read to a person: one formatting for the CLI, the dashboard and model cards.

human_bytes(1536)        # '1.5 KiB'   (binary units: KiB, MiB, GiB, TiB)
human_bytes(None)        # '-'
human_count(134515008)   # '134.5M'
parse_bytes("24GiB")     # 25769803776 (also '24G', '24 GB', '80000MiB', '24' = GiB); None if not a size
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1024**3, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> '-'."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: int) -> str:
    """134515008 -> '134.5M'."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def parse_bytes(text: str | None) -> int | None:
    """A memory size a person writes, in binary units ('24GiB', '24G', '24 GB', '80000MiB'; a bare number is
    GiB) -> bytes; None when it is not a positive size."""
    m = _SIZE.match(text or "")
    if not m or float(m.group(1)) <= 0:
        return None
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()[:1]])
