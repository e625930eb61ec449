"""The plot of ``bench hitratio``: hit ratio against capacity, one panel per trace, as SVG.

Written by hand (a few polylines) so the bench needs no plotting library.
"""

from __future__ import annotations

import math
from pathlib import Path

SERIES = (("belady", "#444444", "4 3"), ("oracle", "#000000", ""), ("lru", "#d62728", ""),
          ("l1+tlfu", "#1f77b4", ""), ("node+tlfu", "#2ca02c", ""), ("bytes lru", "#ff9896", "2 2"),
          ("bytes l1+tlfu", "#aec7e8", "2 2"))
W, H, PAD = 260, 190, 34
COLS = 3


def write_svg(rows: list[dict[str, float | str]], path: Path) -> None:
    """One panel per trace (x: capacity as a share of distinct texts, log scale)."""
    traces = list(dict.fromkeys(str(r["trace"]) for r in rows))
    caps = sorted({float(r["cap"]) for r in rows})
    if not traces or not caps:
        return
    lo, hi = math.log10(caps[0]), math.log10(caps[-1])
    span = (hi - lo) or 1.0
    n_rows = math.ceil(len(traces) / COLS)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{COLS * W}" '
           f'height="{n_rows * H + 30}" font-family="sans-serif" font-size="10">',
           '<rect width="100%" height="100%" fill="white"/>']
    for i, name in enumerate(traces):
        ox, oy = (i % COLS) * W, (i // COLS) * H
        pw, ph = W - PAD - 8, H - PAD - 16

        def xy(cap: float, ratio: float, ox: int = ox, oy: int = oy, pw: int = pw,
               ph: int = ph) -> str:
            x = ox + PAD + (math.log10(cap) - lo) / span * pw
            y = oy + 14 + (1.0 - ratio) * ph
            return f"{x:.1f},{y:.1f}"

        out.append(f'<text x="{ox + PAD}" y="{oy + 10}" font-weight="bold">{name}</text>')
        out.append(f'<rect x="{ox + PAD}" y="{oy + 14}" width="{pw}" height="{ph}" '
                   'fill="none" stroke="#ccc"/>')
        for tick in (0.0, 0.5, 1.0):
            out.append(f'<text x="{ox + 4}" y="{oy + 17 + (1 - tick) * ph:.0f}">{tick:g}</text>')
        for cap in caps:
            x, _ = xy(cap, 0.0).split(",")
            out.append(f'<text x="{float(x) - 8:.0f}" y="{oy + ph + 26}">{cap * 100:g}%</text>')
        mine = [r for r in rows if r["trace"] == name]
        for key, color, dash in SERIES:
            pts = [xy(float(r["cap"]), float(r[key])) for r in mine if key in r]
            if not pts:
                continue
            extra = f' stroke-dasharray="{dash}"' if dash else ""
            if len(pts) == 1:
                px, py = pts[0].split(",")
                out.append(f'<circle cx="{px}" cy="{py}" r="3" fill="{color}"/>')
            else:
                out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" '
                           f'stroke-width="1.5"{extra}/>')
            if key.startswith("node"):
                for p in pts:
                    px, py = p.split(",")
                    out.append(f'<circle cx="{px}" cy="{py}" r="2.5" fill="{color}"/>')
    ly = n_rows * H + 14
    for j, (key, color, dash) in enumerate(SERIES):
        lx = 10 + j * 110
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 20}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2"{extra}/><text x="{lx + 24}" y="{ly + 4}">{key}</text>')
    out.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
