"""Epoch numbers derived from Airflow data intervals.

An epoch is the interval start in milliseconds since the Unix epoch, so the same interval always
maps to the same epoch: a rerun, a clear or a backfill of that interval addresses the same row and
the same marker, which is what makes the tasks idempotent (invariant 6).
"""

from __future__ import annotations

from datetime import UTC, datetime

from .errors import InvalidIdentifier
from .identifiers import check_epoch


def epoch_from_interval_start(start: datetime) -> int:
    if start.tzinfo is None or start.utcoffset() is None:
        raise InvalidIdentifier(f"data interval start {start.isoformat()} has no time zone; epochs need an instant")
    delta = start.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return check_epoch(delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000)


def epoch_start(epoch: int) -> datetime:
    """The instant an interval-derived epoch starts at (for templating paths and log lines)."""
    check_epoch(epoch)
    return datetime.fromtimestamp(epoch / 1000, tz=UTC)
