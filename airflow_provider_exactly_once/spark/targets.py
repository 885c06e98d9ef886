"""Where an epoch's files go: an Iceberg table (loaded on the driver) or a file sink's staging area.

Both are reduced to the same few facts the write needs (location, schema, partitioning, writer
properties, and the FileIO properties that reach the files), so the write path has no branch per
sink kind. Partitioning is checked here (``check_spec``), before the input is
read: a spec the writer cannot honour is refused before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.transforms import IdentityTransform

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, SchemaMismatch, UnknownTable
from airflow_provider_exactly_once.sinks.layout import iceberg_data_root, iceberg_write_location
from airflow_provider_exactly_once.spark.file_io import storage_properties
from airflow_provider_exactly_once.spark.jobspec import FileSinkTarget, IcebergTarget
from airflow_provider_exactly_once.spark.writers import DEFAULT_TARGET_FILE_SIZE, IDENTITY_SOURCES, check_spec

FILE_SINK_PARTITION_FIELD_ID = 1000


@dataclass
class ResolvedTarget:
    name: str
    location: str
    #: The table's schema; ``None`` for a file sink, whose schema is the DataFrame's.
    schema: Schema | None
    last_column_id: int
    partition_style: Literal["iceberg", "hive"]
    spec: PartitionSpec | None = None
    #: The id of ``spec`` in the table, recorded so the commit files the write under the spec it was
    #: partitioned for even if the table's spec changes before then; ``None`` for a file sink.
    spec_id: int | None = None
    partition_by: list[str] = field(default_factory=list)
    write_properties: dict[str, str] = field(default_factory=dict)
    io_properties: dict[str, str] = field(default_factory=dict)
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    #: The loaded pyiceberg table (an Iceberg target): an upsert plans its rewrite from it.
    table: Any = None

    def spec_for(self, write_schema: Schema) -> PartitionSpec:
        if self.spec is not None:
            return self.spec
        return PartitionSpec(
            *[
                PartitionField(
                    source_id=write_schema.find_field(name).field_id,
                    field_id=FILE_SINK_PARTITION_FIELD_ID + i,
                    transform=IdentityTransform(),
                    name=name,
                )
                for i, name in enumerate(self.partition_by)
            ]
        )

    def check_partition_sources(self, write_schema: Schema) -> None:
        if self.spec is not None:
            return  # checked against the table's own schema when it was loaded
        names = {f.name: f for f in write_schema.fields}
        for name in self.partition_by:
            if name not in names:
                raise SchemaMismatch(f"file sink {self.name!r}: partition column {name!r} is not in the input")
            if not isinstance(names[name].field_type, IDENTITY_SOURCES):
                raise SchemaMismatch(
                    f"file sink {self.name!r}: partition column {name!r} has type {names[name].field_type}; "
                    "partition directories take boolean, integer, floating, string, date or timestamp values"
                )


def load_iceberg_target(target: IcebergTarget, write_id: str) -> ResolvedTarget:
    catalog = load_catalog(target.catalog_name, **target.catalog_properties)
    try:
        table = catalog.load_table(target.table)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise UnknownTable(f"catalog {target.catalog_name!r} has no table {target.table!r}: {exc}") from None
    schema = table.schema()
    spec = table.spec()
    check_spec(target.table, spec, schema)
    properties = dict(table.properties)
    data_root = iceberg_data_root(table.location(), properties)
    return ResolvedTarget(
        name=target.table,
        location=iceberg_write_location(data_root, write_id),
        schema=schema,
        last_column_id=table.metadata.last_column_id,
        partition_style="iceberg",
        spec=spec,
        spec_id=spec.spec_id,
        write_properties=properties,
        # The catalog's storage properties, then what the loaded table's FileIO holds: a REST catalog
        # that vends credentials puts them there, scoped to this table, and they win.
        io_properties=storage_properties({**target.catalog_properties, **table.io.properties}),
        target_file_size=int(properties.get(TableProperties.WRITE_TARGET_FILE_SIZE_BYTES, DEFAULT_TARGET_FILE_SIZE)),
        table=table,
    )


def load_file_target(target: FileSinkTarget, write_id: str) -> ResolvedTarget:
    if len(set(target.partition_by)) != len(target.partition_by):
        raise InvalidSinkConfig(f"file sink {target.root!r}: a partition column is listed twice")
    return ResolvedTarget(
        name=target.root,
        location=target.write_location(write_id),
        schema=None,
        last_column_id=0,
        partition_style="hive",
        partition_by=list(target.partition_by),
        write_properties=dict(target.write_properties),
        io_properties=dict(target.io_properties),
        target_file_size=int(
            target.write_properties.get(TableProperties.WRITE_TARGET_FILE_SIZE_BYTES, DEFAULT_TARGET_FILE_SIZE)
        ),
    )
