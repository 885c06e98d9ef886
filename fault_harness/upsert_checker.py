"""What an upsert pipeline's run must end with, judged from its landed changes and the table alone.

The model is a plain dict, key -> row, built by applying each *checkpointed* (``_SUCCESS``) hour's
changes once, in epoch order (``upsert_changes``: one change per key, the greatest ``seq`` wins);
a ``_FAILED`` or unsettled hour applies nothing. The meta store and Airflow's state are not
consulted, as for append pipelines (``checker``).

Anomalies, in the current snapshot (read by pyiceberg and by DuckDB's iceberg extension, which
must agree: ``readers``):

- ``missing``: a key the model holds is not visible;
- ``lost_update``: a key shows another row than the model's (an earlier state of it: an update
  lost, or applied twice out of order);
- ``resurrected``: a key a checkpointed hour deleted (and no later one set again) is visible;
- ``visible_failed`` / ``visible_unsettled``: a row only a ``_FAILED`` / unsettled hour set is visible;
- ``duplicated``: a key is visible more than once;

in the table's history:

- ``snapshots``: a checkpointed hour that changes the table has other than exactly one snapshot
  carrying the sink's marker; an hour that changes nothing (only deletes of absent keys), a failed
  or an unsettled one has any (``checker.check_markers``, which also judges write ids and
  revision numbers: ``revisions``);
- ``order``: the marked snapshots are not in epoch order (upsert epochs commit in epoch order);
- ``history``: some snapshot of the table (each marked one, each other writer's, such as a
  compaction, and the current one) shows rows other than the model as of the latest epoch committed
  by then: an epoch's changes seen twice or half, a compaction that changed rows, or a commit that
  undid one;

and on disk, as for append pipelines (``checker.check_files``): ``orphan`` and ``lost``.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from demo.world import hour_dir
from fault_harness.checker import (  # the append checker's marker and file checks hold for upserts as they are
    Anomaly,
    AnomalyKind,
    CheckResult,
    check_files,
    check_markers,
    current_rows,
)
from fault_harness.landed import LandedHour, Row, landed_hours
from fault_harness.table_reads import IndependentReader, Marked, Storage, marked_snapshots, pyiceberg_rows
from fault_harness.upsert_changes import Change, apply, last_per_key, read_changes

#: Keys an anomaly names as examples.
SHOWN = 3


@dataclass(frozen=True)
class Origin:
    """Which hour's change set a row: how a visible row that the model does not hold is explained."""

    epoch: int
    status: str
    won: bool


@dataclass
class Model:
    """The landed changes, and the model they add up to after each hour (epoch order)."""

    hours: list[LandedHour]
    #: Per epoch: the model once every checkpointed hour up to it applied.
    states: dict[int, dict[str, Row]]
    final: dict[str, Row]
    #: Per key: the epoch whose change last set or deleted it in the final model.
    last_changed: dict[str, int]
    #: Checkpointed hours whose changes alter the table (a snapshot is expected of them).
    effective: set[int]
    #: Every row any change of any hour carried, and where it came from.
    origins: dict[Row, list[Origin]]

    @classmethod
    def build(cls, landing: Path) -> Model:
        hours = sorted(landed_hours(landing), key=lambda h: h.epoch)
        model: dict[str, Row] = {}
        states: dict[int, dict[str, Row]] = {}
        last_changed: dict[str, int] = {}
        effective: set[int] = set()
        origins: dict[Row, list[Origin]] = defaultdict(list)
        for hour in hours:
            raw = read_changes(hour_dir(landing, hour.start))
            changes: dict[str, Change] = last_per_key(raw)
            for change in raw:
                origins[change.row].append(Origin(hour.epoch, hour.status, changes[change.key] == change))
            if hour.status == "completed":
                if any(c.op == "upsert" or c.key in model for c in changes.values()):
                    effective.add(hour.epoch)
                apply(model, changes)
                last_changed.update(dict.fromkeys(changes, hour.epoch))
            states[hour.epoch] = dict(model)
        return cls(hours, states, model, last_changed, effective, dict(origins))

    def explain(self, row: Row) -> str:
        found = self.origins.get(row)
        if not found:
            return "a row no hour landed"
        o = found[-1]
        return f"the row hour {o.epoch} ({o.status}) {'set' if o.won else 'landed but lost to a later seq'}"


def check_upsert(
    table: Table,
    landing: Path,
    sink_id: str,
    *,
    orphan_grace_s: float,
    now: float | None = None,
    independent: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> CheckResult:
    """Judge one upsert sink's table against its landed changes (see the module docstring)."""
    now = time.time() if now is None else now
    model = Model.build(landing)
    result = CheckResult()
    result.hours = dict(Counter(h.status for h in model.hours))
    result.rows_expected = len(model.final)
    on_s3 = table.location().startswith("s3://")
    reader = IndependentReader.open(storage_options if on_s3 else None) if independent else None
    result.reader = "duckdb and pyiceberg" if reader is not None else "pyiceberg"
    try:
        _check_current(table, model, result, reader)
        marked = marked_snapshots(table, sink_id)
        no_snapshot = {h.epoch: (0, 0) for h in model.hours if h.epoch not in model.effective}
        check_markers(marked, model.hours, {h.epoch: h for h in model.hours}, no_snapshot, result)
        _check_order(marked, result)
        _check_history(table, marked, model, result, reader)
    finally:
        if reader is not None:
            reader.close()
    check_files(table, marked, orphan_grace_s, now, result, Storage(storage_options))
    return result


def _check_current(table: Table, model: Model, result: CheckResult, reader: IndependentReader | None) -> None:
    rows = current_rows(table, result, reader)
    result.rows_visible = len(rows)
    landed_keys = {row[0] for row in model.origins}
    result.foreign_rows = sum(1 for row in rows if row[0] not in landed_keys)
    found: dict[tuple[AnomalyKind, int | None], list[str]] = defaultdict(list)
    for kind, epoch, detail in _compare(rows, model.final, model):
        found[(kind, epoch)].append(detail)
    for (kind, epoch), details in sorted(found.items(), key=lambda p: (p[0][0], p[0][1] or 0)):
        more = f" (and {len(details) - SHOWN} more)" if len(details) > SHOWN else ""
        result.anomalies.append(Anomaly(kind, epoch, f"{len(details)} key(s): " + "; ".join(details[:SHOWN]) + more))


def _compare(rows: list[Row], expected: Mapping[str, Row], model: Model) -> list[tuple[AnomalyKind, int | None, str]]:
    """How ``rows`` differ from ``expected`` (key -> row), key by key, each difference named."""
    landed_keys = {row[0] for row in model.origins}
    shown: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row[0] in landed_keys:
            shown[row[0]].append(row)
    out: list[tuple[AnomalyKind, int | None, str]] = []
    for key in sorted(set(shown) | set(expected)):
        visible, want = shown.get(key, []), expected.get(key)
        if len(visible) > 1:
            out.append(("duplicated", model.last_changed.get(key), f"{key} visible {len(visible)} times"))
        if want is None:
            for row in visible:
                origins = model.origins.get(row, [])
                status = origins[-1].status if origins else "completed"
                kind: AnomalyKind = (
                    "visible_failed"
                    if status == "failed"
                    else "visible_unsettled"
                    if status == "unsettled"
                    else "resurrected"
                )
                epoch = origins[-1].epoch if kind != "resurrected" else model.last_changed.get(key)
                out.append((kind, epoch, f"{key} visible as {model.explain(row)}"))
        elif not visible:
            out.append(("missing", model.last_changed.get(key), f"{key} ({model.explain(want)})"))
        elif want not in visible:
            origins = model.origins.get(visible[0], [])
            kind = "visible_failed" if origins and origins[-1].status == "failed" else "lost_update"
            out.append(
                (
                    kind,
                    model.last_changed.get(key),
                    f"{key} shows {model.explain(visible[0])}, not {model.explain(want)}",
                )
            )
    return out


def _check_order(marked: list[Marked], result: CheckResult) -> None:
    epochs = [m.epoch for m in marked]
    for before, after in pairwise(marked):
        if after.epoch < before.epoch:
            result.anomalies.append(
                Anomaly(
                    "order",
                    after.epoch,
                    f"epoch {after.epoch} committed (snapshot {after.snapshot_id}) after epoch {before.epoch} "
                    f"(snapshot {before.snapshot_id}); marked epochs in commit order: {epochs}",
                )
            )


def _in_commit_order(table: Table) -> list[Snapshot]:
    indexed = list(enumerate(table.metadata.snapshots))
    indexed.sort(key=lambda p: (p[1].sequence_number or 0, p[0]))
    return [s for _, s in indexed]


def _check_history(
    table: Table, marked: list[Marked], model: Model, result: CheckResult, reader: IndependentReader | None
) -> None:
    """Every snapshot shows the model as of the latest epoch committed by then."""
    epoch_of = {m.snapshot_id: m.epoch for m in marked}
    latest: int | None = None
    for snapshot in _in_commit_order(table):
        latest = epoch_of.get(snapshot.snapshot_id, latest)
        expected = model.states.get(latest, {}) if latest is not None else {}
        result.snapshots_checked += 1
        what = f"marked epoch {latest}" if snapshot.snapshot_id in epoch_of else "another writer's"
        try:
            if reader is not None:
                rows = reader.rows(table, snapshot.snapshot_id)
            else:
                rows = pyiceberg_rows(table, snapshot.snapshot_id)
        except Exception as exc:
            result.anomalies.append(
                Anomaly(
                    "history", latest, f"snapshot {snapshot.snapshot_id} cannot be read: {type(exc).__name__}: {exc}"
                )
            )
            continue
        differences = _compare(rows, expected, model)
        if differences:
            kinds = Counter(kind for kind, _, _ in differences)
            result.anomalies.append(
                Anomaly(
                    "history",
                    latest,
                    f"snapshot {snapshot.snapshot_id} ({what}, {snapshot.summary.operation.value if snapshot.summary else '?'}) "
                    f"differs from the model as of epoch {latest}: {dict(kinds)}, e.g. {differences[0][2]}",
                )
            )
