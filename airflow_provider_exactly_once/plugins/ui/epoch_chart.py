"""The sink page's picture of its last epochs: one mark per epoch, at its data interval's start,
as high as the time from its persist to its commit, coloured by what became of it.

An operator would rather look than read: which hours were aborted, which were revised, whether
commits lag more than they did. It is an SVG drawn here from the page's own rows (no query of its
own, no front-end library), so it is as fresh as the table under it and as testable as any HTML.
A Committed epoch's height is the time from its persist to its commit decision (the commit follows
at once; a warning recorded later does not lift it); a Pending one's is its age so far (hollow); an
Aborted one sits on the top line. A revised epoch gets a ring and its revision number; one whose row keeps a warning (a refused
reprocess, a write of another DAG) gets a "!" above it, the warning in its tooltip, since a refusal
changes nothing else on the row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from markupsafe import Markup, escape

from airflow_provider_exactly_once.runtime.run_epochs import instant_text, interval_text

WIDTH, HEIGHT = 760, 190
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 22, 30
COLOURS = {"Committed": "#16a34a", "Pending": "#d97706", "Aborted": "#dc2626"}


def _when(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def _seconds(row: Mapping[str, Any]) -> float | None:
    """Persist to commit for a Committed epoch, its age for a Pending one, none for an Aborted one."""
    if row.get("status") == "Pending":
        return float(row.get("age_seconds") or 0.0)
    created = _when(row.get("created_at"))
    committed = _when(row.get("commit_decided_at")) or _when(row.get("updated_at"))
    if row.get("status") != "Committed" or created is None or committed is None:
        return None
    return max(0.0, (committed - created).total_seconds())


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def epoch_chart(rows: Sequence[Mapping[str, Any]]) -> Markup | None:
    """The picture of ``rows`` (the page's epochs, with their ``url``); ``None`` without a dated one."""
    dated = [(start, row) for row in rows if (start := _when(row.get("interval_start"))) is not None]
    if not dated:
        return None
    first, last = min(s for s, _ in dated), max(s for s, _ in dated)
    span = (last - first).total_seconds() or 1.0
    heights = [s for _, row in dated if (s := _seconds(row)) is not None]
    top = max(heights, default=1.0) or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(start: datetime) -> float:
        return LEFT + (plot_w / 2 if first == last else plot_w * (start - first).total_seconds() / span)

    def y(seconds: float | None) -> float:  # square root: a few slow commits do not flatten the rest
        return TOP if seconds is None else TOP + plot_h * (1 - math.sqrt(seconds / top))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" class="epoch-chart" role="img" '
        f'aria-label="the last {len(dated)} epochs: time from persist to commit, by data interval">',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end" class="tick">{escape(_duration(top))}</text>',
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end" class="tick">0</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 8}" class="tick">{escape(instant_text(first))}</text>',
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end" class="tick">{escape(instant_text(last))}</text>',
    ]
    for start, row in sorted(dated, key=lambda pair: pair[0]):
        status = str(row.get("status"))
        seconds = _seconds(row)
        revision = int(row.get("revision") or 0)
        cx, cy = x(start), y(seconds)
        colour = COLOURS.get(status, "#71717a")
        fill = "none" if status == "Pending" else colour
        took = "" if seconds is None else f", {'pending for' if status == 'Pending' else 'committed after'} "
        took += "" if seconds is None else _duration(seconds)
        warning = str(row.get("warning") or "")
        title = f"epoch {row.get('epoch')} {interval_text(start, _when(row.get('interval_end')))}: {status}{took}" + (
            f", revision {revision}" if revision else ""
        )
        title += f"; warning: {warning}" if warning else ""
        mark = [
            f'<a href="{escape(str(row.get("url") or ""))}" target="_self">',
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4.5" fill="{fill}" stroke="{colour}" stroke-width="1.5" '
            f'class="mark" data-epoch="{escape(str(row.get("epoch")))}" data-status="{escape(status)}" '
            f'data-revision="{revision}"><title>{escape(title)}</title></circle>',
        ]
        if revision:
            mark.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="8" fill="none" stroke="#1d4ed8" class="revised"/>')
            mark.append(f'<text x="{cx + 9:.1f}" y="{cy - 6:.1f}" class="tick">r{revision}</text>')
        if warning:
            mark.append(
                f'<text x="{cx:.1f}" y="{cy - 10:.1f}" text-anchor="middle" class="warned" fill="#b45309" '
                f'data-epoch="{escape(str(row.get("epoch")))}">!<title>{escape(warning)}</title></text>'
            )
        parts.extend([*mark, "</a>"])
    parts.append("</svg>")
    return Markup("".join(parts))
