"""The sink page's picture of its newest epochs, read at a glance as Airflow's grid view is.

An SVG drawn from the page's own rows (no query, no front-end library), so it is as fresh as the
table under it and as testable as any HTML; every text in it is escaped. One column per epoch keeps
every mark of an epoch inside its own column, for 1 epoch or 500. What it shows: docs/ui.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from markupsafe import Markup, escape

from airflow_provider_exactly_once.core.epochs import AuditStage
from airflow_provider_exactly_once.runtime.run_epochs import instant_text, interval_text

#: The newest epochs drawn; the page asks the store for as many.
CHART_EPOCHS = 500
#: Column widths: 500 epochs in 1,000 px (2 px each); a few are not stretched across the page.
PLOT_MAX, PLOT_MIN, COLUMN_MAX = 1000, 280, 22
#: Below this width a column's lanes show no digit or "!" (they would spill into the next column).
LABELLED_COLUMN = 12
LEFT, RIGHT = 64, 12
BARS_TOP, BARS_HEIGHT = 8, 110
LANE_HEIGHT, LANE_GAP = 12, 3
LANES = ("status", "revision", "warning")
AXIS = BARS_TOP + BARS_HEIGHT + len(LANES) * (LANE_HEIGHT + LANE_GAP) + LANE_GAP
HEIGHT = AXIS + 20
#: Roughly how wide a character of the 10 px labels is, to keep labels from overlapping.
CHAR_WIDTH = 6.0
COLOURS = {"Committed": "#16a34a", "Pending": "#d97706", "Aborted": "#dc2626"}
#: An audited Pending epoch's status lane, by its stage (design.md D23): one whose audit failed
#: waits for an operator (reprocess or reject), one auditing or audited for its checks or publish.
STAGE_COLOURS = {AuditStage.AUDIT_FAILED: "#c026d3", AuditStage.AUDITING: "#0891b2", AuditStage.AUDITED: "#0891b2"}
OTHER_COLOUR = "#71717a"
REVISED = ("#60a5fa", "#1d4ed8")
WARNED = "#f59e0b"
#: Which boundaries the date axis marks, by the span of the dates drawn: each names the boundary an
#: instant follows, and a column after a change of name is the first past a boundary.
_BOUNDARIES: tuple[tuple[timedelta, Callable[[datetime], str]], ...] = (
    (timedelta(hours=3), lambda t: f"{t:%H}:{t.minute // 10}0"),
    (timedelta(days=2), lambda t: f"{t:%H}:00"),
    (timedelta(days=92), lambda t: f"{t:%Y-%m-%d}"),
    (timedelta(days=4 * 366), lambda t: f"{t:%Y-%m}"),
    (timedelta.max, lambda t: f"{t:%Y}"),
)


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
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.0f} d"


def _scale(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The time the full bar stands for: the slowest commit, else the oldest Pending epoch's age;
    ``None`` when no epoch has a time (only Aborted ones)."""
    committed = [s for row in rows if row.get("status") == "Committed" and (s := _seconds(row)) is not None]
    pending = [s for row in rows if row.get("status") == "Pending" and (s := _seconds(row)) is not None]
    timed = committed or pending
    return None if not timed else max(timed) or 1.0


def _stage(row: Mapping[str, Any]) -> str | None:
    """An audited Pending epoch's stage (``Auditing``, ``Audit failed``, ``Audited``); else ``None``."""
    stage = (row.get("audit") or {}).get("stage")
    return str(stage) if row.get("status") == "Pending" and stage in STAGE_COLOURS else None


def _title(row: Mapping[str, Any], start: datetime | None, seconds: float | None) -> str:
    """The column's tooltip: which epoch, what became of it, and why, as the row says."""
    status = str(row.get("status"))
    when = f"{interval_text(start, _when(row.get('interval_end')))} · " if start is not None else ""
    lines = [f"{when}epoch {row.get('epoch')}"]
    outcome = status if (stage := _stage(row)) is None else f"{status} ({stage})"
    if seconds is not None:
        outcome += f" {_duration(seconds)} after its persist" if status == "Committed" else f" for {_duration(seconds)}"
    if revision := int(row.get("revision") or 0):
        outcome += f", revision {revision}"
    lines.append(outcome)
    if error := str(row.get("error") or ""):
        lines.append(f"{'why' if status == 'Aborted' else 'last error'}: {error}")
    if stage is not None:
        failed = (row.get("audit") or {}).get("failed") or ()
        lines += [f"failed check {c.get('name')}: {c.get('message')}".rstrip(": ") for c in failed]
    if warning := str(row.get("warning") or ""):
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _rect(x: float, y: float, w: float, h: float, fill: str, cls: str, extra: str = "") -> str:
    return f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="{fill}" class="{cls}"{extra}/>'


def _lane_top(lane: str) -> float:
    return BARS_TOP + BARS_HEIGHT + LANE_GAP + LANES.index(lane) * (LANE_HEIGHT + LANE_GAP)


def _column(left: float, width: float, row: Mapping[str, Any], top: float | None) -> str:
    """One epoch's column: every shape of it within ``[left, left + width)``."""
    status = str(row.get("status"))
    colour = COLOURS.get(status, OTHER_COLOUR)
    start = _when(row.get("interval_start"))
    seconds = _seconds(row)
    revision = int(row.get("revision") or 0)
    warning = str(row.get("warning") or "")
    gap = 0.0 if width < 4 else max(1.0, width * 0.15)
    flag_gap = max(1.0, gap)  # two revised or warned neighbours never merge into one mark
    x, w = left + gap / 2, width - gap
    if status == "Aborted":
        height = float(BARS_HEIGHT)
    elif seconds is None or top is None:
        height = 2.0
    else:
        height = max(2.0, BARS_HEIGHT * math.sqrt(min(seconds, top) / top))
    base = BARS_TOP + BARS_HEIGHT
    parts = [
        f'<a href="{escape(str(row.get("url") or ""))}" target="_self" class="col">',
        f"<title>{escape(_title(row, start, seconds))}</title>",
        _rect(left, BARS_TOP, width, AXIS - BARS_TOP, "transparent", "hit"),
    ]
    if status == "Pending" and w >= 4:  # hollow: inset by half its stroke, so it stays in its column
        parts.append(
            _rect(x + 0.75, base - height + 0.75, w - 1.5, height - 1.5, "#fff7ed", "bar", f' stroke="{colour}"')
        )
    else:
        parts.append(_rect(x, base - height, w, height, colour, "bar"))
    data = f' data-epoch="{escape(str(row.get("epoch")))}" data-status="{escape(status)}" data-revision="{revision}"'
    stage = _stage(row)
    if stage is not None:
        data += f' data-stage="{escape(stage)}"'
    lane_colour = colour if stage is None else STAGE_COLOURS[AuditStage(stage)]
    parts.append(_rect(x, _lane_top("status"), w, LANE_HEIGHT, lane_colour, "mark", data))
    labelled = width >= LABELLED_COLUMN
    if revision:
        shade = REVISED[min(revision, len(REVISED)) - 1]
        tall = LANE_HEIGHT if labelled or revision > 1 else LANE_HEIGHT / 2
        lane = _lane_top("revision")
        parts.append(_rect(left + flag_gap / 2, lane + LANE_HEIGHT - tall, width - flag_gap, tall, shade, "revised"))
        if labelled:
            ink = "#fff" if revision > 1 else "#172554"
            parts.append(
                f'<text x="{left + width / 2:.2f}" y="{lane + 9.5:.2f}" text-anchor="middle" fill="{ink}" '
                f'class="lane-text">{revision}</text>'
            )
    if warning:
        lane = _lane_top("warning")
        parts.append(_rect(left + flag_gap / 2, lane, width - flag_gap, LANE_HEIGHT, WARNED, "warned"))
        if labelled:
            parts.append(
                f'<text x="{left + width / 2:.2f}" y="{lane + 10:.2f}" text-anchor="middle" fill="#fff" '
                'class="lane-text">!</text>'
            )
    parts.append("</a>")
    return "".join(parts)


def _label(x: float, text: str, anchor: str) -> str:
    return (
        f'<line x1="{x:.2f}" y1="{AXIS}" x2="{x:.2f}" y2="{AXIS + 4}" class="axis"/>'
        f'<text x="{x:.2f}" y="{AXIS + 15}" text-anchor="{anchor}" class="tick date">{escape(text)}</text>'
    )


def _dates(starts: Sequence[datetime | None], width: float) -> list[str]:
    """The first and last interval starts in full, and between them the boundaries (ten minutes,
    hours, days, months or years, by the span) that have room, at the first column past each."""
    dated = [(i, start.astimezone(UTC)) for i, start in enumerate(starts) if start is not None]
    if not dated:
        return []
    (first_i, first), (last_i, last) = dated[0], dated[-1]
    first_text, last_text = instant_text(first), instant_text(last)
    left, right = LEFT + first_i * width, LEFT + (last_i + 1) * width
    taken, free = left + len(first_text) * CHAR_WIDTH, right - len(last_text) * CHAR_WIDTH
    if first_i == last_i:
        return [_label(left, first_text, "start")]
    if free < taken + 12:  # too few columns for two labels: one says the range
        return [_label(left, f"{first_text} to {last_text}", "start")]
    parts = [_label(left, first_text, "start"), _label(right, last_text, "end")]
    boundary = next(name for span, name in _BOUNDARIES if abs(last - first) <= span)
    previous = boundary(first)
    for i, start in dated[1:]:
        if (text := boundary(start)) == previous:
            continue
        previous, x = text, LEFT + i * width
        half = len(text) * CHAR_WIDTH / 2
        if x - half >= taken + 24 and x + half <= free - 24:
            parts.append(_label(x, text, "middle"))
            taken = x + half
    return parts


def epoch_chart(rows: Sequence[Mapping[str, Any]]) -> Markup | None:
    """The picture of the newest ``CHART_EPOCHS`` of ``rows`` (the page's epochs, with their
    ``url``), in epoch order; ``None`` without a row."""
    drawn = sorted(rows, key=lambda row: int(row["epoch"]))[-CHART_EPOCHS:]
    if not drawn:
        return None
    width = min(float(COLUMN_MAX), PLOT_MAX / len(drawn))
    plot = max(float(PLOT_MIN), len(drawn) * width)
    total = LEFT + plot + RIGHT
    top = _scale(drawn)
    counts = {s: sum(1 for row in drawn if row.get("status") == s) for s in COLOURS}
    summary = ", ".join(f"{n} {s.lower()}" for s, n in counts.items() if n)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total:.0f}" height="{HEIGHT}" '
        f'viewBox="0 0 {total:.0f} {HEIGHT}" class="epoch-chart" data-epochs="{len(drawn)}" '
        f'aria-label="the newest {len(drawn)} epochs, oldest first: {summary}">',
        f'<line x1="{LEFT}" y1="{BARS_TOP + BARS_HEIGHT}" x2="{LEFT + plot:.2f}" y2="{BARS_TOP + BARS_HEIGHT}" '
        'class="axis"/>',
    ]
    if top is not None:
        parts.append(
            f'<text x="{LEFT - 6}" y="{BARS_TOP + 8}" text-anchor="end" class="tick">{escape(_duration(top))}</text>'
            f'<text x="{LEFT - 6}" y="{BARS_TOP + BARS_HEIGHT}" text-anchor="end" class="tick">0</text>'
        )
    for lane in LANES:
        y = _lane_top(lane)
        parts.append(_rect(LEFT, y, plot, LANE_HEIGHT, "#f4f4f5", "lane"))
        parts.append(f'<text x="{LEFT - 6}" y="{y + 9.5}" text-anchor="end" class="tick">{lane}</text>')
    parts.extend(_column(LEFT + i * width, width, row, top) for i, row in enumerate(drawn))
    parts.extend(_dates([_when(row.get("interval_start")) for row in drawn], width))
    parts.append("</svg>")
    return Markup("".join(parts))
