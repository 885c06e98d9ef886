"""Generations: which of two writes of one epoch is the newer, deliberate one.

A retry re-runs a task inside the same run; a clear of the run, ``airflow backfill create
--reprocess-behavior``, or a new run of the same interval re-runs it deliberately, to replace what
the epoch holds (invariant 1). The write carries the generation it was started in, and a write
replaces a committed one only when its generation is newer.

A generation is the run's start and its clear count, as Airflow's scheduler set them when the
write's task started: a clear bumps ``clear_number`` and restarts the run, a reprocess backfill
clears the run, and ``dags test`` of the same date re-creates the run (``clear_number`` 0 again,
a later start). Retries of a task keep both, so they stay in their generation. A zombie task
carries the values of the run it was started in, which it cannot make newer.

Written as text that sorts as it compares, ``2024-06-01T00:00:00.000000Z/0000000003``, so the meta
store can keep and show it as is.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Literal

from .errors import InvalidPreCommit

#: What a sink does with a newer generation's write for a committed epoch: replace it (a revision)
#: or keep what it committed (for inputs that cannot be re-read). ``core.decisions`` applies it.
OnReprocess = Literal["replace", "keep"]
ON_REPROCESS: tuple[OnReprocess, ...] = ("replace", "keep")

_FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z/\d{10}$")


def generation_of(run_started_at: datetime, clear_number: int) -> str:
    """The generation of a write started in a run that started at ``run_started_at`` after ``clear_number`` clears."""
    if run_started_at.tzinfo is None:
        raise InvalidPreCommit(f"run start {run_started_at.isoformat()} has no time zone")
    if isinstance(clear_number, bool) or not isinstance(clear_number, int) or not 0 <= clear_number < 10**10:
        raise InvalidPreCommit(f"clear_number must be a non-negative integer, got {clear_number!r}")
    return f"{run_started_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}Z/{clear_number:010d}"


def check_generation(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FORMAT.match(value):
        raise ValueError(f"generation {value!r} is not '<run start, UTC, microseconds>Z/<clear number, 10 digits>'")
    return value


def is_newer(candidate: str | None, than: str | None) -> bool:
    """Whether a write of generation ``candidate`` may replace one of generation ``than``.

    A write without a generation (outside Airflow, or from before generations were recorded) is
    never newer; anything with one is newer than a row without one.
    """
    if candidate is None:
        return False
    return than is None or candidate > than


def is_older(candidate: str | None, than: str | None) -> bool:
    """Whether a write is from an older generation than the row's (a zombie of a run since cleared)."""
    return candidate is not None and than is not None and candidate < than
