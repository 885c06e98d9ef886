"""The listing queries are index reads in the page's own order: no sort over the history, on either database.

SQLite's plan is read as is; PostgreSQL's planner prefers a sequential scan and a sort on tables this
small, so there sequential scans and sorts are disabled for the ``EXPLAIN`` to show whether an
index *can* serve the order (a plan that still has a ``Sort`` node means no index does).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.queries import epochs_statement


@pytest.fixture
def store(meta_url: str) -> Iterator[SqlSinkStateStore]:
    opened = SqlSinkStateStore(meta_url)
    yield opened
    opened.dispose()


def _plan(store: SqlSinkStateStore, statement: sa.Select[Any]) -> str:
    sql = str(statement.compile(dialect=store.engine.dialect, compile_kwargs={"literal_binds": True}))
    with store.engine.connect() as connection:
        if store.engine.dialect.name == "sqlite":
            return "\n".join(str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
        # Both off, for this transaction only: the planner then picks an index that yields the page's
        # order whenever one exists (cost ties otherwise flip between index-plus-sort and it).
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
        connection.exec_driver_sql("SET LOCAL enable_sort = off")
        return "\n".join(str(row[0]) for row in connection.exec_driver_sql(f"EXPLAIN {sql}"))


@pytest.mark.parametrize(
    ("sink_id", "status", "dag_ids"),
    list(itertools.product([None, "some-sink"], [None, EpochStatus.PENDING], [None, {"dag_a", "dag_b"}])),
)
def test_every_listing_is_an_ordered_index_scan(
    store: SqlSinkStateStore, sink_id: str | None, status: EpochStatus | None, dag_ids: set[str] | None
) -> None:
    """A caller who may read some DAGs only gets the same plan: the DAG filter is applied to the rows
    the index yields in the page's order, so ``LIMIT``/``OFFSET`` count only rows they may read."""
    plan = _plan(store, epochs_statement(sink_id=sink_id, status=status, limit=50, offset=100, dag_ids=dag_ids))
    if store.engine.dialect.name == "sqlite":
        assert "USING" in plan and "INDEX" in plan, plan
        assert "TEMP B-TREE" not in plan, f"the page is sorted, not read in index order:\n{plan}"
    else:
        assert "Index Scan" in plan or "Index Only Scan" in plan, plan
        assert "Sort" not in plan, f"the page is sorted, not read in index order:\n{plan}"
