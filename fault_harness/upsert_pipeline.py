"""The upsert variant of the harness pipeline (``pipeline.build`` with ``mode="upsert"``).

Its sink is an upsert sink keyed by ``event_id`` with an operation column and an order column
(``upsert_changes.SPEC``); each hour's landed files are changes (``upsert_changes.hour_changes``),
and its light write (``light_upsert_write``) applies them copy-on-write against the table as it is
when the write runs (``upsert_writer``), producing the pre-commit the Spark upsert job would. The
DAG runs one epoch at a time (``max_active_runs=1``): an epoch written before the previous one
committed has not seen its rows, which the product refuses (``UpsertConflict``) rather than let
through, so overlapping runs would test the refusal, not the pipeline.

This module imports Airflow: only the DAG files of the cluster import it, never the harness.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from fault_harness.layout import WRITE_POINT, hour_template
from fault_harness.upsert_changes import SPEC


def upsert_sink(sink_id: str, table: str, conn_id: str) -> IcebergSinkConfig:
    """The upsert pipeline's sink: the landed changes' key, operation column and order column."""
    return IcebergSinkConfig(sink_id, (table,), iceberg_conn_id=conn_id, upsert=SPEC)


def light_upsert_write(sink_id: str, table_name: str, landing: str, conn_id: str) -> dict[str, Any]:
    """One upsert epoch's write without Spark: the hour's changes applied copy-on-write against the
    table's head as it is now, returned as pre-commit metadata (nothing visible). Reaches the fault
    point ``write.files_written`` after its files exist, as the light append write does."""
    from demo.fault_plan import fault_hook_for
    from fault_harness.runs import running_write
    from fault_harness.upsert_changes import last_per_key, read_changes
    from fault_harness.upsert_writer import write_upsert

    start, epoch, attempt, (table,) = running_write(conn_id, [table_name])
    changes = last_per_key(read_changes(Path(hour_template(landing).format(start=start))))
    pre = write_upsert(
        table, table_name, sink_id, epoch, str(uuid.uuid4()), changes, file_name=f"part-00000-{attempt}.parquet"
    )
    fault_hook_for(sink_id, epoch, attempt)(WRITE_POINT)
    counts = pre.tables[0].changes
    print(
        f"upsert write {pre.write_id}: {counts.describe() if counts else ''}, {len(pre.tables[0].rewritten)} "
        f"file(s) rewritten, read snapshot {pre.tables[0].read_snapshot_id}",
        flush=True,
    )
    value: dict[str, Any] = json.loads(pre.model_dump_json(exclude_defaults=True))
    return value
