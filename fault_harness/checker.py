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

and on disk (the table's data directory, local or on S3):

- ``orphan``: a data file in the sink's write locations (``data/_eo/<write id>/``), referenced by no
  snapshot in the table's history, older than the grace period (recovery must have removed it); or,
  on local disk (the SQL catalog), a metadata file in the table's metadata folder of a version
  between the oldest its metadata log keeps and the current one, neither current nor in the log,
  older than the grace when ``eo-sink gc`` started (a commit killed after writing it: gc must have
  removed it).
  Files of a replaced write stay referenced by the snapshots before the replacement, so they are not
  orphans. Another writer's unreferenced files (pyiceberg's append leaves its data file behind when
  the catalog commit fails) are counted, not judged: recovery must never touch them;
- ``lost``: a data file some snapshot of the table's history references is not on disk (a replaced
  write's files are deleted only after snapshot expiry, and the harness expires none);

and across a fan-out's tables (``check_fan_out``), each judged as above on its own:

- ``torn``: the tables' marked snapshots do not carry the same writes in the same order (epoch,
  write id, revision): an epoch, or one of its revisions, reached some of the tables and not the
  others; or, where the catalog commits a fan-out in one transaction for readers (a SQL catalog's
  database transaction), a reader that loaded the tables one after the other while the runs went
  (``table_reads.FanOutReader``) saw a marked snapshot in one table and not in a table it loaded
  after it: a torn state, counted at every marked snapshot it saw. On a REST catalog (SeaweedFS
  moves the tables' pointers one after the other inside its ``transactions/commit``) such reads are
  counted, not judged.

Rows whose ids were never landed (another writer's) are counted, never judged.

and for an audited pipeline (write, audit, publish, design.md D23; ``check_audits``), whose bad hours
(``audit_failed``) fail their audit: such an hour is judged as one that must never be on ``main``
(``visible_audit_failed`` for its rows there, ``snapshots`` for a marker on ``main``), and

- ``audit``: a marked snapshot of the sink (a publish) is not on ``main``'s ancestry; a bad hour has
  no audit branch, or its branch's head is not an audit snapshot of its epoch whose rows of the
  hour, read by DuckDB, are the hour's input; an hour whose checkpoint did not complete has an
  audit branch or an audit snapshot (its audit commit ran before its checkpoint completed).

An audit branch or audit snapshot left for a published epoch is a warning, not an anomaly: the
publish retires both in its own transaction (D23), so none is expected, and one left is litter
nothing reads (``audit``'s ``branches_left`` and ``snapshots_left``).

An incremental pipeline's table is judged by ``incremental_checker`` instead, against its upstream
table (``unsourced``, ``consumed`` are its kinds; it reuses ``check_revisions`` and ``check_files``).

Beside these, ``history_check`` holds each epoch's meta-store row against the epoch's history
(``history_row``): the one verdict that reads the meta store, and only to compare two records it
writes in one transaction.
"""

from __future__ import annotations

import os
import posixpath
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pyiceberg.table import Table

from airflow_provider_exactly_once.sinks.iceberg.markers import (
    AUDIT_BRANCH_KEY,
    EPOCH_KEY,
    audit_branch_name,
    marker_of,
)
from airflow_provider_exactly_once.sinks.layout import ICEBERG_WRITE_DIR
from fault_harness.landed import LandedHour, Row, landed_hours
from fault_harness.table_reads import (
    FanOutReads,
    IndependentReader,
    Marked,
    Storage,
    local_path,
    main_ancestry,
    marked_snapshots,
    pyiceberg_rows,
    referenced_files,
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
    "torn",
    # An audited pipeline's (``check_audits``): a bad hour's rows on ``main``; its audit branch wrong.
    "visible_audit_failed",
    "audit",
    # An upsert pipeline's (``upsert_checker``): an update lost, a delete undone, epochs out of order.
    "lost_update",
    "resurrected",
    "order",
    # An epoch's meta-store row and its history disagree (``history_check``, the one check reading the store).
    "history_row",
    # An aborted epoch whose history (``eo-sink history --json``) does not say why (design.md D22).
    "uncaused",
    # An incremental pipeline's (``incremental_checker``): a sink row its upstream never held, and a
    # consumed range (a committed snapshot's source summary, the meta store's chain) that is wrong.
    "unsourced",
    "consumed",
]


@dataclass(frozen=True)
class Anomaly:
    kind: AnomalyKind
    #: The hour (epoch, ms) concerned, when there is one.
    epoch: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckResult:
    anomalies: list[Anomaly] = field(default_factory=list)
    hours: dict[str, int] = field(default_factory=dict)
    rows_visible: int = 0
    #: Rows the latest input of the checkpointed hours holds: what ``rows_visible`` must be, foreign rows aside.
    rows_expected: int = 0
    foreign_rows: int = 0
    files_on_disk: int = 0
    #: Unreferenced files outside the sink's write locations (another writer's): counted, not judged.
    foreign_unreferenced_files: int = 0
    #: Snapshots carrying the sink's marker; of those, revisions (replacements of a committed write).
    marked_snapshots: int = 0
    revisions: int = 0
    #: Hours whose input was landed more than once.
    relanded_hours: int = 0
    #: Snapshots whose files and rows were judged (the marked ones and the current one), and by what.
    snapshots_checked: int = 0
    reader: str = ""
    #: Epochs whose meta-store row and history were held against each other (``history_check``).
    history_rows_checked: int = 0
    #: Aborted epochs whose causes were read through ``eo-sink history`` (``history_check.check_causes``).
    causes_checked: int = 0
    #: An incremental pipeline's figures (``incremental_checker``): its upstream, producer and ranges.
    incremental: dict[str, Any] = field(default_factory=dict)
    #: A fan-out's reader (``check_fan_out``): its reads, the marked snapshots they saw, the torn states.
    fan_out_reads: dict[str, Any] = field(default_factory=dict)
    #: An audited pipeline's figures (``check_audits``): epochs published, held, and the warnings.
    audit: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "anomalies": [a.to_dict() for a in self.anomalies],
            "hours": self.hours,
            "rows_visible": self.rows_visible,
            "rows_expected": self.rows_expected,
            "foreign_rows": self.foreign_rows,
            "files_on_disk": self.files_on_disk,
            "foreign_unreferenced_files": self.foreign_unreferenced_files,
            "marked_snapshots": self.marked_snapshots,
            "revisions": self.revisions,
            "relanded_hours": self.relanded_hours,
            "snapshots_checked": self.snapshots_checked,
            "reader": self.reader,
            "history_rows_checked": self.history_rows_checked,
            "causes_checked": self.causes_checked,
            **({"incremental": self.incremental} if self.incremental else {}),
            **({"fan_out_reads": self.fan_out_reads} if self.fan_out_reads else {}),
            **({"audit": self.audit} if self.audit else {}),
        }


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
    storage_options: Mapping[str, Any] | None = None,
    audit_failed: frozenset[int] | None = None,
) -> CheckResult:
    """Judge one sink's table against its landed input (see the module docstring).

    ``history``: the folder of the hours' earlier inputs. ``commits``: per epoch (ms), the least and
    most marked snapshots a checkpointed hour may have (default one and one): one more for each
    reprocessing of the committed epoch, a range where the run cannot know (a backfill racing the
    scheduled runs). ``independent``: read the snapshots with DuckDB as well (when installed).
    ``storage_options``: s3fs's options, for a table on S3 (its files listed and read through them).
    ``audit_failed``: an audited sink's epochs (ms) whose audit fails (``check_audits``); ``None``
    for a sink that is not audited.
    """
    now = time.time() if now is None else now
    result = CheckResult()
    hours = [
        replace(h, status="audit_failed") if h.status == "completed" and h.epoch in (audit_failed or ()) else h
        for h in landed_hours(landing, history)
    ]
    result.hours = dict(Counter(h.status for h in hours))
    result.relanded_hours = sum(1 for h in hours if h.earlier)
    result.rows_expected = sum(len(h.rows) for h in hours if h.status == "completed")
    by_epoch = {h.epoch: h for h in hours}
    owner: dict[str, LandedHour] = {row[0]: h for h in hours for version in h.versions for row in version}
    commits = dict(commits or {})

    on_s3 = table.location().startswith("s3://")
    reader = IndependentReader.open(storage_options if on_s3 else None) if independent else None
    result.reader = "duckdb and pyiceberg" if reader is not None else "pyiceberg"
    try:
        _check_current(table, hours, owner, result, reader)
        marked = marked_snapshots(table, sink_id)
        check_markers(marked, hours, by_epoch, commits, result)
        _check_history(table, marked, hours, owner, result, reader)
        if audit_failed is not None:
            check_audits(table, sink_id, hours, marked, owner, result, reader)
    finally:
        if reader is not None:
            reader.close()
    check_files(table, marked, orphan_grace_s, now, result, Storage(storage_options))
    return result


def check_fan_out(
    tables: Mapping[str, Table],
    results: Mapping[str, CheckResult],
    sink_id: str,
    reads: FanOutReads | None = None,
    *,
    judge_reads: bool = True,
) -> CheckResult:
    """A fan-out's tables, each already judged (``results``, in ``tables``' order), against each
    other: the first table's result, with every other table's anomalies (naming their table), a
    ``torn`` anomaly per epoch whose marked writes differ between the tables, and one per marked
    snapshot a reader (``reads``) saw in a table and not in one it loaded after it (``judge_reads``:
    where the catalog commits a fan-out atomically for readers; otherwise they are only counted)."""
    first, *others = tables
    combined = results[first]
    writes = {
        name: [(m.epoch, m.write_id, m.revision) for m in marked_snapshots(table, sink_id)]
        for name, table in tables.items()
    }
    for name in others:
        combined.anomalies.extend(
            Anomaly(a.kind, a.epoch, f"table {name}: {a.detail}") for a in results[name].anomalies
        )
        for epoch in sorted({w[0] for w in writes[first]} | {w[0] for w in writes[name]}):
            mine = [w[1:] for w in writes[first] if w[0] == epoch]
            theirs = [w[1:] for w in writes[name] if w[0] == epoch]
            if mine != theirs:
                combined.anomalies.append(
                    Anomaly(
                        "torn",
                        epoch,
                        f"(write id, revision) of its marked snapshots: {mine} in table {first}, {theirs} in table {name}",
                    )
                )
    if reads is not None:
        _judge_reads(reads, combined, judge_reads)
    return combined


def _judge_reads(reads: FanOutReads, result: CheckResult, judged: bool) -> None:
    """The reader's torn states, one anomaly per marked snapshot seen torn (where ``judged``)."""
    torn_writes = {(name, write) for name, write, _ in reads.torn}
    result.fan_out_reads = {
        "reads": reads.samples,
        "failed_reads": reads.errors,
        "marked_snapshots_read": len(reads.shown),
        "torn_reads": sum(reads.torn.values()),
        "torn_marked_snapshots": len(torn_writes),
        "judged": judged,
    }
    if not judged:
        return
    for (name, (epoch, write_id, revision), later), count in sorted(reads.torn.items()):
        result.anomalies.append(
            Anomaly(
                "torn",
                epoch,
                f"a reader saw write {write_id} (revision {revision}) in table {name} and not in table {later}, "
                f"loaded after it, in {count} of the {reads.shown[name, (epoch, write_id, revision)]} reads that showed it",
            )
        )


def current_rows(table: Table, result: CheckResult, reader: IndependentReader | None) -> list[Row]:
    """The current snapshot's rows as pyiceberg reads them; an anomaly when DuckDB reads others."""
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
    return rows


def _check_current(
    table: Table,
    hours: list[LandedHour],
    owner: Mapping[str, LandedHour],
    result: CheckResult,
    reader: IndependentReader | None,
) -> None:
    rows = current_rows(table, result, reader)
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
            kind: AnomalyKind = {"failed": "visible_failed", "audit_failed": "visible_audit_failed"}.get(
                hour.status, "visible_unsettled"
            )
            result.anomalies.append(Anomaly(kind, hour.epoch, f"{len(shown)} rows of {name} visible"))


def check_markers(
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
    check_revisions(per_epoch, result)


def check_revisions(per_epoch: Mapping[int, list[Marked]], result: CheckResult) -> None:
    """Per epoch, its marked snapshots (commit order): no write committed twice, and revision
    numbers 0, 1, 2, ... in snapshot order (``revisions``)."""
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
            live = {local_path(task.file.file_path) for task in table.scan(snapshot_id=snapshot_id).plan_files()}
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


def check_audits(
    table: Table,
    sink_id: str,
    hours: list[LandedHour],
    marked: list[Marked],
    owner: Mapping[str, LandedHour],
    result: CheckResult,
    reader: IndependentReader | None,
) -> None:
    """An audited sink's table (design.md D23; ``audit`` in the module docstring): every publish on
    ``main``'s ancestry; every bad hour held on its audit branch, its audit snapshot holding the
    hour's input (read by DuckDB, as ``main`` is); no audit of an hour not checkpointed. Counts the
    published and held epochs, and the audit branches and snapshots left for published ones."""
    ancestry = main_ancestry(table)
    for m in marked:
        if m.snapshot_id not in ancestry:
            result.anomalies.append(
                Anomaly("audit", m.epoch, f"marked snapshot {m.snapshot_id} (write {m.write_id}) is not on main")
            )
    refs = table.metadata.refs
    audits: dict[int, list[Marked]] = defaultdict(list)
    for m in marked_snapshots(table, sink_id, audits=True):
        audits[m.epoch].append(m)
    published = {m.epoch for m in marked}
    branches_left: list[str] = []
    snapshots_left: list[int] = []
    for hour in hours:
        branch = audit_branch_name(sink_id, hour.epoch)
        ref = refs.get(branch)
        name = _hour_name(hour)
        if hour.status in ("failed", "unsettled"):
            if ref is not None or audits.get(hour.epoch):
                result.anomalies.append(
                    Anomaly("audit", hour.epoch, f"{name} ({hour.status}) has an audit branch or audit snapshot")
                )
        elif hour.status == "completed" and hour.epoch in published:
            if ref is not None:
                branches_left.append(branch)
            snapshots_left += [m.snapshot_id for m in audits.get(hour.epoch, [])]
        elif hour.status == "audit_failed":
            problem = _held_audit(table, branch, ref, hour, owner, reader)
            if problem:
                result.anomalies.append(Anomaly("audit", hour.epoch, f"{name}, audit failed: {problem}"))
    result.audit = {
        "published": sum(1 for h in hours if h.status == "completed" and h.epoch in published),
        "held": sum(1 for h in hours if h.status == "audit_failed"),
        "audit_snapshots": sum(len(found) for found in audits.values()),
        "branches_left": sorted(branches_left),
        "snapshots_left": sorted(snapshots_left),
    }


def _held_audit(
    table: Table,
    branch: str,
    ref: Any,
    hour: LandedHour,
    owner: Mapping[str, LandedHour],
    reader: IndependentReader | None,
) -> str:
    """What is wrong with a bad hour's audit branch, or "" when its head is the epoch's audit
    snapshot and shows the hour's input."""
    if ref is None:
        return f"no audit branch {branch}"
    snapshot = table.snapshot_by_id(ref.snapshot_id)
    marker = None if snapshot is None else marker_of(snapshot)
    if marker is None or marker.get(AUDIT_BRANCH_KEY) != branch or int(marker[EPOCH_KEY]) != hour.epoch:
        return f"the head {ref.snapshot_id} of {branch} is no audit snapshot of the epoch"
    try:
        rows = reader.rows(table, ref.snapshot_id) if reader is not None else pyiceberg_rows(table, ref.snapshot_id)
    except Exception as exc:
        return f"audit snapshot {ref.snapshot_id} cannot be read: {type(exc).__name__}: {exc}"
    shown = _rows_by_hour(rows, owner).get(hour.epoch, [])
    if any(hour.versions) and _matching_version(Counter(shown), hour) is None:
        return f"audit snapshot {ref.snapshot_id} shows {_describe_mismatch(shown, hour)}"
    return ""


def check_files(
    table: Table,
    marked: Iterable[Marked],
    orphan_grace_s: float,
    now: float,
    result: CheckResult,
    storage: Storage,
) -> None:
    referenced = referenced_files(table)
    added_by = {path: m for m in marked for path in m.added}
    data_dir = local_path(table.location()).rstrip("/") + "/data"
    on_disk = storage.files(data_dir)
    result.files_on_disk = len(on_disk)
    for path, mtime in sorted(on_disk.items()):
        if path in referenced:
            continue
        if f"/{ICEBERG_WRITE_DIR}/" not in path.removeprefix(data_dir):
            result.foreign_unreferenced_files += 1
            continue
        age = now - mtime
        if age > orphan_grace_s:
            rel = posixpath.relpath(path, data_dir)
            result.anomalies.append(Anomaly("orphan", None, f"{rel} ({age:.0f} s old, referenced by no snapshot)"))
    if not table.metadata_location.startswith("s3://"):
        _check_metadata_files(table, orphan_grace_s, now, result)
    for path in sorted(referenced - set(on_disk)):
        if storage.exists(path):
            continue  # outside the data directory (another writer's location): it is there
        m = added_by.get(path)
        who = f"write {m.write_id} (revision {m.revision})" if m is not None else "no marked write"
        result.anomalies.append(
            Anomaly(
                "lost",
                None if m is None else m.epoch,
                f"{posixpath.relpath(path, data_dir)} of {who} is referenced by the table's snapshots but not on disk",
            )
        )


def _check_metadata_files(table: Table, orphan_grace_s: float, now: float, result: CheckResult) -> None:
    """On local disk (the SQL catalog's tables): every metadata file (``<version>-<uuid>.metadata.json``)
    of a version the table's pointer has passed and its metadata log still covers is the current one
    or in the log, unless it was younger than the grace when gc started."""

    def version(name: str) -> int | None:
        head = name.split("-", 1)[0]
        return int(head) if name.endswith(".metadata.json") and head.isdigit() else None

    current = posixpath.basename(table.metadata_location)
    listed = {posixpath.basename(entry.metadata_file) for entry in table.metadata.metadata_log} | {current}
    versions = [v for v in map(version, listed) if v is not None]
    newest = version(current)
    if newest is None or not versions:
        return
    folder = posixpath.dirname(local_path(table.metadata_location))
    for name in sorted(os.listdir(folder)):
        found = version(name)
        if found is None or name in listed or not min(versions) <= found <= newest:
            continue
        age = now - os.stat(posixpath.join(folder, name)).st_mtime
        if age > orphan_grace_s:
            result.anomalies.append(
                Anomaly(
                    "orphan",
                    None,
                    f"metadata/{name} ({age:.0f} s old, neither the table's current metadata nor in its log)",
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
