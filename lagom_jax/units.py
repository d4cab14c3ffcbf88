"""How numbers are written for people: bytes and microseconds, one way everywhere."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``38.3 MiB``, ``2.0 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def human_us(us: float) -> str:
    """``12.5 us``, ``9.717 ms``, ``1.204 s``."""
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.1f} us"
