"""The sink page's picture (``plugins/ui/epoch_chart.py``), drawn from rows as the page has them.

The SVG is read as XML: each shape's box is worked out from its attributes, so what would cover
what in a browser (a later shape over an earlier one) is judged here without one.
"""

from __future__ import annotations

import itertools
import random
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_exactly_once.plugins.ui.epoch_chart import CHART_EPOCHS, epoch_chart
from airflow_provider_exactly_once.runtime.run_epochs import instant_text

NS = "{http://www.w3.org/2000/svg}"
H = 3_600_000
DAY = 24 * H
#: Where the issue's sink started: six epochs in its first days, then one a day or so to December 2026.
MARCH = int(datetime(2025, 3, 1, tzinfo=UTC).timestamp() * 1000)
CAUSE = 'write failed on try 2: SparkArithmeticException: [CAST_OVERFLOW] The value 1.0E32D of the type "DOUBLE"'


def row(epoch: int, status: str = "Committed", seconds: float = 30, **extra: Any) -> dict[str, Any]:
    start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=epoch)
    created = start + timedelta(hours=1)
    return {
        "epoch": epoch,
        "status": status,
        "interval_start": start.isoformat(),
        "interval_end": (start + timedelta(hours=1)).isoformat(),
        "created_at": created.isoformat(),
        "updated_at": (created + timedelta(seconds=seconds)).isoformat(),
        "commit_decided_at": (created + timedelta(seconds=seconds)).isoformat() if status == "Committed" else None,
        "age_seconds": seconds,
        "revision": 0,
        "error": CAUSE if status == "Aborted" else None,
        "url": f"/sinks/s/epochs/{epoch}",
        **extra,
    }


def two_years(count: int) -> list[dict[str, Any]]:
    """``count`` epochs from March 2025 over about two years, six of them in its first days: every
    tenth aborted, each followed by the slowest commit of all (what stood over its red mark), a
    revision 1 beside a revision 2 here and there, warnings, and the newest two Pending."""
    chosen = random.Random(count)
    days = [0, 1, 1.5, 2, 2.5, 3][:count] + sorted(chosen.sample(range(4, 660), max(0, count - 6)))
    rows = []
    for i, day in enumerate(days):
        epoch = MARCH + int(day * DAY)
        if i >= count - 2 and count > 2:
            rows.append(row(epoch, "Pending", 90))
        elif i % 10 == 3:
            rows.append(row(epoch, "Aborted"))
        elif i % 10 == 4:
            rows.append(row(epoch, seconds=600))  # the slowest: on the top line beside the aborted one
        elif i % 10 == 6:
            rows.append(row(epoch, revision=1))
        elif i % 10 == 7:
            rows.append(row(epoch, revision=2))
        elif i % 10 == 8:
            rows.append(row(epoch, warning="refused: an upsert of an epoch before the last committed"))
        else:
            rows.append(row(epoch, seconds=chosen.uniform(5, 120)))
    return rows


@dataclass(frozen=True)
class Shape:
    element: ET.Element
    order: int
    left: float
    top: float
    right: float
    bottom: float

    @property
    def centre(self) -> tuple[float, float]:
        return (self.left + self.right) / 2, (self.top + self.bottom) / 2

    def holds(self, x: float, y: float) -> bool:
        return self.left <= x <= self.right and self.top <= y <= self.bottom


class Drawn:
    """The chart's shapes in drawing order (a later one is drawn over an earlier one), with boxes."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        svg = epoch_chart(rows)
        assert svg is not None
        self.text = str(svg)
        self.root = ET.fromstring(self.text)
        self.parent = {child: parent for parent in self.root.iter() for child in parent}
        self.shapes = [s for i, e in enumerate(self.root.iter()) if (s := self._shape(e, i)) is not None]

    @staticmethod
    def _shape(e: ET.Element, order: int) -> Shape | None:
        a = {k: float(v) for k, v in e.attrib.items() if k in ("x", "y", "width", "height", "cx", "cy", "r")}
        if e.tag == f"{NS}rect" and e.get("fill") not in ("none", "transparent"):
            return Shape(e, order, a["x"], a["y"], a["x"] + a["width"], a["y"] + a["height"])
        if e.tag == f"{NS}circle":
            return Shape(e, order, a["cx"] - a["r"], a["cy"] - a["r"], a["cx"] + a["r"], a["cy"] + a["r"])
        if e.tag == f"{NS}text" and e.get("pointer-events") != "none" and "lane-text" not in (e.get("class") or ""):
            width = 6.0 * len("".join(e.itertext()))
            anchor = {"start": 0.0, "middle": width / 2, "end": width}[e.get("text-anchor", "start")]
            return Shape(e, order, a["x"] - anchor, a["y"] - 10, a["x"] - anchor + width, a["y"])
        return None

    def marks(self, status: str | None = None) -> list[Shape]:
        return [
            s
            for s in self.shapes
            if "mark" in (s.element.get("class") or "").split() and status in (None, s.element.get("data-status"))
        ]

    def of_class(self, cls: str) -> list[Shape]:
        return [s for s in self.shapes if cls in (s.element.get("class") or "").split()]

    def covering(self, mark: Shape) -> list[Shape]:
        """The shapes drawn after ``mark`` over its centre."""
        x, y = mark.centre
        return [s for s in self.shapes if s.order > mark.order and s.holds(x, y)]

    def title(self, shape: Shape) -> str:
        """The tooltip a browser shows over the shape: its own ``<title>`` or its nearest ancestor's."""
        e: ET.Element | None = shape.element
        while e is not None:
            if (t := e.find(f"{NS}title")) is not None:
                return t.text or ""
            e = self.parent.get(e)
        return ""

    def epoch(self, shape: Shape) -> int:
        """The epoch of a shape: its own ``data-epoch`` or that of the mark of its column."""
        e: ET.Element | None = shape.element
        while e is not None:
            if e.get("data-epoch"):
                return int(e.get("data-epoch", ""))
            if (mark := e.find(f"{NS}rect[@class='mark']")) is not None:
                return int(mark.get("data-epoch", ""))
            e = self.parent.get(e)
        raise AssertionError(f"no epoch for {shape.element.attrib}")


@pytest.mark.parametrize("count", [1, 50, 500])
def test_every_aborted_epoch_has_a_mark_nothing_covers_among_any_number_of_epochs(count: int) -> None:
    """The issue's sink: six epochs in March 2025's first days, one a day or so after; the aborted
    epochs' red marks sat under the green one beside them. Each is drawn, with room, and nothing is
    drawn over its centre (a browser's ``elementFromPoint`` there would find it)."""
    rows = two_years(count) if count > 1 else [row(MARCH, "Aborted")]
    drawn = Drawn(rows)
    aborted = {r["epoch"] for r in rows if r["status"] == "Aborted"}
    marks = drawn.marks("Aborted")
    assert {drawn.epoch(m) for m in marks} == aborted and len(marks) == len(aborted)
    for mark in marks:
        assert mark.right - mark.left >= 1.5 and mark.bottom - mark.top >= 8, mark.element.attrib
        assert drawn.covering(mark) == [], (drawn.epoch(mark), [c.element.attrib for c in drawn.covering(mark)])
    warned = {r["epoch"] for r in rows if r.get("warning")}
    assert {drawn.epoch(s) for s in drawn.of_class("warned")} == warned
    assert all(drawn.covering(s) == [] for s in drawn.of_class("warned"))


@pytest.mark.parametrize("count", [1, 50, 500])
def test_one_column_per_epoch_in_epoch_order_and_every_shape_inside_its_own(count: int) -> None:
    """Columns side by side, oldest on the left, whatever order the rows come in: an epoch's bar,
    lanes and labels never reach into a neighbour's column, so none can hide another's."""
    rows = two_years(count) if count > 1 else [row(MARCH, "Aborted")]
    drawn = Drawn(random.Random(7).sample(rows, len(rows)))
    columns = [e for e in drawn.root.iter(f"{NS}a") if "col" in (e.get("class") or "")]
    hits = [e.find(f"{NS}rect[@class='hit']") for e in columns]
    spans = [(float(h.get("x", "")), float(h.get("x", "")) + float(h.get("width", ""))) for h in hits if h is not None]
    epochs = [drawn.epoch(m) for m in drawn.marks()]
    assert epochs == sorted(r["epoch"] for r in rows) and len(spans) == count
    assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans))  # left to right, disjoint
    for (left, right), column in zip(spans, columns, strict=True):
        for shape in (s for s in drawn.shapes if s.element in set(column.iter())):
            assert left - 1e-6 <= shape.left and shape.right <= right + 1e-6, shape.element.attrib
    assert float(drawn.root.get("width", "")) <= 1100  # inside Airflow's frame at 1280 px
    assert min(right - left for left, right in spans) >= 2 - 1e-6


def test_neighbouring_revisions_are_numbered_apart_and_still_apart_at_500() -> None:
    """Two revised epochs side by side were one ring: now each has its own mark, with a gap between,
    numbered where the column has room and a later revision taller where it has not."""
    for count in (50, 500):
        drawn = Drawn(two_years(count))
        revised = sorted(drawn.of_class("revised"), key=lambda s: s.left)
        assert len(revised) == sum(1 for r in two_years(count) if r["revision"])
        assert all(a.right < b.left for a, b in itertools.pairwise(revised))
        by_revision = {
            int(drawn.root.find(f".//*[@data-epoch='{drawn.epoch(s)}']").get("data-revision")): s for s in revised
        }  # type: ignore[union-attr]
        if count == 50:
            assert ">1</text>" in drawn.text and ">2</text>" in drawn.text
        else:
            assert by_revision[2].bottom - by_revision[2].top > by_revision[1].bottom - by_revision[1].top


def test_hovering_a_column_gives_its_date_its_id_and_its_cause() -> None:
    refused = "refused: a reprocess <b>kept</b> out"
    drawn = Drawn(
        [
            row(MARCH, "Aborted"),
            row(MARCH + DAY, warning=refused, revision=2),
            row(MARCH + 2 * DAY, "Pending", 90, error="CheckpointFailed: landing job exited 1"),
        ]
    )
    aborted, warned, pending = (drawn.title(m) for m in drawn.marks())
    assert aborted.startswith("[2025-03-01T00:00Z, 2025-03-01T01:00Z) · epoch 1740787200000\nAborted")
    assert f"why: {CAUSE}" in aborted
    assert "revision 2" in warned and f"warning: {refused}" in warned
    assert "Pending for 90 s" in pending and "last error: CheckpointFailed: landing job exited 1" in pending
    assert "<b>" not in drawn.text and "&lt;b&gt;kept" in drawn.text  # text, never markup


def test_a_pending_epoch_is_hollow_amber_and_an_aborted_one_red_to_the_top() -> None:
    drawn = Drawn(
        [
            row(MARCH, seconds=10),
            row(MARCH + H, seconds=60),
            row(MARCH + 2 * H, "Pending", 30),
            row(MARCH + 3 * H, "Aborted"),
        ]
    )
    quick, slowest, pending, aborted = sorted(drawn.of_class("bar"), key=lambda s: s.left)
    assert pending.element.get("fill") == "#fff7ed" and pending.element.get("stroke") == "#d97706"
    assert aborted.element.get("fill") == "#dc2626" and aborted.top == slowest.top < pending.top < quick.top
    assert [m.element.get("fill") for m in drawn.marks()] == ["#16a34a", "#16a34a", "#d97706", "#dc2626"]


def audit(stage: str, *failed: tuple[str, str]) -> dict[str, Any]:
    """An audited epoch's ``audit`` as the API shows it (``operations.views.AuditView``)."""
    verdict = {"Auditing": None, "Audit failed": "failed"}.get(stage, "passed")
    return {
        "stage": stage,
        "branch": "eo-audit-s-1",
        "snapshots": {"shop.orders": "7"},
        "verdict": verdict,
        "failed": [{"name": name, "message": message} for name, message in failed],
    }


def test_an_audited_pending_epochs_status_lane_is_coloured_by_its_stage() -> None:
    """A failed audit waits for an operator: its lane is neither Pending's amber nor Aborted's red;
    an epoch auditing or audited has a colour of its own; its tooltip names the stage and the
    checks that failed. A published epoch keeps its audit and is drawn as any committed one."""
    drawn = Drawn(
        [
            row(MARCH, "Pending", 30),
            row(MARCH + H, "Pending", 30, audit=audit("Auditing")),
            row(MARCH + 2 * H, "Pending", 30, audit=audit("Audit failed", ("no_null_ids", "3 <b>rows</b>"))),
            row(MARCH + 3 * H, "Pending", 30, audit=audit("Audited")),
            row(MARCH + 4 * H, audit=audit("Committed")),
            row(MARCH + 5 * H, "Aborted"),
        ]
    )
    marks = drawn.marks()
    fills = [m.element.get("fill") for m in marks]
    pending, auditing, failed, audited, committed, aborted = fills
    assert (pending, committed, aborted) == ("#d97706", "#16a34a", "#dc2626")
    assert auditing == audited and len({pending, auditing, failed, committed, aborted}) == 5
    assert [m.element.get("data-stage") for m in marks] == [None, "Auditing", "Audit failed", "Audited", None, None]
    assert [m.element.get("data-status") for m in marks][:4] == ["Pending"] * 4
    titles = [drawn.title(m) for m in marks]
    assert "\nPending for 30 s" in titles[0] and "Pending (Auditing) for 30 s" in titles[1]
    assert "Pending (Audit failed) for 30 s" in titles[2] and "failed check no_null_ids: 3 <b>rows</b>" in titles[2]
    assert "Pending (Audited) for 30 s" in titles[3] and "(Committed)" not in titles[4]
    assert "<b>rows" not in drawn.text  # the check's message is text, never markup
    # The bars stay as the status has them: a Pending epoch's is hollow amber whatever its stage.
    bars = sorted(drawn.of_class("bar"), key=lambda s: s.left)
    assert [b.element.get("stroke") for b in bars[:4]] == ["#d97706"] * 4


def test_a_committed_epoch_stands_at_its_commit_decision_not_at_a_later_warning() -> None:
    late = {**row(MARCH, seconds=3000), "commit_decided_at": row(MARCH, seconds=30)["commit_decided_at"]}
    drawn = Drawn([late, row(MARCH + H, seconds=60)])
    decided, minute = sorted(drawn.of_class("bar"), key=lambda s: s.left)
    assert decided.top > minute.top  # 30 s to its decision: shorter than a minute
    assert "Committed 30 s after its persist" in drawn.title(drawn.marks()[0])


@pytest.mark.parametrize(
    ("span", "inner"),
    [(timedelta(hours=1), r"00:[1-5]0"), (timedelta(days=1), r"\d\d:00"), (timedelta(days=730), r"202[56]-\d\d")],
)
def test_dates_are_interval_starts_with_a_few_boundaries_between(span: timedelta, inner: str) -> None:
    """The first and last interval starts in full, between them boundaries by the span (ten minutes,
    hours, months), never overlapping."""
    first = datetime(2025, 1, 1, tzinfo=UTC)
    count = 500
    step = span / count
    drawn = Drawn([row(int((first + step * i).timestamp() * 1000)) for i in range(count)])
    labels = sorted((s for s in drawn.of_class("date")), key=lambda s: s.left)
    texts = ["".join(s.element.itertext()) for s in labels]
    last = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        milliseconds=int((first + step * (count - 1)).timestamp() * 1000)
    )
    assert texts[0] == "2025-01-01T00:00Z" and texts[-1] == instant_text(last)
    assert 5 <= len(texts) <= 16 and all(re.fullmatch(inner, t) for t in texts[1:-1]), texts
    assert all(a.right < b.left for a, b in itertools.pairwise(labels))


def test_one_epoch_is_drawn_and_labelled_and_a_few_say_their_range() -> None:
    one = Drawn([row(MARCH, "Aborted")])
    assert ["".join(s.element.itertext()) for s in one.of_class("date")] == ["2025-03-01T00:00Z"]
    assert ">0</text>" not in one.text  # no time scale where no epoch has a time
    few = Drawn([row(MARCH), row(MARCH + H)])
    assert ["".join(s.element.itertext()) for s in few.of_class("date")] == ["2025-03-01T00:00Z to 2025-03-01T01:00Z"]


def test_the_newest_epochs_are_drawn_and_text_is_escaped() -> None:
    assert epoch_chart([]) is None
    undated = Drawn([{**row(H), "interval_start": None}])  # an epoch outside the calendar still has a column
    assert len(undated.marks()) == 1 and undated.of_class("date") == []
    many = Drawn([row(MARCH + i * H) for i in range(CHART_EPOCHS + 20)])
    assert [many.epoch(m) for m in many.marks()] == [MARCH + i * H for i in range(20, CHART_EPOCHS + 20)]
    evil = {**row(H, "Aborted"), "url": '"><script>alert(1)</script>', "error": "<img src=x onerror=alert(1)>"}
    text = str(epoch_chart([evil]))
    assert "<script>" not in text and "<img" not in text and "&lt;img src=x" in text
