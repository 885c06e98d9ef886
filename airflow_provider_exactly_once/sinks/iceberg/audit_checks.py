"""The built-in audit of an audited sink's epoch (design.md D23): checks written as SQL, run by DuckDB
over the epoch's audit snapshot, each naming what it found wrong.

A check's query returns the rows that break it, as a dbt test does: the check passes when it returns
none. It reads ``epoch_rows`` (the rows the epoch's write added, as the audit snapshot holds them)
and each table of the sink by its name's last part (the whole table at the audit snapshot: the
sink's branch as publishing the write would leave it). pyiceberg reads the snapshot, so any catalog
and storage the sink writes to will do; a table is read only when a check names it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.core.epochs import AuditCheck, EpochAudit
from airflow_provider_exactly_once.core.ports import EMPTY

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog

    from airflow_provider_exactly_once.core.precommit import PreCommit
    from airflow_provider_exactly_once.sinks.config import SqlCheck

#: The view of the rows the epoch's write added, in every check.
EPOCH_ROWS = "epoch_rows"
#: How many of a failed check's rows its message shows.
SHOWN_ROWS = 3


def run_checks(
    catalog: Catalog, pre_commit: PreCommit, audit: EpochAudit, checks: Sequence[SqlCheck]
) -> list[AuditCheck]:
    """Every check over the audit snapshot, in order; a query DuckDB refuses is that check failing,
    with DuckDB's error as its message (a broken check must not publish an epoch)."""
    from airflow_provider_exactly_once.extras import require

    duckdb = require("duckdb", extra="audit", feature="the built-in audit checks (SqlCheck)")
    connection = duckdb.connect()
    try:
        views = _Views(catalog, pre_commit, audit, connection)
        found: list[AuditCheck] = []
        for check in checks:
            try:
                views.register_for(check.sql)
                result = connection.execute(check.sql)
                rows = result.fetchall()
                columns = [column[0] for column in result.description or ()]
            except duckdb.Error as exc:
                found.append(
                    AuditCheck(name=check.name, passed=False, message=f"the check's query failed: {exc}"[:1500])
                )
                continue
            found.append(_verdict(check, columns, rows))
        return found
    finally:
        connection.close()


def _verdict(check: SqlCheck, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> AuditCheck:
    if not rows:
        return AuditCheck(name=check.name, passed=True)
    shown = "; ".join(_shown(columns, row) for row in rows[:SHOWN_ROWS]) + (" ..." if len(rows) > SHOWN_ROWS else "")
    what = check.message or f"{check.name} failed"
    return AuditCheck(name=check.name, passed=False, message=f"{what}: {len(rows)} row(s), e.g. {shown}"[:1500])


def _shown(columns: Sequence[str], row: tuple[Any, ...]) -> str:
    """A failed check's row as its reader needs it: each value by its column's name (a ``select *``
    over a wide table is otherwise a tuple of unnamed values), a string quoted, a null as ``None``,
    anything else as it prints (``2024-06-02 08:00:00+00:00``, not the datetime's repr)."""
    values = (repr(v) if v is None or isinstance(v, (str, bytes)) else str(v) for v in row)
    return "(" + ", ".join(f"{name}={value}" for name, value in zip(columns, values, strict=True)) + ")"


class _Views:
    """The snapshot's tables as DuckDB views, each registered the first time a check names it."""

    def __init__(self, catalog: Catalog, pre_commit: PreCommit, audit: EpochAudit, connection: Any) -> None:
        self._catalog = catalog
        self._pre_commit = pre_commit
        self._audit = audit
        self._connection = connection
        self._registered: set[str] = set()
        short = [t.table.rsplit(".", 1)[-1] for t in pre_commit.tables]
        #: View name -> the table it reads; a short name two tables share is not offered.
        self._tables = {s: t.table for s, t in zip(short, pre_commit.tables, strict=True) if short.count(s) == 1}

    def register_for(self, sql: str) -> None:
        words = set(re.findall(r"\w+", sql.lower()))
        if EPOCH_ROWS in words and EPOCH_ROWS not in self._registered:
            self._register(EPOCH_ROWS, self._epoch_rows())
        for view, table in self._tables.items():
            if view.lower() in words and view not in self._registered:
                self._register(view, self._snapshot_rows(table))

    def _register(self, view: str, rows: pa.Table) -> None:
        self._connection.register(view, rows)
        self._registered.add(view)

    def _epoch_rows(self) -> pa.Table:
        """The write's rows of every table (a fan-out's tables hold the same columns per select)."""
        import pyarrow as pa

        parts = [self._snapshot_rows(t.table, only=set(t.data_files.paths())) for t in self._pre_commit.tables]
        return pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})

    def _snapshot_rows(self, name: str, only: set[str] | None = None) -> pa.Table:
        """The table at its audit snapshot; with ``only``, the rows of those data files alone."""
        from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow

        table = self._catalog.load_table(name)
        snapshot = self._audit.snapshots.get(name, EMPTY)
        if snapshot == EMPTY:  # the write added nothing here: the branch as it was made
            ref = table.metadata.refs.get(self._audit.branch)
            snapshot_id = None if ref is None else ref.snapshot_id
        else:
            snapshot_id = int(snapshot)
        if snapshot_id is None:
            return schema_to_pyarrow(table.schema()).empty_table()
        scan = table.scan(snapshot_id=snapshot_id)
        tasks = [task for task in scan.plan_files() if only is None or task.file.file_path in only]
        return ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter).to_table(tasks)
