"""The landed input of a fault run, as the checker judges the table by it: per hour, its rows,
its checkpoint marker and every earlier input it had (``<history>/YYYY/MM/DD/HH/v<N>/``).

Rows are compared in full (event id, user, type, event time to the microsecond, amount), in the
form ``Row`` that the table's rows are read in too (``fault_harness.table_reads``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

#: One row as both the input and the table give it: event id, user id, event type, event time
#: (microseconds since the epoch, UTC) and amount.
Row = tuple[str, int | None, str | None, int | None, float | None]
COLUMNS = ("event_id", "user_id", "event_type", "event_time", "amount")
_UNIX = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class LandedHour:
    start: dt.datetime
    epoch: int
    #: The event ids of the hour's latest input.
    ids: tuple[str, ...]
    #: ``audit_failed``: checkpointed, but its audit fails (an audited pipeline's bad hour, set by
    #: ``checker.check``, never by the landing): it must never be on ``main``.
    status: Literal["completed", "failed", "unsettled", "audit_failed"]
    #: The hour's latest input, row by row.
    rows: tuple[Row, ...] = ()
    #: Every earlier input of the hour (from the history folder), oldest first.
    earlier: tuple[tuple[Row, ...], ...] = ()

    @property
    def versions(self) -> tuple[tuple[Row, ...], ...]:
        return (*self.earlier, self.rows)


def epoch_of(start: dt.datetime) -> int:
    return int((start - _UNIX).total_seconds() * 1000)


def _micros(value: dt.datetime) -> int:
    delta = value.astimezone(dt.UTC) - _UNIX
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def row_of_event(event: Mapping[str, Any]) -> Row:
    """An event as landed (one JSON line) in the form the table's rows are compared in."""
    at = event.get("event_time")
    amount = event.get("amount")
    user = event.get("user_id")
    return (
        str(event["event_id"]),
        None if user is None else int(user),
        event.get("event_type"),
        None if at is None else _micros(dt.datetime.fromisoformat(str(at))),
        None if amount is None else float(amount),
    )


def read_input(directory: Path) -> tuple[Row, ...]:
    """The rows of the ``*.json`` files directly in ``directory`` (JSON lines), in file order."""
    rows: list[Row] = []
    for path in sorted(directory.glob("*.json")):
        rows += [row_of_event(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return tuple(rows)


def _version_number(path: Path) -> int:
    return int(path.name[1:]) if path.name[1:].isdigit() else -1


def landed_hours(landing: Path, history: Path | None = None) -> list[LandedHour]:
    """Every hour directory ``YYYY/MM/DD/HH`` under ``landing``: its rows, marker and earlier inputs."""
    hours = []
    for directory in sorted(landing.glob("[0-9]*/[0-9]*/[0-9]*/[0-9]*")):
        relative = directory.relative_to(landing)
        y, m, d, h = (int(p) for p in relative.parts)
        start = dt.datetime(y, m, d, h, tzinfo=dt.UTC)
        rows = read_input(directory)
        earlier: list[tuple[Row, ...]] = []
        if history is not None and (history / relative).is_dir():
            versions = [p for p in (history / relative).glob("v*") if p.is_dir() and _version_number(p) >= 0]
            earlier = [read_input(p) for p in sorted(versions, key=_version_number)]
        status: Literal["completed", "failed", "unsettled"] = (
            # _FAILED wins over _SUCCESS, as for the checkpoint source.
            "failed"
            if (directory / "_FAILED").exists()
            else "completed"
            if (directory / "_SUCCESS").exists()
            else "unsettled"
        )
        hours.append(LandedHour(start, epoch_of(start), tuple(r[0] for r in rows), status, rows, tuple(earlier)))
    return hours
