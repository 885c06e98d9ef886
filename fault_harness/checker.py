"""What a fault run must end with, judged from the landed input and the Iceberg table alone.

The meta store and Airflow's own state are deliberately not consulted: they are what a bug could
have made wrong. The input says which rows exist and which hours were checkpointed (``_SUCCESS``)
or given up (``_FAILED``); the table says what is visible (a scan), how it got there (snapshots and
their summary markers) and what lies on disk (the table's data directory).

An hour's input may change: a user lands it anew and reprocesses the epoch (a cleared run, a
reprocess backfill), and the epoch's committed write is then *replaced* by a revision. The hour's
landing files as they are at the end are its latest input; the harness keeps every earlier input
of the hour in a history folder (``<history>/YYYY/MM/DD/HH/v<N>/``, oldest first), so that
what older snapshots show can be judged too. Rows are compared in full (event id, user, type, event
time to the microsecond, amount), not by id only: a replaced write's rows keep most of their ids.

Anomalies, in the current snapshot:

- ``missing``: a row (event id) of a checkpointed hour's latest input is not visible;
- ``stale``: a visible row of a checkpointed hour is not in its latest input (an id the latest input
  removed, or other values than the latest input gives it): an earlier input, not replaced;
- ``duplicated``: a row is visible more than once;
- ``visible_failed``: a row of a ``_FAILED`` hour is visible;
- ``visible_unsettled``: a row of an hour without a marker yet is visible (before its checkpoint);

in the table's history (every snapshot carrying a marker of the sink):

- ``snapshots``: a checkpointed hour with rows has a number of marked snapshots outside what the
  run expects (one, plus one for each reprocessing of the committed epoch: ``commits``), or an
  hour that is not checkpointed (failed, unsettled, never landed) has one at all;
- ``revisions``: two marked snapshots of one epoch carry the same write id (a write committed
  twice), or the epoch's revision numbers (``exactly-once.revision``, absent on a first commit)
  are not 0, 1, 2, ... in snapshot order;
- ``history``: at a marked snapshot (and at the current one), an epoch committed by then shows data
  files of other than exactly one write, the one its latest marked snapshot committed (never the
  old and the new write of a replaced hour, never none), or its rows, read by an independent
  reader (DuckDB's iceberg extension; pyiceberg when DuckDB is not installed), equal none of the
  hour's inputs; an hour not yet committed shows rows; or the snapshot cannot be read;
- ``readers``: DuckDB and pyiceberg read different rows from the current snapshot;

and on disk:

- ``orphan``: a data file on disk, referenced by no snapshot in the table's history, older than the
  grace period (recovery must have removed it). Files of a replaced write stay referenced by the
  snapshots before the replacement, so they are not orphans;
- ``lost``: a data file some snapshot of the table's history references is not on disk (a replaced
  write's files are deleted only after snapshot expiry, and the harness expires none).

Rows whose ids were never landed (another writer's) are counted, never judged.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from airflow_provider_exactly_once.sinks.iceberg.markers import (
    EPOCH_KEY,
    REVISION_KEY,
    SINK_ID_KEY,
    WRITE_ID_KEY,
    marker_of,
)

AnomalyKind = Literal[
    "missing",
    "stale",
    "duplicated",
    "visible_failed",
    "visible_unsettled",
    "snapshots",
    "revisions",
    "history",
    "readers",
    "orphan",
    "lost",
]
#: One row as both the input and the table give it: event id, user id, event type, event time
#: (microseconds since the epoch, UTC) and amount.
Row = tuple[str, int | None, str | None, int | None, float | None]
COLUMNS = ("event_id", "user_id", "event_type", "event_time", "amount")
_UNIX = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Anomaly:
    kind: AnomalyKind
    #: The hour (epoch, ms) concerned, when there is one.
    epoch: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LandedHour:
    start: dt.datetime
    epoch: int
    #: The event ids of the hour's latest input.
    ids: tuple[str, ...]
    status: Literal["completed", "failed", "unsettled"]
    #: The hour's latest input, row by row.
    rows: tuple[Row, ...] = ()
    #: Every earlier input of the hour (from the history folder), oldest first.
    earlier: tuple[tuple[Row, ...], ...] = ()

    @property
    def versions(self) -> tuple[tuple[Row, ...], ...]:
        return (*self.earlier, self.rows)


@dataclass
class CheckResult:
    anomalies: list[Anomaly] = field(default_factory=list)
    hours: dict[str, int] = field(default_factory=dict)
    rows_visible: int = 0
    #: Rows the latest input of the checkpointed hours holds: what ``rows_visible`` must be, foreign rows aside.
    rows_expected: int = 0
    foreign_rows: int = 0
    files_on_disk: int = 0
    #: Snapshots carrying the sink's marker; of those, revisions (replacements of a committed write).
    marked_snapshots: int = 0
    revisions: int = 0
    #: Hours whose input was landed more than once.
    relanded_hours: int = 0
    #: Snapshots whose files and rows were judged (the marked ones and the current one), and by what.
    snapshots_checked: int = 0
    reader: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "anomalies": [a.to_dict() for a in self.anomalies],
            "hours": self.hours,
            "rows_visible": self.rows_visible,
            "rows_expected": self.rows_expected,
            "foreign_rows": self.foreign_rows,
            "files_on_disk": self.files_on_disk,
            "marked_snapshots": self.marked_snapshots,
            "revisions": self.revisions,
            "relanded_hours": self.relanded_hours,
            "snapshots_checked": self.snapshots_checked,
            "reader": self.reader,
        }


def epoch_of(start: dt.datetime) -> int:
    return int((start - _UNIX).total_seconds() * 1000)


# -- the input ------------------------------------------------------------------------------------------


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


# -- the table ------------------------------------------------------------------------------------------


def _local(path: str) -> str:
    return path.removeprefix("file://")


def referenced_files(table: Table) -> set[str]:
    """Every data file any snapshot of the table's history references (added or still live)."""
    io = table.io
    paths: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                paths.add(_local(entry.data_file.file_path))
    return paths


@dataclass(frozen=True)
class Marked:
    """A snapshot carrying the sink's marker: which epoch and write it committed, as which revision."""

    order: int
    snapshot: Snapshot
    epoch: int
    write_id: str
    revision: int
    #: The data files the snapshot added (the write's files).
    added: frozenset[str]

    @property
    def snapshot_id(self) -> int:
        return self.snapshot.snapshot_id


def _in_commit_order(table: Table) -> list[Snapshot]:
    indexed = list(enumerate(table.metadata.snapshots))
    indexed.sort(key=lambda p: (p[1].sequence_number or 0, p[0]))
    return [s for _, s in indexed]


def added_files(table: Table, snapshot: Snapshot) -> frozenset[str]:
    paths: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status == ManifestEntryStatus.ADDED:
                paths.add(_local(entry.data_file.file_path))
    return frozenset(paths)


def marked_snapshots(table: Table, sink_id: str) -> list[Marked]:
    """The snapshots carrying ``sink_id``'s marker, in commit order."""
    found = []
    for order, snapshot in enumerate(_in_commit_order(table)):
        marker = marker_of(snapshot)
        if marker is None or marker[SINK_ID_KEY] != sink_id:
            continue
        try:
            revision = int(marker.get(REVISION_KEY, "0"))
        except ValueError:
            revision = -1
        found.append(
            Marked(
                order,
                snapshot,
                int(marker[EPOCH_KEY]),
                marker.get(WRITE_ID_KEY, ""),
                revision,
                added_files(table, snapshot),
            )
        )
    return found


def _rows_of_arrow(data: pa.Table) -> list[Row]:
    data = data.select(list(COLUMNS))
    columns = [data.column(name) for name in COLUMNS]
    columns[3] = columns[3].cast(pa.int64())  # timestamp[us, UTC] -> microseconds
    return [(str(e), u, t, at, a) for e, u, t, at, a in zip(*(c.to_pylist() for c in columns), strict=True)]


def pyiceberg_rows(table: Table, snapshot_id: int | None = None) -> list[Row]:
    if snapshot_id is None and table.metadata.current_snapshot_id is None:
        return []
    return _rows_of_arrow(table.scan(snapshot_id=snapshot_id, selected_fields=COLUMNS).to_arrow())


class IndependentReader:
    """DuckDB's iceberg extension, loaded from its PyPI packages (never the network), as in
    ``tests/support/independent_reader.py``: a bug shared by the commit path and pyiceberg's scan
    cannot hide from it. ``None`` from ``open`` when DuckDB is not installed (the dev group)."""

    name = "duckdb"

    def __init__(self, connection: Any) -> None:
        self._con = connection

    @classmethod
    def open(cls) -> IndependentReader | None:
        try:
            import duckdb
            import duckdb_extension_avro  # type: ignore[import-untyped]
            import duckdb_extension_iceberg  # type: ignore[import-untyped]
        except ImportError:
            return None

        def extension(package: Any, name: str) -> str:
            found = sorted(Path(package.__path__[0]).glob(f"extensions/*/{name}.duckdb_extension"))
            if not found:
                raise RuntimeError(f"{package.__name__} ships no {name}.duckdb_extension")
            return str(found[-1])

        con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
        con.execute(f"LOAD '{extension(duckdb_extension_avro, 'avro')}'")
        con.execute(f"LOAD '{extension(duckdb_extension_iceberg, 'iceberg')}'")
        return cls(con)

    def rows(self, table: Table, snapshot_id: int) -> list[Row]:
        query = (
            "SELECT event_id, user_id, event_type, epoch_us(event_time), amount "
            f"FROM iceberg_scan(?, snapshot_from_id => {int(snapshot_id)})"
        )
        return [
            (str(e), u, t, at, a)
            for e, u, t, at, a in self._con.execute(query, [_local(table.metadata_location)]).fetchall()
        ]

    def close(self) -> None:
        self._con.close()


# -- the verdict ----------------------------------------------------------------------------------------


def _hour_name(hour: LandedHour) -> str:
    return f"{hour.start:%Y-%m-%dT%H}"


def _matching_version(rows: Counter[Row], hour: LandedHour) -> int | None:
    for n, version in enumerate(hour.versions):
        if Counter(version) == rows:
            return n
    return None


def _describe_mismatch(rows: list[Row], hour: LandedHour) -> str:
    ids = Counter(r[0] for r in rows)
    twice = sum(n - 1 for n in ids.values() if n > 1)
    sizes = "/".join(str(len(v)) for v in hour.versions)
    return f"{len(rows)} rows ({twice} ids twice), matching none of its {len(hour.versions)} input(s) of {sizes} rows"


def check(
    table: Table,
    landing: Path,
    sink_id: str,
    *,
    orphan_grace_s: float,
    now: float | None = None,
    history: Path | None = None,
    commits: Mapping[int, tuple[int, int]] | None = None,
    independent: bool = True,
) -> CheckResult:
    """Judge one sink's table against its landed input (see the module docstring).

    ``history``: the folder of the hours' earlier inputs. ``commits``: per epoch (ms), the least and
    most marked snapshots a checkpointed hour may have (default one and one): one more for each
    reprocessing of the committed epoch, a range where the run cannot know (a backfill racing the
    scheduled runs). ``independent``: read the snapshots with DuckDB as well (when installed).
    """
    now = time.time() if now is None else now
    result = CheckResult()
    hours = landed_hours(landing, history)
    result.hours = dict(Counter(h.status for h in hours))
    result.relanded_hours = sum(1 for h in hours if h.earlier)
    result.rows_expected = sum(len(h.rows) for h in hours if h.status == "completed")
    by_epoch = {h.epoch: h for h in hours}
    owner: dict[str, LandedHour] = {row[0]: h for h in hours for version in h.versions for row in version}
    commits = dict(commits or {})

    reader = IndependentReader.open() if independent else None
    result.reader = "duckdb and pyiceberg" if reader is not None else "pyiceberg"
    try:
        _check_current(table, hours, owner, result, reader)
        marked = marked_snapshots(table, sink_id)
        _check_markers(marked, hours, by_epoch, commits, result)
        _check_history(table, marked, hours, owner, result, reader)
    finally:
        if reader is not None:
            reader.close()
    _check_files(table, marked, orphan_grace_s, now, result)
    return result


def _check_current(
    table: Table,
    hours: list[LandedHour],
    owner: Mapping[str, LandedHour],
    result: CheckResult,
    reader: IndependentReader | None,
) -> None:
    rows = pyiceberg_rows(table)
    current = table.metadata.current_snapshot_id
    if reader is not None and current is not None:
        try:
            other = reader.rows(table, current)
        except Exception as exc:  # an unreadable snapshot is what the check is for
            result.anomalies.append(
                Anomaly("readers", None, f"DuckDB cannot read the current snapshot {current}: {exc}")
            )
        else:
            if Counter(other) != Counter(rows):
                only_duck = sum((Counter(other) - Counter(rows)).values())
                only_py = sum((Counter(rows) - Counter(other)).values())
                result.anomalies.append(
                    Anomaly(
                        "readers",
                        None,
                        f"current snapshot {current}: {only_duck} rows only DuckDB reads, {only_py} only pyiceberg",
                    )
                )
    visible: Counter[str] = Counter(r[0] for r in rows)
    result.rows_visible = len(rows)
    result.foreign_rows = sum(n for i, n in visible.items() if i not in owner)
    by_hour = _rows_by_hour(rows, owner)
    for hour in hours:
        shown = by_hour.get(hour.epoch, [])
        name = _hour_name(hour)
        duplicates = sum(n - 1 for n in Counter(r[0] for r in shown).values() if n > 1)
        if duplicates:
            result.anomalies.append(Anomaly("duplicated", hour.epoch, f"{duplicates} extra rows of {name}"))
        if hour.status == "completed":
            ids = {r[0] for r in shown}
            missing = [i for i in hour.ids if i not in ids]
            if missing:
                result.anomalies.append(
                    Anomaly(
                        "missing",
                        hour.epoch,
                        f"{len(missing)} of {len(hour.ids)} rows of {name} (e.g. {missing[0]})",
                    )
                )
            latest = set(hour.rows)
            stale = [r for r in shown if r not in latest]
            if stale:
                removed = sum(1 for r in stale if r[0] not in set(hour.ids))
                result.anomalies.append(
                    Anomaly(
                        "stale",
                        hour.epoch,
                        f"{len(stale)} visible rows of {name} are not its latest input ({removed} of them ids it "
                        f"no longer has; e.g. {stale[0]})",
                    )
                )
        elif shown:
            kind: AnomalyKind = "visible_failed" if hour.status == "failed" else "visible_unsettled"
            result.anomalies.append(Anomaly(kind, hour.epoch, f"{len(shown)} rows of {name} visible"))


def _check_markers(
    marked: list[Marked],
    hours: list[LandedHour],
    by_epoch: Mapping[int, LandedHour],
    commits: Mapping[int, tuple[int, int]],
    result: CheckResult,
) -> None:
    result.marked_snapshots = len(marked)
    result.revisions = sum(1 for m in marked if m.revision > 0)
    per_epoch: dict[int, list[Marked]] = defaultdict(list)
    for m in marked:
        per_epoch[m.epoch].append(m)
    for epoch in sorted(set(per_epoch) | {h.epoch for h in hours}):
        hour = by_epoch.get(epoch)
        count = len(per_epoch.get(epoch, []))
        with_rows = hour is not None and hour.status == "completed" and any(hour.versions)
        low, high = commits.get(epoch, (1, 1)) if with_rows else (0, 0)
        if not low <= count <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            status = "never landed" if hour is None else hour.status
            result.anomalies.append(
                Anomaly("snapshots", epoch, f"{count} snapshots carry the marker, expected {expected} ({status})")
            )
    for epoch, snapshots in sorted(per_epoch.items()):
        writes = Counter(m.write_id for m in snapshots)
        for write_id, n in sorted(writes.items()):
            if n > 1:
                ids = [m.snapshot_id for m in snapshots if m.write_id == write_id]
                result.anomalies.append(
                    Anomaly("revisions", epoch, f"write {write_id} committed {n} times (snapshots {ids})")
                )
        numbers = [m.revision for m in snapshots]
        if numbers != list(range(len(numbers))):
            result.anomalies.append(
                Anomaly(
                    "revisions",
                    epoch,
                    f"revision numbers {numbers} in snapshot order (snapshots {[m.snapshot_id for m in snapshots]}), "
                    f"expected {list(range(len(numbers)))}",
                )
            )


def _check_history(
    table: Table,
    marked: list[Marked],
    hours: list[LandedHour],
    owner: Mapping[str, LandedHour],
    result: CheckResult,
    reader: IndependentReader | None,
) -> None:
    """Each marked snapshot, and the current one: every committed epoch shows one write, whole."""
    current = table.metadata.current_snapshot_id
    checkpoints: list[tuple[int, int]] = [(m.order, m.snapshot_id) for m in marked]
    if current is not None and current not in {m.snapshot_id for m in marked}:
        checkpoints.append((len(table.metadata.snapshots) + 1, current))
    added_by: dict[str, Marked] = {path: m for m in marked for path in m.added}
    problems: dict[int | None, list[str]] = defaultdict(list)
    for order, snapshot_id in checkpoints:
        result.snapshots_checked += 1
        latest: dict[int, Marked] = {}
        for m in marked:
            if m.order <= order:
                latest[m.epoch] = m  # commit order: the last one wins
        try:
            live = {_local(task.file.file_path) for task in table.scan(snapshot_id=snapshot_id).plan_files()}
            rows = reader.rows(table, snapshot_id) if reader is not None else pyiceberg_rows(table, snapshot_id)
        except Exception as exc:
            problems[None].append(f"snapshot {snapshot_id} cannot be read: {type(exc).__name__}: {exc}")
            continue
        writes: dict[int, set[str]] = defaultdict(set)
        for path in live:
            adder = added_by.get(path)
            if adder is not None:
                writes[adder.epoch].add(adder.write_id)
        for epoch, last in latest.items():
            shown = writes.get(epoch, set())
            if last.added and (shown != {last.write_id} or not last.added <= live):
                lacking = len(last.added - live)
                problems[epoch].append(
                    f"snapshot {snapshot_id} shows files of write(s) {sorted(shown)}, expected only {last.write_id} "
                    f"(revision {last.revision}, snapshot {last.snapshot_id}; {lacking} of its files not live)"
                )
        by_hour = _rows_by_hour(rows, owner)
        for hour in hours:
            shown_rows = by_hour.get(hour.epoch, [])
            if hour.epoch in latest:
                if any(hour.versions) and _matching_version(Counter(shown_rows), hour) is None:
                    problems[hour.epoch].append(
                        f"snapshot {snapshot_id}: {_hour_name(hour)} shows {_describe_mismatch(shown_rows, hour)}"
                    )
            elif shown_rows:
                problems[hour.epoch].append(
                    f"snapshot {snapshot_id}: {len(shown_rows)} rows of {_hour_name(hour)} visible before its first commit"
                )
    for where, found in sorted(problems.items(), key=lambda p: (p[0] is None, p[0] or 0)):
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        result.anomalies.append(Anomaly("history", where, found[0] + more))


def _check_files(
    table: Table, marked: Iterable[Marked], orphan_grace_s: float, now: float, result: CheckResult
) -> None:
    referenced = referenced_files(table)
    added_by = {path: m for m in marked for path in m.added}
    data_dir = Path(_local(table.location())) / "data"
    on_disk: set[str] = set()
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            if not name.endswith(".parquet"):
                continue
            path = os.path.join(root, name)
            on_disk.add(path)
            result.files_on_disk += 1
            if path in referenced:
                continue
            age = now - os.stat(path).st_mtime
            if age > orphan_grace_s:
                rel = os.path.relpath(path, data_dir)
                result.anomalies.append(Anomaly("orphan", None, f"{rel} ({age:.0f} s old, referenced by no snapshot)"))
    for path in sorted(referenced - on_disk):
        if os.path.exists(path):
            continue  # outside the data directory (another writer's location): it is there
        m = added_by.get(path)
        who = f"write {m.write_id} (revision {m.revision})" if m is not None else "no marked write"
        result.anomalies.append(
            Anomaly(
                "lost",
                None if m is None else m.epoch,
                f"{os.path.relpath(path, data_dir)} of {who} is referenced by the table's snapshots but not on disk",
            )
        )


def _rows_by_hour(rows: list[Row], owner: Mapping[str, LandedHour]) -> dict[int, list[Row]]:
    """The rows of each landed hour (by epoch), by the hour that landed their ids; foreign rows left out."""
    by_hour: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        hour = owner.get(row[0])
        if hour is not None:
            by_hour[hour.epoch].append(row)
    return by_hour
