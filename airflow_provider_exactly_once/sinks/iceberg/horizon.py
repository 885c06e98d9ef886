"""How far back a table's snapshots still prove anything about a write (design.md section 5).

A commit's marker lives in its snapshot's summary. Once snapshot expiry may have removed snapshots
as old as a write, the marker's absence no longer proves the write uncommitted, and what those
snapshots added can no longer be looked at: the committer refuses to commit such a write unless an
operator allows it, and a clean-up looks at every file the table's refs can still read instead.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.properties import property_as_int

from airflow_provider_exactly_once.core.errors import MarkerHorizonExceeded


def max_snapshot_age_ms(metadata: TableMetadata, branch: str) -> int:
    """How long the table keeps the branch's snapshots: the ref's own setting, else the table's."""
    ref = metadata.refs.get(branch)
    if ref is not None and ref.max_snapshot_age_ms:
        return ref.max_snapshot_age_ms
    max_age_ms = property_as_int(
        metadata.properties,
        TableProperties.MAX_SNAPSHOT_AGE_MS,
        TableProperties.MAX_SNAPSHOT_AGE_MS_DEFAULT,
    )
    assert max_age_ms is not None  # the default is not None
    return max_age_ms


def check_horizon(
    metadata: TableMetadata,
    branch: str,
    *,
    owner: str,
    table: str,
    since: datetime,
    not_before_ms: int,
    clock_skew: timedelta,
) -> None:
    """Refuse (``MarkerHorizonExceeded``) when snapshots as old as the write may already be expired.

    ``not_before_ms`` is ``since`` minus ``clock_skew``, in milliseconds; ``owner`` names the write.
    """
    max_age_ms = max_snapshot_age_ms(metadata, branch)
    if not_before_ms < time.time() * 1000 - max_age_ms:
        raise MarkerHorizonExceeded(
            f"{owner}: table {table!r} keeps snapshots for "
            f"{timedelta(milliseconds=max_age_ms)} ({TableProperties.MAX_SNAPSHOT_AGE_MS}), but the "
            f"write dates from {since.isoformat()} (minus {clock_skew} clock skew): its marker "
            "may have expired, so its absence does not prove the epoch uncommitted. Check the "
            "table's history, then commit with allow_beyond_horizon=True, or abort."
        )
