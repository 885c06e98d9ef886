"""OpenLineage datasets of an epoch's write and commit, built from the pre-commit metadata.

Named as OpenLineage's Spark integration names Iceberg tables (physically by location, with a
``symlinks`` facet naming the catalog table), so the datasets join with what an instrumented Spark
job reports; the naming: docs/observability.md. OpenLineage is imported inside the functions: it is
optional, and importing it costs every task process that never emits lineage.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.observability.run_origin import RunOrigin
from airflow_provider_exactly_once.sinks.layout import parse_location

if TYPE_CHECKING:
    from airflow.providers.common.compat.openlineage.facet import Dataset, OutputDataset
    from airflow.providers.openlineage.extractors import OperatorLineage

log = logging.getLogger(__name__)
#: The commit's run facet (``commit_lineage``).
EPOCH_FACET = "exactlyOnce"


@dataclass(frozen=True)
class TableInfo:
    """What lineage needs of a loaded table: where it lives and its current columns."""

    location: str
    #: ``(name, type, doc)`` of each top-level column.
    columns: list[tuple[str, str, str | None]]


#: Loads ``namespace.table`` (``None`` when it cannot be loaded).
TableLoader = Callable[[str], "TableInfo | None"]


def table_info(table: Any) -> TableInfo:
    """``TableInfo`` of a pyiceberg table."""
    return TableInfo(
        location=str(table.location()),
        columns=[(field.name, str(field.field_type), field.doc) for field in table.schema().fields],
    )


def location_dataset_name(location: str) -> tuple[str, str]:
    """OpenLineage ``(namespace, name)`` of a storage location, per the naming spec's file systems."""
    parsed = parse_location(location)
    if parsed.scheme == "file":
        return "file", parsed.path
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")


def catalog_namespace(catalog: str) -> str:
    return f"iceberg://{catalog}"


def load_info(load: TableLoader | None, table: str) -> TableInfo | None:
    if load is None:
        return None
    try:
        return load(table)
    except Exception as exc:  # lineage must never fail the task; fall back to the logical name
        log.warning("OpenLineage: could not load Iceberg table %r: %s", table, exc)
        return None


def table_dataset(
    catalog: str,
    table: str,
    info: TableInfo | None,
    facets: dict[str, Any],
    *,
    output_facets: dict[str, Any] | None = None,
) -> Dataset:
    """An Iceberg table as an input or output dataset: physical identity, with a symlink to the catalog's."""
    from airflow.providers.common.compat.openlineage.facet import (
        Identifier,
        InputDataset,
        OutputDataset,
        SymlinksDatasetFacet,
    )

    if info is None:
        namespace, name = catalog_namespace(catalog), table
    else:
        namespace, name = location_dataset_name(info.location)
        facets = {
            **facets,
            "symlinks": SymlinksDatasetFacet(
                identifiers=[Identifier(namespace=catalog_namespace(catalog), name=table, type="TABLE")]
            ),
        }
    if output_facets is None:
        return InputDataset(namespace=namespace, name=name, facets=facets)
    return OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=output_facets)


def schema_facet(write: TableWrite, info: TableInfo | None) -> Any | None:
    """The columns as written; the table's own when the write did not list them (it kept the
    table's schema); ``None`` when neither is known."""
    from airflow.providers.common.compat.openlineage.facet import SchemaDatasetFacet, SchemaDatasetFacetFields

    if write.schema_written:
        columns = [(column.name, column.type, column.doc) for column in write.schema_written]
    elif info is not None:
        columns = info.columns
    else:
        return None
    return SchemaDatasetFacet(
        fields=[SchemaDatasetFacetFields(name=name, type=type_, description=doc) for name, type_, doc in columns]
    )


def statistics_facet(write: TableWrite) -> Any:
    from airflow.providers.common.compat.openlineage.facet import OutputStatisticsOutputDatasetFacet

    return OutputStatisticsOutputDatasetFacet(
        rowCount=write.record_count,
        size=write.data_files.size_in_bytes(),
        fileCount=len(write.data_files),
    )


def output_datasets(
    catalog: str, pre_commit: PreCommit, load: TableLoader | None, *, with_statistics: bool = True
) -> list[OutputDataset]:
    """One output dataset per table of the write, with its schema and (optionally) its statistics."""
    outputs: list[OutputDataset] = []
    for write in pre_commit.tables:
        info = load_info(load, write.table)
        facets: dict[str, Any] = {}
        schema = schema_facet(write, info)
        if schema is not None:
            facets["schema"] = schema
        output_facets: dict[str, Any] = {}
        if with_statistics:
            output_facets["outputStatistics"] = statistics_facet(write)
        dataset = table_dataset(catalog, write.table, info, facets, output_facets=output_facets)
        outputs.append(dataset)  # type: ignore[arg-type]  # an OutputDataset, as output_facets is given
    return outputs


def file_sink_outputs(pre_commit: PreCommit, root: str, *, with_statistics: bool = True) -> list[OutputDataset]:
    """A file sink is one dataset: its root directory."""
    from airflow.providers.common.compat.openlineage.facet import OutputDataset

    namespace, name = location_dataset_name(root)
    output_facets: dict[str, Any] = {}
    if with_statistics and pre_commit.tables:
        output_facets["outputStatistics"] = statistics_facet(pre_commit.tables[0])
    return [OutputDataset(namespace=namespace, name=name, outputFacets=output_facets)]


def files_input(path: str) -> Dataset:
    from airflow.providers.common.compat.openlineage.facet import InputDataset

    namespace, name = location_dataset_name(path)
    return InputDataset(namespace=namespace, name=name)


def lineage(
    inputs: Sequence[Dataset], outputs: Sequence[Dataset], *, run_facets: dict[str, Any] | None = None
) -> OperatorLineage[Any, Any]:
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=list(inputs), outputs=list(outputs), run_facets=dict(run_facets or {}))


@functools.cache
def _epoch_facet_class() -> type[Any]:
    """The ``exactlyOnce`` run facet: an OpenLineage ``RunFacet`` (its schema is the base one's,
    whose additional properties these are), made on first use since OpenLineage is optional."""
    import attr
    from airflow.providers.common.compat.openlineage.facet import RunFacet

    @attr.define
    class ExactlyOnceRunFacet(RunFacet):
        sinkId: str
        epoch: int
        writeId: str
        revision: int
        run: dict[str, Any]

    return ExactlyOnceRunFacet


def iceberg_connection_loader(conn_id: str) -> TableLoader:
    """Tables through the sink's Iceberg connection (the catalog is built on first use)."""

    def load(table: str) -> TableInfo | None:
        from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

        return table_info(IcebergHook(conn_id).catalog.load_table(table))

    return load


def pyiceberg_loader(catalog_name: str, properties: dict[str, str]) -> TableLoader:
    """Tables through a pyiceberg catalog built from properties (a Spark target's catalog)."""

    def load(table: str) -> TableInfo | None:
        from pyiceberg.catalog import load_catalog

        return table_info(load_catalog(catalog_name, **properties).load_table(table))

    return load


def commit_lineage(
    sink: Any, record: Any, *, committed_now: bool, origin: RunOrigin | None = None
) -> OperatorLineage[Any, Any]:
    """The commit task's outputs: the sink's tables (or root), with statistics when it made them
    visible; and a run facet ``exactlyOnce`` naming the epoch, its write and revision, and how the
    committing run came about (``run_origin``), so a consumer tells a correction from a first delivery."""
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    if record is None:
        return lineage([], [])
    if isinstance(sink, IcebergSinkConfig):
        outputs = output_datasets(
            sink.iceberg_conn_id,
            record.pre_commit,
            iceberg_connection_loader(sink.iceberg_conn_id),
            with_statistics=committed_now,
        )
    else:
        outputs = file_sink_outputs(record.pre_commit, sink.root, with_statistics=committed_now)
    facet = _epoch_facet_class()(
        sinkId=record.sink_id,
        epoch=record.epoch,
        writeId=record.write_id,
        revision=record.revision,
        run={} if origin is None else origin.model_dump(mode="json"),
    )
    return lineage([], outputs, run_facets={EPOCH_FACET: facet})


def write_lineage(input_spec: dict[str, Any], target_spec: dict[str, Any], pre_commit: PreCommit | None) -> Any:
    """The Spark write's lineage: its file input, and the target's tables with what the write produced.

    A ``files`` input and an incremental ``iceberg_table`` input (read by the writer's own tasks,
    which OpenLineage's Spark integration does not see as a table) name a dataset here; tables and
    queries read by Spark are for that integration, which sees the query plan. Nothing is visible yet at this
    point, but the statistics are those of the data written for the target (OpenLineage's
    ``outputStatistics`` describes what the job wrote).
    """
    inputs: list[Dataset] = []
    if input_spec.get("kind") == "files" and isinstance(input_spec.get("path"), str):
        inputs.append(files_input(input_spec["path"]))
    if input_spec.get("kind") == "iceberg_table" and isinstance(input_spec.get("table"), str):
        upstream = input_spec.get("catalog_conn_id") or target_spec.get("catalog_name") or "default"
        load = None
        if not input_spec.get("catalog_conn_id") and target_spec.get("kind") == "iceberg":
            load = pyiceberg_loader(str(upstream), dict(target_spec.get("catalog_properties") or {}))
        elif input_spec.get("catalog_conn_id"):
            load = iceberg_connection_loader(str(upstream))
        inputs.append(table_dataset(str(upstream), input_spec["table"], load_info(load, input_spec["table"]), {}))
    if pre_commit is None:
        return lineage(inputs, [])
    if target_spec.get("kind") == "iceberg":
        catalog = str(target_spec.get("catalog_name") or "default")
        load = pyiceberg_loader(catalog, dict(target_spec.get("catalog_properties") or {}))
        return lineage(inputs, output_datasets(catalog, pre_commit, load))
    return lineage(inputs, file_sink_outputs(pre_commit, str(target_spec["root"])))
