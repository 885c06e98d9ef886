"""The built-in audit of an audited sink's epoch (design.md D23): checks written as SQL, run over the
epoch's audit snapshot by the engine each names (``SqlCheck.engine``), each naming what it found
wrong.

A check's query returns the rows that break it, as a dbt test does: the check passes when it returns
none. It reads ``epoch_rows`` (the rows the epoch's write added, as the audit snapshot holds them)
and each table of the sink by its name's last part (the whole table at the audit snapshot: the
sink's branch as publishing the write would leave it). Which views a query reads, and which files
of which snapshot each holds, is decided here once for every engine (``AuditViews``); an engine
only reads those files its own way and runs the query (``CheckEngine``). DuckDB's is here: it runs
in the task's memory over pyiceberg's read, so any catalog and storage the sink writes to will do.
Spark's is ``spark/check_engine.py``, a layer up, where the package reaches Spark. A table is read
only when a check names it, and a query the engine refuses is that check failing, with the engine's
error as its message: a broken check must not publish an epoch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_exactly_once.core.epochs import AuditCheck, EpochAudit
from airflow_provider_exactly_once.core.ports import EMPTY

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask, Table

    from airflow_provider_exactly_once.core.precommit import PreCommit
    from airflow_provider_exactly_once.sinks.config import EngineName, SqlCheck

#: The view of the rows the epoch's write added, in every check.
EPOCH_ROWS = "epoch_rows"
#: How many of a failed check's rows its message shows.
SHOWN_ROWS = 3
#: The longest message a check records.
MESSAGE_CHARS = 1500


@dataclass(frozen=True)
class TableRows:
    """Some rows of one table at its audit snapshot: the files its scan planned (every one, or
    those of the epoch's write alone), at the snapshot's schema."""

    table: Table
    schema: Schema
    tasks: tuple[FileScanTask, ...]

    def to_arrow(self) -> pa.Table:
        """The rows read by pyiceberg, which any storage, name mapping and delete file suits."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        return ArrowScan(self.table.metadata, self.table.io, self.schema, AlwaysTrue()).to_table(self.tasks)


class CheckEngine(Protocol):
    """What runs a check's query: it registers a view from the rows ``AuditViews`` gives it, and
    tells a query it refused from a fault of the platform (which fails the task, to be retried)."""

    def register(self, view: str, parts: Sequence[TableRows]) -> None:
        """Make ``view`` the union of ``parts`` (several for a fan-out's ``epoch_rows``)."""

    def run(self, sql: str) -> QueryRows:
        """The query's column names, how many rows it returned, and the first ``SHOWN_ROWS``."""

    def refused(self, exc: Exception) -> bool:
        """Whether ``exc`` is this engine refusing the check's query (the check fails)."""


#: A check query's column names, how many rows it returned, and the first ``SHOWN_ROWS`` of them.
QueryRows = tuple[list[str], int, list[tuple[Any, ...]]]
#: Opens an engine for one task's checks and closes it after the last.
EngineOpener = Callable[[], AbstractContextManager[CheckEngine]]


def run_checks(
    catalog: Catalog,
    pre_commit: PreCommit,
    audit: EpochAudit,
    checks: Sequence[SqlCheck],
    engines: Mapping[EngineName, EngineOpener] | None = None,
) -> list[AuditCheck]:
    """Every check over the audit snapshot, in order, each by its engine: DuckDB unless ``engines``
    opens another (the operator gives Spark's); an engine is opened at its first check."""
    openers: dict[EngineName, EngineOpener] = {"duckdb": duckdb_engine, **(engines or {})}
    views = AuditViews(catalog, pre_commit, audit)
    found: list[AuditCheck] = []
    with ExitStack() as stack:
        opened: dict[EngineName, tuple[CheckEngine, set[str]]] = {}
        for check in checks:
            if check.engine not in opened:
                if check.engine not in openers:
                    raise ValueError(f"audit check {check.name!r}: no {check.engine} engine was given to run it")
                opened[check.engine] = (stack.enter_context(openers[check.engine]()), set())
            engine, registered = opened[check.engine]
            try:
                for view, parts in views.read_by(check.sql, registered):
                    engine.register(view, parts)
                    registered.add(view)
                found_rows = engine.run(check.sql)
            except Exception as exc:
                if not engine.refused(exc):
                    raise
                found.append(
                    AuditCheck(
                        name=check.name, passed=False, message=f"the check's query failed: {exc}"[:MESSAGE_CHARS]
                    )
                )
                continue
            found.append(_verdict(check, found_rows))
    return found


def _verdict(check: SqlCheck, rows: QueryRows) -> AuditCheck:
    columns, count, first = rows
    if not count:
        return AuditCheck(name=check.name, passed=True)
    shown = "; ".join(_shown(columns, row) for row in first[:SHOWN_ROWS]) + (" ..." if count > SHOWN_ROWS else "")
    what = check.message or f"{check.name} failed"
    return AuditCheck(name=check.name, passed=False, message=f"{what}: {count} row(s), e.g. {shown}"[:MESSAGE_CHARS])


def _shown(columns: Sequence[str], row: tuple[Any, ...]) -> str:
    """A failed check's row as its reader needs it: each value by its column's name (a ``select *``
    over a wide table is otherwise a tuple of unnamed values), a string quoted, a null as ``None``,
    anything else as it prints (``2024-06-02 08:00:00+00:00``, not the datetime's repr)."""
    values = (repr(v) if v is None or isinstance(v, (str, bytes)) else str(v) for v in row)
    return "(" + ", ".join(f"{name}={value}" for name, value in zip(columns, values, strict=True)) + ")"


class AuditViews:
    """The views of the audit snapshot a query reads, for any engine: ``epoch_rows`` and each table
    by its short name, each planned once (the table loaded, its snapshot's files listed)."""

    def __init__(self, catalog: Catalog, pre_commit: PreCommit, audit: EpochAudit) -> None:
        self._catalog = catalog
        self._pre_commit = pre_commit
        self._audit = audit
        short = [t.table.rsplit(".", 1)[-1] for t in pre_commit.tables]
        #: View name -> the table it reads; a short name two tables share is not offered.
        self._tables = {s: t.table for s, t in zip(short, pre_commit.tables, strict=True) if short.count(s) == 1}
        self._planned: dict[str, TableRows] = {}

    def read_by(self, sql: str, registered: set[str]) -> Iterator[tuple[str, list[TableRows]]]:
        """Each view ``sql`` names that is not ``registered`` yet, with its rows."""
        words = set(re.findall(r"\w+", sql.lower()))
        if EPOCH_ROWS in words and EPOCH_ROWS not in registered:
            yield EPOCH_ROWS, [self._rows(t.table, only=set(t.data_files.paths())) for t in self._pre_commit.tables]
        for view, table in self._tables.items():
            if view.lower() in words and view not in registered:
                yield view, [self._rows(table)]

    def _rows(self, name: str, only: set[str] | None = None) -> TableRows:
        """The table at its audit snapshot; with ``only``, the rows of those data files alone."""
        if name not in self._planned:
            self._planned[name] = self._plan(name)
        whole = self._planned[name]
        if only is None:
            return whole
        return TableRows(whole.table, whole.schema, tuple(t for t in whole.tasks if t.file.file_path in only))

    def _plan(self, name: str) -> TableRows:
        table = self._catalog.load_table(name)
        snapshot = self._audit.snapshots.get(name, EMPTY)
        if snapshot == EMPTY:  # the write added nothing here: the branch as it was made
            ref = table.metadata.refs.get(self._audit.branch)
            snapshot_id = None if ref is None else ref.snapshot_id
        else:
            snapshot_id = int(snapshot)
        if snapshot_id is None:
            return TableRows(table, table.schema(), ())
        scan = table.scan(snapshot_id=snapshot_id)
        return TableRows(table, scan.projection(), tuple(scan.plan_files()))


class _DuckDb:
    """DuckDB's engine: each view an Arrow table pyiceberg read into the task's memory."""

    def __init__(self, connection: Any, error: type[Exception]) -> None:
        self._connection = connection
        self._error = error

    def register(self, view: str, parts: Sequence[TableRows]) -> None:
        import pyarrow as pa

        tables = [part.to_arrow() for part in parts]
        # A fan-out's tables hold the same columns per select.
        rows = pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
        self._connection.register(view, rows)

    def run(self, sql: str) -> QueryRows:
        result = self._connection.execute(sql)
        rows: list[tuple[Any, ...]] = result.fetchall()
        return [column[0] for column in result.description or ()], len(rows), rows[:SHOWN_ROWS]

    def refused(self, exc: Exception) -> bool:
        return isinstance(exc, self._error)


@contextmanager
def duckdb_engine() -> Iterator[CheckEngine]:
    """An in-memory DuckDB database for one task's checks (the ``[audit]`` extra)."""
    from airflow_provider_exactly_once.extras import require

    duckdb = require("duckdb", extra="audit", feature="the built-in audit checks (SqlCheck)")
    connection = duckdb.connect()
    try:
        yield _DuckDb(connection, duckdb.Error)
    finally:
        connection.close()
