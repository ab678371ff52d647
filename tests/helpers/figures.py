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


def errorbar_points(ax) -> dict[str, list[tuple[float, float, float]]]:
    """{legend label: [(x, y, half-height of its error bar: 0 when none)]} of an axes' errorbar series."""
    from matplotlib.container import ErrorbarContainer

    out = {}
    for c in ax.containers:
        if not isinstance(c, ErrorbarContainer):
            continue
        line, _, bars = c.lines
        xs, ys = line.get_xdata(), line.get_ydata()
        errs = [0.0] * len(xs)
        if bars:
            segs = bars[0].get_segments()
            errs = [abs(s[1][1] - s[0][1]) / 2 for s in segs]
        out[c.get_label()] = [(float(x), float(y), float(e)) for x, y, e in zip(xs, ys, errs)]
    return out


def figure_texts(fig) -> list[str]:
    """Every non-empty text a figure shows: titles, labels, tick labels, legends, notes."""
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of shown texts whose drawn boxes overlap (after a draw), and texts crossed by a
    line of an axes (an axhline through a label): what a reader sees as labels on top of each
    other. Tick labels of one axis are compared with everything but each other's neighbours."""
    from matplotlib.lines import Line2D
    from matplotlib.text import Text

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    boxes = [(t, t.get_window_extent(r)) for t in texts]
    out = []
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1:]:
            if ba.overlaps(bb):
                out.append((a.get_text(), b.get_text()))
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label().startswith("_") and len(line.get_xdata()) < 2:
                continue
            path = line.get_transform().transform(list(zip(line.get_xdata(), line.get_ydata())))
            for t, bt in boxes:
                if t.axes is ax and t in ax.texts and any(bt.x0 <= x <= bt.x1 and bt.y0 <= y <= bt.y1 for x, y in path):
                    out.append((t.get_text(), line.get_label()))
                if t.axes is ax and t in ax.texts and len(path) == 2 and path[0][1] == path[1][1]:  # a horizontal line
                    y = path[0][1]
                    if bt.y0 <= y <= bt.y1 and min(path[0][0], path[1][0]) <= bt.x1 and max(path[0][0], path[1][0]) >= bt.x0:
                        out.append((t.get_text(), line.get_label()))
    return out


def stamped_note(fig) -> str | None:
    """The evidence note a report stamped under the figure (mor.reports.common.stamp), its line
    breaks joined; None when there is none."""
    notes = [t.get_text() for t in fig.texts if t.get_gid() == "mor-note"]
    return " ".join(notes[0].split()) if notes else None
