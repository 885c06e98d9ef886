"""The built-in audit checks evaluated by Spark (``SqlCheck(engine="spark")``, design.md D23): the
same views, the same verdicts as DuckDB's, for a snapshot too large to read into one task.

``sinks.iceberg.audit_checks`` decides which views a check reads and which files each holds
(``AuditViews``) and judges the rows (``run_checks``); this engine registers each view as a Spark
temp view and runs the check's Spark SQL. A view's files are read:

- by Spark's own Parquet reader, each column by its Iceberg field id (``upsert.read_by_id``, what
  the upsert and the incremental input read with), where it serves: files on a filesystem Spark
  reaches (not an object store, which pyspark has no connector for: ``file_io``), without delete
  files (the reader would not apply them), each carrying field ids (the package's Spark writer
  and pyiceberg write them; a file written without, which the table's name mapping resolves, would
  fail the read). The rows then stay in Spark.
- otherwise by pyiceberg's reader in the task, handed to ``spark.createDataFrame``: those rows pass
  through the task's memory, as DuckDB's do.

The session is reached as the write reaches it from a task: a Spark Connect server's, given a
``spark_connect`` connection (``connect_write.connect_session``: a session of the task's own,
stopped after the last check); else a local session in the task's process (the one already active
there, whose temp views it drops again, or a new ``local[*]`` one it stops). A query Spark refuses
is that check failing with Spark's error; a server that went away fails the task, to be retried.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pyarrow.parquet as pq
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import SchemaMismatch
from airflow_provider_exactly_once.sinks.iceberg.audit_checks import SHOWN_ROWS, CheckEngine, QueryRows, TableRows
from airflow_provider_exactly_once.spark.connect_write import connect_session, server_lost
from airflow_provider_exactly_once.spark.file_io import is_object_store
from airflow_provider_exactly_once.spark.upsert import FIELD_ID_READ, read_by_id
from airflow_provider_exactly_once.type_mapping import spark_schema

log = logging.getLogger(__name__)

#: The checks' session: the zone the writer's sessions use (a literal timestamp means UTC), and
#: Parquet columns resolved by field id.
CHECK_SETTINGS = {"spark.sql.session.timeZone": "UTC", **FIELD_ID_READ}
#: A local session's own: no UI to bind a port for on a worker.
_LOCAL_SETTINGS = {**CHECK_SETTINGS, "spark.ui.enabled": "false"}
#: The Parquet footer's key for a column's Iceberg field id, as pyarrow reads it.
_FIELD_ID_KEY = b"PARQUET:field_id"
#: Footers read at once when checking that a view's files carry field ids.
_FOOTER_READERS = 16


@contextmanager
def spark_engine(url: str | None, *, retry_seconds: float) -> Iterator[CheckEngine]:
    """Spark's engine for one task's checks: on the Connect server at ``url`` (``sc://...``), or
    on a local session when ``url`` is ``None``."""
    if url is not None:
        with connect_session(url, CHECK_SETTINGS, retry_seconds=retry_seconds) as spark:
            yield SparkChecks(spark)  # the views go with the session
        return
    with _local_session() as spark:
        engine = SparkChecks(spark)
        try:
            yield engine
        finally:
            engine.drop_views()


@contextmanager
def _local_session() -> Iterator[SparkSession]:
    """The session already active in this process, left running; else a new local one, stopped."""
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    builder = SparkSession.builder.master("local[*]").appName("exactly-once audit checks")
    spark = builder.config(map=dict[str, Any](_LOCAL_SETTINGS)).getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


class SparkChecks:
    """A ``CheckEngine`` on one Spark session: each view a temp view, each query run by Spark."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._views: list[str] = []

    def register(self, view: str, parts: Sequence[TableRows]) -> None:
        frames = [self._frame(view, part) for part in parts]
        if frames:
            # A fan-out's tables hold the same columns per select.
            frame = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
        else:
            frame = self.spark.createDataFrame([], st.StructType([]))
        frame.createOrReplaceTempView(view)
        self._views.append(view)

    def run(self, sql: str) -> QueryRows:
        """The first rows, and the count only when there are more than the message shows."""
        frame = self.spark.sql(sql)
        first = [tuple(row) for row in frame.take(SHOWN_ROWS + 1)]
        count = len(first) if len(first) <= SHOWN_ROWS else frame.count()
        return list(frame.columns), count, first[:SHOWN_ROWS]

    def refused(self, exc: Exception) -> bool:
        return isinstance(exc, PySparkException) and not server_lost(exc)

    def drop_views(self) -> None:
        for view in self._views:
            self.spark.catalog.dropTempView(view)
        self._views.clear()

    def _frame(self, view: str, part: TableRows) -> DataFrame:
        paths = [task.file.file_path for task in part.tasks]
        table = ".".join(part.table.name())
        if _by_field_id(part):
            log.info("view %s: %d file(s) of %s read by Spark, by field id", view, len(paths), table)
            return read_by_id(self.spark, part.schema, paths)
        log.info("view %s: %d file(s) of %s read by pyiceberg, into Spark", view, len(paths), table)
        return self.spark.createDataFrame(part.to_arrow())


def _by_field_id(part: TableRows) -> bool:
    """Whether Spark's reader by field id serves ``part``: it has files, none on an object store,
    no delete file, every column of a type Spark has, and every file carries field ids (read from
    the footers only where the table's name mapping admits files without)."""
    if not part.tasks or any(is_object_store(t.file.file_path) or t.delete_files for t in part.tasks):
        return False
    try:
        spark_schema(part.schema)
    except SchemaMismatch:
        return False
    if part.table.metadata.name_mapping() is None:
        # No reader resolves a file without field ids in a table without a name mapping (pyiceberg
        # refuses it too, and add_files sets one): every file here carries them, no footer to read.
        return True
    paths = [t.file.file_path for t in part.tasks]
    with ThreadPoolExecutor(min(_FOOTER_READERS, len(paths))) as pool:
        return all(pool.map(functools.partial(_has_field_ids, part), paths))


def _has_field_ids(part: TableRows, path: str) -> bool:
    """Whether the file's footer names field ids: Spark's reader by id fails on a file without."""
    with part.table.io.new_input(path).open(seekable=True) as stream:
        found = pq.read_schema(stream)
    return any(field.metadata is not None and _FIELD_ID_KEY in field.metadata for field in found)
