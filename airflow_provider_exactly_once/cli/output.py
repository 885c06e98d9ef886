"""How ``eo-sink`` answers: its exit codes, JSON for scripts, plain tables for people, instants and
intervals as the tasks log them; every cell made safe to print (``core.redact``: text read back from
the meta store may carry terminal controls)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from airflow_provider_exactly_once.core.redact import safe_text
from airflow_provider_exactly_once.runtime.run_epochs import instant_text, interval_text

#: 0 done, 1 refused or failed, 2 bad usage (argparse's convention), 3 busy (another holds the sink).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3


def print_json(out: TextIO, value: Any) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def table(out: TextIO, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    from tabulate import tabulate  # type: ignore[import-untyped]  # no stubs; plain text tables

    shown = [[safe_text(str(cell)) for cell in row] for row in rows]
    out.write(tabulate(shown, headers=headers, tablefmt="simple", disable_numparse=True) + "\n")


def age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m" if minutes else f"{int(seconds)}s"


def instant(at: datetime | None) -> str:
    return "" if at is None else instant_text(at)


def interval(start: datetime | None, end: datetime | None) -> str:
    """As the tasks log it; the end is ``...`` when the store has no record of the run."""
    return "" if start is None else interval_text(start, end)


#: Before this instant an epoch number is no date a run had (an allocated or custom epoch): the
#: number alone is shown.
_DATED_FROM = datetime(2000, 1, 1, tzinfo=UTC)


def epoch_text(epoch: int, start: datetime | None, end: datetime | None, logical: datetime | None) -> str:
    """``2026-01-01T00:00Z (1767225600000)``: an epoch as a date with its id beside, the date its
    run's data interval starts, else its run's logical date (a manual run has no interval), else,
    without a record of its run, the instant the number stands for (none for a small number)."""
    when = start if end is not None else logical or start
    if when is None or (end is None and logical is None and when < _DATED_FROM):
        return str(epoch)
    return f"{instant_text(when)} ({epoch})"


def short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = text.splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"
