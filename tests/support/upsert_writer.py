"""A small copy-on-write writer for upsert pre-commits, in pyarrow, for tests that drive the
coordinator and the committer through many interleavings without paying for a Spark job each time.

It produces what ``spark/upsert.py`` produces (the files holding a changed key rewritten without
those keys, the changed rows in a new file, the snapshot read, the key range, the counts; for a
revision, planned before the write it revises), by the same rule, on an unpartitioned table
``(id long required, value string)``, through the table's FileIO (local disk or S3). The Spark job
itself is tested against the table in ``tests/spark/test_upsert.py``.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import to_bytes
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from airflow_provider_exactly_once.core.faults import FaultHook
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import ChangeCounts, RevisionBasis, RewrittenFile
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.sinks.layout import iceberg_data_root, iceberg_write_location
from tests.support.pipeline import Pipeline

KEYED = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "value", StringType()))
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("value", pa.string())])
#: A change: the key's new value, or ``None`` for a delete.
Changes = Mapping[int, str | None]


def keyed_pipeline(root: Path, fault: FaultHook) -> Pipeline:
    """A SQLite meta store and catalog under ``root`` with the empty keyed table ``ns.t``."""
    (root / "warehouse").mkdir(exist_ok=True)
    pipeline = Pipeline(
        meta_url=f"sqlite:///{root / 'meta.db'}",
        catalog_url=f"sqlite:///{root / 'catalog.db'}",
        warehouse=root / "warehouse",
        catalog_name="keyed",
        namespace="ns",
        fault=fault,
    )
    pipeline.catalog.create_namespace_if_not_exists("ns")
    pipeline.catalog.create_table("ns.t", schema=KEYED)
    return pipeline


def _bound(value: int) -> str:
    return base64.b64encode(to_bytes(LongType(), value)).decode("ascii")


def write_upsert(
    catalog: Catalog,
    table_name: str,
    sink_id: str,
    epoch: int,
    changes: Changes,
    write_id: str,
    *,
    revision: RevisionBasis | None = None,
) -> PreCommit:
    """The epoch's changes applied copy-on-write against the head of ``main`` as it is now; or, as
    a ``revision`` (``core.decisions.revision_basis``), against the table before the write it
    revises, rewriting that write's rewritten files too (what ``spark/upsert.py`` does)."""
    table = catalog.load_table(table_name)
    read_id = _planned_at(table, revision)
    location = iceberg_write_location(iceberg_data_root(table.location(), table.properties), write_id)
    keys = pa.array(sorted(changes), pa.int64())
    forced = set(revision.rewritten) if revision is not None else set()
    rewritten: list[RewrittenFile] = []
    kept: list[pa.Table] = []
    found: set[int] = set()
    if read_id is not None and (len(keys) or forced):
        for task in table.scan(snapshot_id=read_id).plan_files():
            with table.io.new_input(task.file.file_path).open() as stream:
                data = pq.read_table(stream).select(["id", "value"]).cast(ARROW)
            hit = pc.is_in(data.column("id"), value_set=keys)
            if not pc.any(hit).as_py() and task.file.file_path not in forced:
                continue
            found.update(data.filter(hit).column("id").to_pylist())
            rewritten.append(RewrittenFile(path=task.file.file_path, record_count=data.num_rows))
            kept.append(data.filter(pc.invert(hit)))
    assert forced <= {r.path for r in rewritten}, "a file the revised write rewrote is not in the table before it"
    upserts = {k: v for k, v in changes.items() if v is not None}
    new = pa.table({"id": list(upserts), "value": list(upserts.values())}, schema=ARROW)
    rows = pa.concat_tables([*kept, new])
    data_files = []
    if rows.num_rows:
        buffer = io.BytesIO()
        pq.write_table(rows, buffer)
        payload = buffer.getvalue()
        with table.io.new_output(f"{location}/part-0.parquet").create(overwrite=True) as stream:
            stream.write(payload)
        data_files.append(
            describe_parquet_file(
                f"{location}/part-0.parquet",
                table_schema=table.schema(),
                partition={},
                writer="0",
                parquet_metadata=pq.read_metadata(io.BytesIO(payload)),
                file_size_in_bytes=len(payload),
            )
        )
    updated = sum(1 for k in upserts if k in found)
    deleted = sum(1 for k, v in changes.items() if v is None and k in found)
    bounds = (
        {"key_lower_bounds": {"id": _bound(min(changes))}, "key_upper_bounds": {"id": _bound(max(changes))}}
        if changes
        else {}
    )
    write = TableWrite(
        table=table_name,
        location=location,
        data_files=data_files,
        rewritten=rewritten,
        read_snapshot_id=read_id,
        changes=ChangeCounts(
            inserted=len(upserts) - updated,
            updated=updated,
            deleted=deleted,
            deletes_of_absent_keys=len(changes) - len(upserts) - deleted,
        ),
        revises=None if revision is None else revision.revised(),
        **bounds,  # type: ignore[arg-type]
    )
    return PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=[write])


def _planned_at(table: Table, revision: RevisionBasis | None) -> int | None:
    if revision is None:
        head = table.metadata.snapshot_by_name("main")
        return None if head is None else head.snapshot_id
    if revision.parent_of is None:
        return revision.snapshot_id
    committed = table.metadata.snapshot_by_id(revision.parent_of)
    assert committed is not None, "the revised write's snapshot expired"
    return committed.parent_snapshot_id
