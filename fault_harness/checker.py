"""What a fault run must end with, judged from the landed input and the Iceberg table alone.

The meta store and Airflow's own state are deliberately not consulted: they are what a bug could
have made wrong. The input says which rows exist and which hours were checkpointed (``_SUCCESS``)
or given up (``_FAILED``); the table says what is visible (a scan), how it got there (snapshots and
their summary markers) and what lies on disk (the table's data directory). Anomalies:

- ``missing``: a row of a checkpointed hour is not visible;
- ``duplicated``: a row is visible more than once;
- ``visible_failed``: a row of a ``_FAILED`` hour is visible;
- ``visible_unsettled``: a row of an hour without a marker yet is visible (before its checkpoint);
- ``snapshots``: a checkpointed hour with rows has other than exactly one snapshot carrying its
  marker, or any other hour has one at all;
- ``orphan``: a data file on disk, referenced by no snapshot in the table's history, older than the
  grace period (recovery must have removed it).

Rows whose ids were never landed (another writer's) are counted, never judged.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pyiceberg.table import Table

from airflow_provider_exactly_once.sinks.iceberg.markers import EPOCH_KEY, SINK_ID_KEY, marker_of

AnomalyKind = Literal["missing", "duplicated", "visible_failed", "visible_unsettled", "snapshots", "orphan"]


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
    ids: tuple[str, ...]
    status: Literal["completed", "failed", "unsettled"]


@dataclass
class CheckResult:
    anomalies: list[Anomaly] = field(default_factory=list)
    hours: dict[str, int] = field(default_factory=dict)
    rows_visible: int = 0
    foreign_rows: int = 0
    files_on_disk: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "anomalies": [a.to_dict() for a in self.anomalies],
            "hours": self.hours,
            "rows_visible": self.rows_visible,
            "foreign_rows": self.foreign_rows,
            "files_on_disk": self.files_on_disk,
        }


def epoch_of(start: dt.datetime) -> int:
    return int((start - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds() * 1000)


def landed_hours(landing: Path) -> list[LandedHour]:
    """Every hour directory ``YYYY/MM/DD/HH`` under ``landing``: its event ids and its marker."""
    hours = []
    for directory in sorted(landing.glob("[0-9]*/[0-9]*/[0-9]*/[0-9]*")):
        y, m, d, h = (int(p) for p in directory.relative_to(landing).parts)
        start = dt.datetime(y, m, d, h, tzinfo=dt.UTC)
        ids: list[str] = []
        for path in sorted(directory.glob("*.json")):
            ids += [json.loads(line)["event_id"] for line in path.read_text(encoding="utf-8").splitlines() if line]
        status: Literal["completed", "failed", "unsettled"] = (
            "completed"
            if (directory / "_SUCCESS").exists()
            else "failed"
            if (directory / "_FAILED").exists()
            else "unsettled"
        )
        hours.append(LandedHour(start, epoch_of(start), tuple(ids), status))
    return hours


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
                paths.add(entry.data_file.file_path.removeprefix("file://"))
    return paths


def check(
    table: Table,
    landing: Path,
    sink_id: str,
    *,
    orphan_grace_s: float,
    now: float | None = None,
) -> CheckResult:
    """Judge one sink's table against its landed input (see the module docstring)."""
    now = time.time() if now is None else now
    result = CheckResult()
    hours = landed_hours(landing)
    result.hours = dict(Counter(h.status for h in hours))
    owner: dict[str, LandedHour] = {i: h for h in hours for i in h.ids}

    visible: Counter[str] = Counter(
        str(r["event_id"]) for r in table.scan(selected_fields=("event_id",)).to_arrow().to_pylist()
    )
    result.rows_visible = sum(visible.values())
    result.foreign_rows = sum(n for i, n in visible.items() if i not in owner)
    by_hour_dup: Counter[int] = Counter()
    by_hour_bad: Counter[tuple[int, str]] = Counter()
    for event_id, count in visible.items():
        hour = owner.get(event_id)
        if hour is None:
            continue
        if count > 1:
            by_hour_dup[hour.epoch] += count - 1
        if hour.status != "completed":
            by_hour_bad[(hour.epoch, hour.status)] += count
    for hour in hours:
        if hour.status == "completed":
            missing = [i for i in hour.ids if visible[i] == 0]
            if missing:
                result.anomalies.append(
                    Anomaly(
                        "missing",
                        hour.epoch,
                        f"{len(missing)} of {len(hour.ids)} rows of {hour.start:%Y-%m-%dT%H} (e.g. {missing[0]})",
                    )
                )
        if by_hour_dup[hour.epoch]:
            result.anomalies.append(
                Anomaly("duplicated", hour.epoch, f"{by_hour_dup[hour.epoch]} extra rows of {hour.start:%Y-%m-%dT%H}")
            )
        for status in ("failed", "unsettled"):
            if by_hour_bad[(hour.epoch, status)]:
                kind: AnomalyKind = "visible_failed" if status == "failed" else "visible_unsettled"
                result.anomalies.append(
                    Anomaly(
                        kind,
                        hour.epoch,
                        f"{by_hour_bad[(hour.epoch, status)]} rows of {hour.start:%Y-%m-%dT%H} visible",
                    )
                )

    markers: Counter[int] = Counter()
    for snapshot in table.metadata.snapshots:
        marker = marker_of(snapshot)
        if marker is not None and marker[SINK_ID_KEY] == sink_id:
            markers[int(marker[EPOCH_KEY])] += 1
    known = {h.epoch: h for h in hours}
    for epoch, count in sorted(markers.items()):
        hour = known.get(epoch)
        expected = 1 if hour is not None and hour.status == "completed" and hour.ids else 0
        if count != expected:
            result.anomalies.append(
                Anomaly("snapshots", epoch, f"{count} snapshots carry the marker, expected {expected}")
            )
    for hour in hours:
        if hour.status == "completed" and hour.ids and markers[hour.epoch] == 0:
            result.anomalies.append(Anomaly("snapshots", hour.epoch, "no snapshot carries the marker, expected 1"))

    referenced = referenced_files(table)
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            if not name.endswith(".parquet"):
                continue
            path = os.path.join(root, name)
            result.files_on_disk += 1
            if path in referenced:
                continue
            age = now - os.stat(path).st_mtime
            if age > orphan_grace_s:
                rel = os.path.relpath(path, data_dir)
                result.anomalies.append(Anomaly("orphan", None, f"{rel} ({age:.0f} s old, referenced by no snapshot)"))
    return result
