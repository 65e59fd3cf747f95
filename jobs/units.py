"""How sizes and counts read to a person: one formatting for the CLI, the dashboard and model cards.

human_bytes(1536)        # '1.5 KiB'   (binary units: KiB, MiB, GiB, TiB)
human_bytes(None)        # '-'
human_count(134515008)   # '134.5M'
"""

from __future__ import annotations


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
