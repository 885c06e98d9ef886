"""A real pipeline for tests: meta store, Iceberg SQL catalog, file sink, checkpoint table, coordinator.

Nothing here is a double: rows are written as real Parquet files, described with the same
``describe_parquet_file`` the Spark writer uses, and committed through pyiceberg.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from airflow_provider_exactly_once.checkpoints import MetaStoreCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.sinks.iceberg.table_transactions import SETTING
from airflow_provider_exactly_once.store import SqlSinkStateStore

#: Every test table has these columns; ``write_id`` lets a test attribute each visible row to a write.
ROW_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "epoch", LongType(), required=False),
    NestedField(3, "write_id", StringType(), required=False),
)
ARROW_SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), pa.field("epoch", pa.int64()), pa.field("write_id", pa.string())]
)


def local_path(uri: str) -> str:
    return uri.removeprefix("file://")


@dataclass
class Pipeline:
    """One sink's world. Build a second one on the same URLs to play a concurrent coordinator."""

    meta_url: str
    catalog_url: str
    warehouse: Path
    catalog_name: str
    namespace: str
    fault: FaultHook = no_faults
    store: SqlSinkStateStore = field(init=False)
    catalog: SqlCatalog = field(init=False)
    checkpoints: MetaStoreCheckpointSource = field(init=False)
    #: Catalogs opened beside ``catalog`` (``table_by_table_committer``), disposed with it.
    _others: list[SqlCatalog] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.store = SqlSinkStateStore(self.meta_url)
        self.catalog = SqlCatalog(self.catalog_name, uri=self.catalog_url, warehouse=f"file://{self.warehouse}")
        self.checkpoints = MetaStoreCheckpointSource(self.store.checkpoints)

    # -- building blocks ---------------------------------------------------------------------------

    def create_table(self, name: str, partition_spec: PartitionSpec | None = None) -> Table:
        self.catalog.create_namespace_if_not_exists(self.namespace)
        return self.catalog.create_table(
            f"{self.namespace}.{name}", schema=ROW_SCHEMA, partition_spec=partition_spec or PartitionSpec()
        )

    def iceberg_committer(self, **options: Any) -> IcebergSinkCommitter:
        return IcebergSinkCommitter(self.catalog, fault=self.fault, **options)

    def table_by_table_committer(self, **options: Any) -> IcebergSinkCommitter:
        """A committer on a catalog of its own that commits a fan-out table by table
        (``exactly-once.multi-table-commit: false``, design.md D18), as on Glue: what a crash between
        two tables' commits needs."""
        catalog = SqlCatalog(
            self.catalog_name, uri=self.catalog_url, warehouse=f"file://{self.warehouse}", **{SETTING: "false"}
        )
        self._others.append(catalog)
        return IcebergSinkCommitter(catalog, fault=self.fault, **options)

    def file_committer(self, root: Path) -> FileSinkCommitter:
        return FileSinkCommitter(str(root), fault=self.fault)

    def coordinator(self, sink_id: str, committer: Any, **options: Any) -> TwoPhaseCommitCoordinator:
        return TwoPhaseCommitCoordinator(
            self.store, {sink_id: committer}, self.checkpoints, fault=self.fault, **options
        )

    def checkpoint(self, sink_id: str, epoch: int, status: CheckpointStatus) -> None:
        self.store.checkpoints.set_checkpoint(sink_id, epoch, status)

    # -- writes ------------------------------------------------------------------------------------

    def write_iceberg(
        self,
        sink_id: str,
        epoch: int,
        tables: Sequence[str],
        rows: int = 5,
        *,
        files: int = 1,
        write_id: str | None = None,
    ) -> PreCommit:
        """Write ``rows`` rows per table (over ``files`` files) into a fresh write location."""
        write_id = write_id or str(uuid.uuid4())
        writes = []
        for name in tables:
            table = self.catalog.load_table(f"{self.namespace}.{name}")
            location = f"{table.location()}/data/_eo/{write_id}"
            partition = _partition_of_epoch(table, epoch)
            writes.append(
                TableWrite(
                    table=f"{self.namespace}.{name}",
                    location=location,
                    data_files=self._parquet_files(location, table.schema(), epoch, write_id, rows, files, partition),
                    spec_id=table.metadata.default_spec_id,
                )
            )
        return PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=writes)

    def write_files(self, sink_id: str, epoch: int, root: Path, rows: int = 5, *, files: int = 2) -> PreCommit:
        write_id = str(uuid.uuid4())
        location = f"{root}/_staging/{write_id}"
        descriptors = self._parquet_files(location, ROW_SCHEMA, epoch, write_id, rows, files)
        return PreCommit(
            sink_id=sink_id,
            epoch=epoch,
            write_id=write_id,
            tables=[TableWrite(table=str(root), location=location, data_files=descriptors)],
        )

    def _parquet_files(
        self,
        location: str,
        schema: Schema,
        epoch: int,
        write_id: str,
        rows: int,
        files: int,
        partition: dict[str, int] | None = None,
    ) -> list[DataFileDescriptor]:
        if rows == 0:
            return []
        Path(local_path(location)).mkdir(parents=True, exist_ok=True)
        descriptors = []
        per_file = -(-rows // files)
        for n, start in enumerate(range(0, rows, per_file)):
            ids = list(range(epoch * 1_000_000 + start, epoch * 1_000_000 + min(rows, start + per_file)))
            data = pa.table(
                {"id": ids, "epoch": [epoch] * len(ids), "write_id": [write_id] * len(ids)}, schema=ARROW_SCHEMA
            )
            path = f"{location}/part-{n:05d}.parquet"
            pq.write_table(data, local_path(path))
            descriptors.append(
                describe_parquet_file(path, table_schema=schema, partition=partition or {}, writer=str(n))
            )
        return descriptors

    # -- reading back ------------------------------------------------------------------------------

    def rows(self, name: str, branch: str = "main") -> list[dict[str, Any]]:
        """The rows the head of ``branch`` shows (none while the branch does not exist yet)."""
        table = self.catalog.load_table(f"{self.namespace}.{name}")
        ref = table.metadata.refs.get(branch)
        if ref is None:
            return []
        rows = table.scan(snapshot_id=ref.snapshot_id).to_arrow().to_pylist()
        return sorted(rows, key=lambda r: r["id"])

    def marker_snapshots(self, name: str, sink_id: str) -> dict[int, list[str]]:
        """Epoch -> write ids of every snapshot carrying this sink's marker (ancestry of main)."""
        table = self.catalog.load_table(f"{self.namespace}.{name}")
        found: dict[int, list[str]] = {}
        for snapshot in table.snapshots():
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if summary.get("exactly-once.sink-id") == sink_id:
                found.setdefault(int(summary["exactly-once.epoch"]), []).append(summary["exactly-once.write-id"])
        return found

    def dispose(self) -> None:
        self.store.dispose()
        for catalog in (self.catalog, *self._others):
            engine = getattr(catalog, "engine", None)
            if engine is not None:
                engine.dispose()


def _partition_of_epoch(table: Table, epoch: int) -> dict[str, int]:
    """Every row of a test write has one epoch, so a table partitioned by identity(epoch) (a test's
    spec change) gets one partition value per file; other partition fields are not supported here."""
    partition: dict[str, int] = {}
    for spec_field in table.spec().fields:
        source = table.schema().find_field(spec_field.source_id).name
        if source != "epoch" or str(spec_field.transform) != "identity":
            raise ValueError(f"test writes support identity(epoch) partitions only, not {spec_field}")
        partition[spec_field.name] = epoch
    return partition


def write_location_exists(pre: PreCommit) -> bool:
    return any(Path(local_path(t.location)).exists() for t in pre.tables)


def expected_rows(writes: Iterable[PreCommit], table: str) -> list[tuple[int, int, str]]:
    """The rows the given writes put into ``table``, as (id, epoch, write_id), sorted."""
    out = []
    for pre in writes:
        for data_file in pre.table(table).data_files:
            out.extend(
                (r["id"], r["epoch"], r["write_id"]) for r in pq.read_table(local_path(data_file.path)).to_pylist()
            )
    return sorted(out)


def as_tuples(rows: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    return sorted((r["id"], r["epoch"], r["write_id"]) for r in rows)
