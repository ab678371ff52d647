"""What a drawn figure shows, read back: a PNG's pixel size, the bars of an axes."""

from __future__ import annotations

from pathlib import Path


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; asserts the signature."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def bar_heights(ax) -> list[float]:
    """Heights of the bars an axes shows, left to right (rectangles of non-zero width)."""
    from matplotlib.patches import Rectangle

    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() > 0]
    return [p.get_height() for p in sorted(bars, key=lambda p: p.get_x())]
