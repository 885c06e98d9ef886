"""prepare(): everything that can never be committed is refused before the write is persisted."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
)

from airflow_provider_exactly_once.core.errors import CommitRefused, InvalidPreCommit, SchemaMismatch
from airflow_provider_exactly_once.core.precommit import PreCommit, WrittenColumn
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.write_check import check_target

from .iceberg_helpers import SIMPLE_SCHEMA, create_table, simple_write

TYPED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ratio", DoubleType(), required=False),
    NestedField(3, "amount", DecimalType(10, 2), required=False),
    NestedField(4, "tags", ListType(5, StringType(), element_required=False), required=False),
    NestedField(6, "note", StringType(), required=False),
)


def _with(pc: PreCommit, **changes: object) -> PreCommit:
    return pc.model_copy(update={"tables": [pc.tables[0].model_copy(update=changes)]})


def _columns(*spec: tuple[str, str, bool]) -> list[WrittenColumn]:
    return [WrittenColumn(name=n, type=t, required=r) for n, t, r in spec]


def test_valid_write_passes(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    IcebergSinkCommitter(catalog).prepare(simple_write(table, sink_id))


def test_location_outside_the_table(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    elsewhere = create_table(catalog, "u")
    pc = simple_write(elsewhere, sink_id)
    with pytest.raises(InvalidPreCommit, match=r"'ns.t'.*not inside the table location"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, table="ns.t"))
    assert table  # the target exists; only the location is wrong


@pytest.mark.parametrize("suffix", ["", "/data", "/metadata"])
def test_location_must_not_be_the_table_or_its_roots(catalog: SqlCatalog, sink_id: str, suffix: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    location = table.location().rstrip("/") + suffix
    descriptor = pc.tables[0].data_files[0].model_copy(update={"path": f"{location}/x.parquet"})
    bad = _with(pc, location=location, data_files=[descriptor])
    with pytest.raises(InvalidPreCommit, match="write location"):
        IcebergSinkCommitter(catalog).prepare(bad)


def test_plain_path_and_file_uri_are_the_same_location(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    plain = pc.tables[0].location.removeprefix("file://")
    files = [d.model_copy(update={"path": d.path.removeprefix("file://")}) for d in pc.tables[0].data_files]
    IcebergSinkCommitter(catalog).prepare(_with(pc, location=plain, data_files=files))


def test_partition_keys_must_match_the_spec(catalog: SqlCatalog, sink_id: str) -> None:
    schema = SIMPLE_SCHEMA
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name"))
    table = create_table(catalog, "p", schema, spec=spec)
    pc = simple_write(table, sink_id)  # descriptors carry no partition
    with pytest.raises(InvalidPreCommit, match=r"partition keys \[\].*\['name'\]"):
        IcebergSinkCommitter(catalog).prepare(pc)
    wrong_type = [d.model_copy(update={"partition": {"name": 5}}) for d in pc.tables[0].data_files]
    with pytest.raises(InvalidPreCommit, match="partition value 5"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=wrong_type))
    right = [d.model_copy(update={"partition": {"name": "n0"}}) for d in pc.tables[0].data_files]
    IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=right))


def test_declared_format_must_match_the_file(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    files = [d.model_copy(update={"format": "orc"}) for d in pc.tables[0].data_files]
    with pytest.raises(InvalidPreCommit, match="declared 'orc'"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=files))


def test_a_wrong_format_is_named_before_a_wrong_partition_of_an_earlier_file(catalog: SqlCatalog, sink_id: str) -> None:
    """The files are checked in one pass, yet the faults come out as the separate checks gave them:
    every file's format first, then its partition, then the columns its statistics name."""
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name"))
    table = create_table(catalog, "p", SIMPLE_SCHEMA, spec=spec)
    pc = simple_write(table, sink_id, files=3)
    files = [d.model_copy(update={"partition": {"name": "n0"}}) for d in pc.tables[0].data_files]
    files[0] = files[0].model_copy(update={"partition": {"name": 5}})
    files[2] = files[2].model_copy(update={"format": "orc"})
    with pytest.raises(InvalidPreCommit, match=f"{files[2].path}.*declared 'orc'"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=files))
    files[2] = files[2].model_copy(update={"format": "parquet", "column_sizes": {"ghost": 1}})
    with pytest.raises(InvalidPreCommit, match="partition value 5"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=files))
    files[0] = files[0].model_copy(update={"partition": {"name": "n0"}})
    with pytest.raises(SchemaMismatch, match=rf"{files[2].path}.*column sizes.*\['ghost'\]"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=files))


def test_an_extension_counts_only_in_the_file_name(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    [first] = pc.tables[0].data_files[:1]
    folder = f"{pc.tables[0].location}/x.orc"
    odd = [
        first.model_copy(update={"path": f"{folder}/part-0"}),  # no extension: any format
        first.model_copy(update={"path": f"{folder}/part-1.PARQUET"}),
    ]
    IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=odd))
    with pytest.raises(InvalidPreCommit, match="declared 'parquet' but its name says 'avro'"):
        IcebergSinkCommitter(catalog).prepare(
            _with(pc, data_files=[first.model_copy(update={"path": f"{folder}/part-2.Avro"})])
        )
    # Only the last extension counts: the format's own one earlier in the name does not make it right.
    with pytest.raises(InvalidPreCommit, match="declared 'parquet' but its name says 'orc'"):
        IcebergSinkCommitter(catalog).prepare(
            _with(pc, data_files=[first.model_copy(update={"path": f"{folder}/part-3.parquet.orc"})])
        )


@pytest.mark.parametrize(
    ("written", "match"),
    [
        (_columns(("id", "string", True)), r"id: written as string, the table has long"),
        (_columns(("id", "long", False)), r"id: written as optional"),
        (_columns(("ratio", "double", False)), r"required column\(s\) \['id'\]"),
        (_columns(("id", "long", True), ("amount", "decimal(12, 2)", False)), r"amount.*decimal\(12, 2\)"),
        (_columns(("id", "long", True), ("extra", "int", False)), r"'extra'.*not in the table"),
        (
            _columns(
                ("id", "long", True),
                (
                    "tags",
                    '{"type": "list", "element-id": 1, "element": "int", "element-required": false}',
                    False,
                ),
            ),
            r"tags.element: written as int, the table has string",
        ),
    ],
)
def test_schema_mismatches_name_table_and_column(
    catalog: SqlCatalog, sink_id: str, written: list[WrittenColumn], match: str
) -> None:
    table = create_table(catalog, "typed", TYPED)
    pc = simple_write(create_table(catalog, "t"), sink_id)
    bad = _with(pc, table="ns.typed", location=f"{table.location()}/data/w", data_files=[], schema_written=written)
    with pytest.raises(SchemaMismatch, match=r"'ns.typed'.*" + match):
        IcebergSinkCommitter(catalog).prepare(bad)


def test_promotions_and_type_spelling_are_accepted(catalog: SqlCatalog, sink_id: str) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ratio", DoubleType(), required=False),
        NestedField(3, "amount", DecimalType(10, 2), required=False),
        NestedField(4, "n", IntegerType(), required=False),
    )
    table = create_table(catalog, "typed", schema)
    written = _columns(("id", "int", True), ("ratio", "float", False), ("amount", "decimal(10,2)", False))
    pc = simple_write(create_table(catalog, "t"), sink_id)
    ok = _with(pc, table="ns.typed", location=f"{table.location()}/data/w", data_files=[], schema_written=written)
    IcebergSinkCommitter(catalog).prepare(ok)
    narrowing = _with(ok, schema_written=_columns(("id", "long", True), ("n", "long", False)))
    with pytest.raises(SchemaMismatch, match="n: written as long, the table has int"):
        IcebergSinkCommitter(catalog).prepare(narrowing)


def test_unknown_type_name_is_invalid(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id, schema_written=_columns(("id", "bigint", False)))
    with pytest.raises(InvalidPreCommit, match=r"'ns.t'.*'id'.*'bigint'"):
        IcebergSinkCommitter(catalog).prepare(pc)


def test_stats_of_unknown_columns_are_a_mismatch(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    files = [d.model_copy(update={"value_counts": {**d.value_counts, "ghost": 3}}) for d in pc.tables[0].data_files]
    with pytest.raises(SchemaMismatch, match=r"value counts.*\['ghost'\]"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=files))


def test_added_column_already_in_the_table(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    same = simple_write(table, sink_id, added_columns=_columns(("name", "string", False)))
    IcebergSinkCommitter(catalog).prepare(same)  # someone else added it: nothing left to add
    clash = simple_write(table, sink_id, added_columns=_columns(("name", "long", False)))
    with pytest.raises(SchemaMismatch, match="added column 'name' already exists"):
        IcebergSinkCommitter(catalog, allow_schema_evolution=True).prepare(clash)


def test_a_tag_where_the_branch_should_be_is_refused(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    table.append(pa.table({"id": [1], "name": ["a"], "score": [0.5]}))
    table.manage_snapshots().create_tag(table.metadata.current_snapshot_id, "audit").commit()
    pc = simple_write(table, sink_id)
    with pytest.raises(CommitRefused, match=r"sink .* epoch 1000 .*'ns.t'.*'audit' is a tag, not a branch") as caught:
        IcebergSinkCommitter(catalog, branch="audit").prepare(pc)
    assert not caught.value.retryable  # a tag does not turn into a branch by itself


def test_a_format_version_pyiceberg_cannot_append_to_is_refused(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    v3 = table.metadata.model_copy(update={"format_version": 3})  # pyiceberg 0.12 cannot create one
    with pytest.raises(CommitRefused, match="format version 3"):
        check_target(v3, pc.tables[0], branch="main", owner=pc.describe())
    check_target(table.metadata, pc.tables[0], branch="main", owner=pc.describe())


def test_files_of_an_older_spec_are_accepted_and_an_unknown_spec_is_refused(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)  # unpartitioned, for spec 0
    with table.update_spec() as update:
        update.add_identity("name")
    assert table.refresh().metadata.default_spec_id == 1
    committer = IcebergSinkCommitter(catalog)
    committer.prepare(pc)  # written for spec 0, which the table still has
    with pytest.raises(InvalidPreCommit, match=r"partition keys \[\], but partition spec 1 has \['name'\]") as caught:
        committer.prepare(_with(pc, spec_id=None))  # older metadata: the default spec applies
    assert "records no partition spec" in str(caught.value) and "write it again" in str(caught.value)
    with pytest.raises(InvalidPreCommit, match=r"has no partition spec 7 \(it has \[0, 1\]\).*abort the epoch"):
        committer.prepare(_with(pc, spec_id=7))
    with pytest.raises(InvalidPreCommit, match=r"partition keys \[\], but partition spec 1 has \['name'\]"):
        committer.prepare(_with(pc, spec_id=1))  # a write claiming the new spec must carry its keys


def test_a_spec_on_a_dropped_column_is_refused(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    with table.update_spec() as update:
        update.add_identity("name")
    table = table.refresh()
    pc = simple_write(table, sink_id)  # for spec 1, on "name"
    partitioned = [d.model_copy(update={"partition": {"name": "n0"}}) for d in pc.tables[0].data_files]
    pc = _with(pc, data_files=partitioned)
    IcebergSinkCommitter(catalog).prepare(pc)
    with table.update_spec() as update:
        update.remove_field("name")
    with table.update_schema() as schema_update:
        schema_update.delete_column("name")
    stats = [
        d.model_copy(update={k: {c: v for c, v in getattr(d, k).items() if c != "name"} for k in _STATS})
        for d in partitioned
    ]
    with pytest.raises(InvalidPreCommit, match=r"partition field\(s\) \['name'\] of spec 1 are on columns"):
        IcebergSinkCommitter(catalog).prepare(_with(pc, data_files=stats))


_STATS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds")
