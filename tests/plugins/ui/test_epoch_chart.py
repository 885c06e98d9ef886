"""The sink page's picture (``plugins/ui/epoch_chart.py``), drawn from rows as the page has them."""

from __future__ import annotations

from typing import Any

from airflow_provider_exactly_once.plugins.ui.epoch_chart import TOP, epoch_chart

H = 3_600_000


def row(epoch: int, status: str, seconds: float, revision: int = 0) -> dict[str, Any]:
    hour = f"2026-12-01T{epoch // H:02d}:00:00+00:00"
    return {
        "epoch": epoch,
        "status": status,
        "interval_start": hour,
        "interval_end": None,
        "created_at": "2026-12-02T00:00:00+00:00",
        "updated_at": f"2026-12-02T00:{int(seconds) // 60:02d}:{int(seconds) % 60:02d}+00:00",
        "age_seconds": seconds,
        "revision": revision,
        "url": f"/sinks/s/epochs/{epoch}",
    }


def marks(svg: str) -> dict[int, tuple[float, float, str]]:
    """Per epoch: the mark's x, y and status."""
    found = {}
    for part in svg.split('<circle cx="')[1:]:
        if 'class="mark"' not in part:
            continue
        x, rest = part.split('"', 1)
        y = rest.split('cy="', 1)[1].split('"', 1)[0]
        epoch = int(part.split('data-epoch="', 1)[1].split('"', 1)[0])
        found[epoch] = (float(x), float(y), part.split('data-status="', 1)[1].split('"', 1)[0])
    return found


def test_marks_go_right_with_time_and_up_with_the_wait_for_the_commit() -> None:
    svg = epoch_chart([row(3 * H, "Committed", 60), row(1 * H, "Committed", 600), row(2 * H, "Aborted", 0)])
    assert svg is not None
    drawn = marks(str(svg))
    assert drawn[1 * H][0] < drawn[2 * H][0] < drawn[3 * H][0]  # by data interval, whatever the row order
    assert drawn[1 * H][1] < drawn[3 * H][1]  # ten minutes to commit stands higher than one
    assert drawn[2 * H][1] == TOP and drawn[2 * H][2] == "Aborted"  # no commit: the top line
    assert 'href="/sinks/s/epochs/3600000"' in str(svg) and "committed after 10 min" in str(svg)


def test_a_revision_is_ringed_and_a_pending_epoch_hollow() -> None:
    svg = str(epoch_chart([row(1 * H, "Committed", 30, revision=2), row(2 * H, "Pending", 90)]))
    assert svg.count('class="revised"') == 1 and ">r2<" in svg
    pending = svg.split('data-epoch="7200000"', 1)[0].rsplit("<circle", 1)[1]
    assert 'fill="none"' in pending and "pending for 90 s" in svg


def test_nothing_is_drawn_without_a_dated_epoch_and_text_is_escaped() -> None:
    assert epoch_chart([]) is None
    assert epoch_chart([{**row(H, "Committed", 5), "interval_start": None}]) is None
    evil = {**row(H, "Committed", 5), "url": '"><script>alert(1)</script>'}
    assert "<script>" not in str(epoch_chart([evil]))


def test_an_epoch_keeping_a_warning_is_marked_and_its_tooltip_says_the_warning() -> None:
    """A refused reprocess changes nothing on the row but its warning: the picture shows it."""
    refused = {**row(2 * H, "Committed", 30), "warning": "refused: an upsert of an epoch before the last committed"}
    svg = str(epoch_chart([row(1 * H, "Committed", 30), refused]))
    assert svg.count('class="warned"') == 1 and 'class="warned" fill="#b45309" data-epoch="7200000"' in svg
    assert "warning: refused: an upsert of an epoch before the last committed" in svg


def test_a_committed_epoch_stands_at_its_commit_decision_not_at_a_later_warning() -> None:
    decided = {**row(1 * H, "Committed", 3000), "commit_decided_at": "2026-12-02T00:00:30+00:00"}
    svg = epoch_chart([decided, row(2 * H, "Committed", 60)])
    drawn = marks(str(svg))
    assert drawn[1 * H][1] > drawn[2 * H][1]  # 30 s to its decision, below the one a minute after persist
    assert "committed after 30 s" in str(svg)
