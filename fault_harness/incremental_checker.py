"""What an incremental pipeline's run must end with (``mode="incremental"``): its sink holds every
row its upstream table holds, exactly once, and every committed snapshot says which upstream
snapshots it consumed as the meta store's chain of reserved ranges does.

The rows are judged from the two tables alone, read by an independent reader (DuckDB's iceberg
extension; pyiceberg where DuckDB is not installed), DuckDB and pyiceberg held against each other
on both tables' current snapshots (``readers``). The chain (``core.input_ranges``: the links with
their epochs' statuses, read from the meta store by the harness) is judged as the second record
of the same facts: it is what a bug could have made wrong, so it is compared, never trusted.

Anomalies:

- ``missing``: an upstream row is not in the sink (or a row the producer appended is not in the
  upstream);
- ``duplicated``: a row is in the sink more often than upstream (or an id twice upstream);
- ``unsourced``: a sink row the upstream never held (an id it has not, or other values);
- ``readers``: DuckDB and pyiceberg read different rows from a table's current snapshot;
- ``consumed``: the chain and the committed snapshots disagree with each other or with the run: an
  epoch not Committed (or not Aborted, for an epoch whose every write crashed), a committed epoch
  without a reserved range, a range that does not start where the last committed one ended (a gap
  or an overlap), a range of another table, the last committed range not ending at the upstream's
  current snapshot (appended rows left unread), a marked snapshot whose source summary
  (``exactly-once.source.table/after-snapshot-id/to-snapshot-id``) is not its epoch's reserved
  range, or one of an epoch with no range;
- ``snapshots``: a committed epoch with a non-empty range has a number of marked snapshots outside
  what the run expects (one, plus its revisions); an epoch with an empty range or not committed has
  any (an empty write commits no snapshot);
- ``revisions``: as for the append pipelines (``checker.check_revisions``);
- ``history``: at a marked snapshot, the sink's rows are not exactly the upstream rows of the ranges
  committed by then (each range's rows: the upstream at its end minus the upstream at its start,
  the upstream being append-only), or a snapshot cannot be read;
- ``orphan``, ``lost``: as for the append pipelines (``checker.check_files``).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table

from airflow_provider_exactly_once.core.input_ranges import Link, SnapshotRange
from airflow_provider_exactly_once.sinks.iceberg.markers import (
    SOURCE_AFTER_KEY,
    SOURCE_TABLE_KEY,
    SOURCE_TO_KEY,
    marker_of,
)
from fault_harness.checker import Anomaly, CheckResult, check_files, check_revisions
from fault_harness.landed import Row
from fault_harness.table_reads import IndependentReader, Marked, Storage, marked_snapshots, pyiceberg_rows

COMMITTED, ABORTED = "Committed", "Aborted"


@dataclass
class Produced:
    """What the harness's producer appended to an upstream table (``incremental.produce_upstream``)."""

    table: str
    #: The ids of the rows of every append that returned (an append that raised may have landed).
    ids: list[str] = field(default_factory=list)
    appends: int = 0
    failed_appends: int = 0
    #: The upstream's current snapshot once the producer stopped.
    last_snapshot_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "rows": len(self.ids),
            "appends": self.appends,
            "failed_appends": self.failed_appends,
            "last_snapshot_id": self.last_snapshot_id,
        }


def check_incremental(
    table: Table,
    upstream: Table,
    sink_id: str,
    links: Sequence[Link],
    statuses: Mapping[int, str],
    *,
    epochs: Sequence[int],
    aborted: Collection[int] = (),
    commits: Mapping[int, tuple[int, int]] | None = None,
    produced: Produced | None = None,
    orphan_grace_s: float,
    now: float | None = None,
    independent: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> CheckResult:
    """Judge an incremental sink's ``table`` against its ``upstream`` table (module docstring).

    ``links``, ``statuses``: the sink's chain and its epochs' row statuses (``Committed``,
    ``Aborted``, ``Pending``), as the meta store holds them. ``epochs``: every epoch the pipeline
    ran; ``aborted``: those the run made fail (every write try crashed), the others must be
    committed. ``commits``: per epoch, the least and most marked snapshots a committed epoch with a
    non-empty range may have (default one and one; a reprocessed epoch has its revisions more).
    ``produced``: the producer's record (``None``: none recorded, itself an anomaly)."""
    now = time.time() if now is None else now
    result = CheckResult()
    on_s3 = table.location().startswith("s3://")
    reader = IndependentReader.open(storage_options if on_s3 else None) if independent else None
    result.reader = "duckdb and pyiceberg" if reader is not None else "pyiceberg"
    marked = marked_snapshots(table, sink_id)
    try:
        rows = _Rows(reader)
        sink_rows = rows.current(table, "sink", result)
        upstream_rows = rows.current(upstream, "upstream", result)
        _check_rows(sink_rows, upstream_rows, produced, result)
        upstream_name = _name(upstream)
        by_epoch = _check_chain(links, statuses, upstream, upstream_name, epochs, aborted, result)
        _check_markers(marked, by_epoch, statuses, epochs, aborted, dict(commits or {}), result)
        _check_history(table, upstream, marked, by_epoch, rows, result)
    finally:
        if reader is not None:
            reader.close()
    check_files(table, marked, orphan_grace_s, now, result, Storage(storage_options))
    result.rows_visible, result.rows_expected = len(sink_rows), len(upstream_rows)
    result.hours = dict(Counter(statuses.get(e, "none") for e in epochs))
    result.incremental = _figures(upstream, links, statuses, produced)
    return result


def _name(table: Table) -> str:
    """``namespace.table``, as the input names it and the chain and the summaries record it."""
    return ".".join(table.name()[-2:])


class _Rows:
    """Rows of a table at a snapshot, by the independent reader when there is one, cached by snapshot."""

    def __init__(self, reader: IndependentReader | None) -> None:
        self._reader = reader
        self._cache: dict[tuple[str, int], list[Row]] = {}

    def at(self, table: Table, snapshot_id: int | None) -> list[Row]:
        if snapshot_id is None:
            return []
        key = (table.metadata_location, snapshot_id)
        if key not in self._cache:
            self._cache[key] = (
                self._reader.rows(table, snapshot_id)
                if self._reader is not None
                else pyiceberg_rows(table, snapshot_id)
            )
        return self._cache[key]

    def current(self, table: Table, what: str, result: CheckResult) -> list[Row]:
        """The current snapshot's rows; a ``readers`` anomaly when DuckDB and pyiceberg differ."""
        current = table.metadata.current_snapshot_id
        mine = pyiceberg_rows(table)
        if self._reader is None or current is None:
            return mine
        try:
            other = self.at(table, current)
        except Exception as exc:  # an unreadable snapshot is what the check is for
            result.anomalies.append(
                Anomaly("readers", None, f"DuckDB cannot read the {what}'s snapshot {current}: {exc}")
            )
            return mine
        if Counter(other) != Counter(mine):
            only_duck = sum((Counter(other) - Counter(mine)).values())
            only_py = sum((Counter(mine) - Counter(other)).values())
            result.anomalies.append(
                Anomaly(
                    "readers",
                    None,
                    f"the {what}'s current snapshot {current}: {only_duck} rows only DuckDB reads, {only_py} only pyiceberg",
                )
            )
        return other


def _check_rows(sink: list[Row], upstream: list[Row], produced: Produced | None, result: CheckResult) -> None:
    """Every upstream row in the sink once; no sink row the upstream does not hold."""
    up, down = Counter(upstream), Counter(sink)
    twice_upstream = [i for i, n in Counter(r[0] for r in upstream).items() if n > 1]
    if twice_upstream:
        result.anomalies.append(
            Anomaly("duplicated", None, f"{len(twice_upstream)} ids twice in the upstream (e.g. {twice_upstream[0]})")
        )
    if produced is None:
        result.anomalies.append(
            Anomaly("missing", None, "the producer left no record: nothing to hold the upstream to")
        )
    else:
        there = {r[0] for r in upstream}
        lost = [i for i in produced.ids if i not in there]
        if lost:
            result.anomalies.append(
                Anomaly(
                    "missing",
                    None,
                    f"{len(lost)} of the {len(produced.ids)} rows the producer appended are not in the upstream "
                    f"(e.g. {lost[0]})",
                )
            )
    missing = up - down
    if missing:
        example = min(missing)
        result.anomalies.append(
            Anomaly(
                "missing",
                None,
                f"{sum(missing.values())} of the upstream's {len(upstream)} rows are not in the sink (e.g. {example})",
            )
        )
    extra = down - up
    twice = Counter({r: n for r, n in extra.items() if r in up})
    unsourced = Counter({r: n for r, n in extra.items() if r not in up})
    if twice:
        result.anomalies.append(
            Anomaly(
                "duplicated",
                None,
                f"{sum(twice.values())} extra copies in the sink of {len(twice)} upstream rows (e.g. {min(twice)})",
            )
        )
    if unsourced:
        ids = {r[0] for r in upstream}
        other_values = sum(n for r, n in unsourced.items() if r[0] in ids)
        result.anomalies.append(
            Anomaly(
                "unsourced",
                None,
                f"{sum(unsourced.values())} sink rows the upstream does not hold ({other_values} of them with an "
                f"upstream id but other values; e.g. {min(unsourced)})",
            )
        )


def _check_chain(
    links: Sequence[Link],
    statuses: Mapping[int, str],
    upstream: Table,
    upstream_name: str,
    epochs: Sequence[int],
    aborted: Collection[int],
    result: CheckResult,
) -> dict[int, SnapshotRange]:
    """Each epoch's status as the run makes it, and the chain a contiguous cover of the upstream:
    each link starts where the last committed one before it ended (the first at the table's first
    snapshot), and the last committed one ends at the upstream's current snapshot. Returns the
    ranges by epoch."""
    by_epoch: dict[int, SnapshotRange] = {}
    problems: dict[int | None, list[str]] = defaultdict(list)
    known = set(epochs)
    for epoch in epochs:
        expected = ABORTED if epoch in aborted else COMMITTED
        status = statuses.get(epoch)
        if status != expected:
            problems[epoch].append(f"is {status or 'not in the meta store'}, expected {expected}")
    end: int | None = None
    committed_end_of = "the table's first snapshot"
    for link in sorted(links, key=lambda link: link.position):
        by_epoch[link.epoch] = link.range
        if link.epoch not in known:
            problems[link.epoch].append(f"has a range ({link.range.describe()}) but is not an epoch of the run")
        if link.range.table != upstream_name:
            problems[link.epoch].append(f"reserved a range of {link.range.table}, not of {upstream_name}")
        if link.range.after_snapshot_id != end:
            problems[link.epoch].append(
                f"reserved {link.range.describe()} at position {link.position}, which does not start where "
                f"{committed_end_of} ended ({end}): a gap or an overlap"
            )
        if statuses.get(link.epoch) == COMMITTED:
            end, committed_end_of = link.range.end, f"epoch {link.epoch}'s committed range"
    for epoch in epochs:
        if statuses.get(epoch) == COMMITTED and epoch not in by_epoch:
            problems[epoch].append("is Committed without a reserved range")
    current = upstream.metadata.current_snapshot_id
    if end != current:
        problems[None].append(
            f"the last committed range ends at snapshot {end} ({committed_end_of}), the upstream's current snapshot "
            f"is {current}: what was appended after it was never delivered"
        )
    for where, found in sorted(problems.items(), key=lambda p: (p[0] is None, p[0] or 0)):
        who = "" if where is None else f"epoch {where} "
        result.anomalies.append(Anomaly("consumed", where, who + "; ".join(found)))
    return by_epoch


def _summary_range(marked: Marked) -> tuple[str | None, int | None, int | None]:
    props = marker_of(marked.snapshot) or {}

    def number(key: str) -> int | None:
        value = props.get(key)
        try:
            return None if value is None else int(value)
        except ValueError:
            return -1

    return props.get(SOURCE_TABLE_KEY), number(SOURCE_AFTER_KEY), number(SOURCE_TO_KEY)


def _check_markers(
    marked: list[Marked],
    by_epoch: Mapping[int, SnapshotRange],
    statuses: Mapping[int, str],
    epochs: Sequence[int],
    aborted: Collection[int],
    commits: Mapping[int, tuple[int, int]],
    result: CheckResult,
) -> None:
    """Each marked snapshot's source summary equals its epoch's reserved range; each epoch has the
    marked snapshots the run expects."""
    result.marked_snapshots = len(marked)
    result.revisions = sum(1 for m in marked if m.revision > 0)
    per_epoch: dict[int, list[Marked]] = defaultdict(list)
    for m in marked:
        per_epoch[m.epoch].append(m)
        reserved = by_epoch.get(m.epoch)
        summary = _summary_range(m)
        if reserved is None:
            result.anomalies.append(
                Anomaly("consumed", m.epoch, f"snapshot {m.snapshot_id} ({summary}) is of an epoch with no range")
            )
        elif summary != (reserved.table, reserved.after_snapshot_id, reserved.to_snapshot_id):
            result.anomalies.append(
                Anomaly(
                    "consumed",
                    m.epoch,
                    f"snapshot {m.snapshot_id} says it consumed (table, after, to) {summary}; the meta store's "
                    f"chain reserved {(reserved.table, reserved.after_snapshot_id, reserved.to_snapshot_id)} "
                    f"({reserved.describe()})",
                )
            )
    for epoch in sorted(set(per_epoch) | set(epochs)):
        reserved = by_epoch.get(epoch)
        delivers = epoch not in aborted and reserved is not None and not reserved.empty
        low, high = commits.get(epoch, (1, 1)) if delivers else (0, 0)
        count = len(per_epoch.get(epoch, []))
        if not low <= count <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            what = "an aborted epoch" if epoch in aborted else "no range" if reserved is None else reserved.describe()
            result.anomalies.append(
                Anomaly(
                    "snapshots",
                    epoch,
                    f"{count} snapshots carry the marker, expected {expected} ({what}; {statuses.get(epoch)})",
                )
            )
    check_revisions(per_epoch, result)


def _check_history(
    table: Table,
    upstream: Table,
    marked: list[Marked],
    by_epoch: Mapping[int, SnapshotRange],
    rows: _Rows,
    result: CheckResult,
) -> None:
    """At each marked snapshot the sink shows exactly the rows of the ranges committed by then."""
    problems: dict[int | None, list[str]] = defaultdict(list)
    ranges: dict[int, Counter[Row]] = {}
    for m in marked:
        result.snapshots_checked += 1
        committed = {earlier.epoch for earlier in marked if earlier.order <= m.order}
        try:
            expected: Counter[Row] = Counter()
            for epoch in committed:
                reserved = by_epoch.get(epoch)
                if reserved is None:
                    continue  # the marker check's anomaly says it
                if epoch not in ranges:
                    ranges[epoch] = Counter(rows.at(upstream, reserved.to_snapshot_id)) - Counter(
                        rows.at(upstream, reserved.after_snapshot_id)
                    )
                expected += ranges[epoch]
            shown = Counter(rows.at(table, m.snapshot_id))
        except Exception as exc:
            problems[None].append(f"snapshot {m.snapshot_id} cannot be read: {type(exc).__name__}: {exc}")
            continue
        if shown != expected:
            lacking, extra = expected - shown, shown - expected
            problems[m.epoch].append(
                f"sink snapshot {m.snapshot_id} (epoch {m.epoch}, revision {m.revision}) shows {sum(shown.values())} "
                f"rows, the upstream rows of the {len(committed)} ranges committed by then are "
                f"{sum(expected.values())}: {sum(lacking.values())} lacking, {sum(extra.values())} more"
            )
    for where, found in sorted(problems.items(), key=lambda p: (p[0] is None, p[0] or 0)):
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        result.anomalies.append(Anomaly("history", where, found[0] + more))


def _figures(
    upstream: Table, links: Sequence[Link], statuses: Mapping[int, str], produced: Produced | None
) -> dict[str, Any]:
    """For the report: the upstream, the producer, and how many snapshots each committed range held."""
    parents = {s.snapshot_id: s.parent_snapshot_id for s in upstream.metadata.snapshots}
    sizes = []
    for link in sorted(links, key=lambda link: link.position):
        if statuses.get(link.epoch) != COMMITTED:
            continue
        count, at = 0, link.range.to_snapshot_id
        while at is not None and at != link.range.after_snapshot_id and count <= len(parents):
            count, at = count + 1, parents.get(at)
        sizes.append(count)
    return {
        "upstream_snapshots": len(parents),
        "producer": None if produced is None else produced.to_dict(),
        "ranges": len(links),
        "committed_ranges": len(sizes),
        "empty_committed_ranges": sum(1 for n in sizes if n == 0),
        "snapshots_per_committed_range": sizes,
        "aborted_ranges": sum(1 for link in links if statuses.get(link.epoch) == ABORTED),
    }
