"""Everything that makes one table's write uncommittable, checked against the table's metadata before
the write is persisted and again before it is committed: its locations, its partition spec and its
columns' types (design.md, 'The Iceberg commit').
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.types import IcebergType, NestedField

from airflow_provider_exactly_once.core.errors import CommitRefused, InvalidPreCommit, SchemaMismatch
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, TableWrite, WrittenColumn
from airflow_provider_exactly_once.sinks.iceberg.data_files import partition_record
from airflow_provider_exactly_once.sinks.layout import iceberg_data_root, parse_location
from airflow_provider_exactly_once.type_mapping import field_reads_as, parse_type, reads_as

# Everything that makes one table's write uncommittable, checked against the table's metadata.
#
# ``validate`` runs these before the write is persisted, and ``commit`` runs them again on the freshly
# loaded table before changing anything (the table may have changed in between). The location checks
# matter beyond tidiness: an abort deletes everything below the write location, so a location that is
# the table itself, or contains its data or metadata root, must never get that far.

_EXTENSIONS = {".parquet": "parquet", ".orc": "orc", ".avro": "avro"}
_SUFFIXES = {format_: extension for extension, format_ in _EXTENSIONS.items()}
_WRITE_METADATA_PATH = "write.metadata.path"
#: The highest table format version pyiceberg 0.12 writes manifests for.
_MAX_FORMAT_VERSION = 2
#: What to do about a write whose files cannot go into the table as they are.
WRITE_AGAIN = (
    "it can never be committed as written: abort the epoch (with force=True once its checkpoint "
    "completed) and write it again"
)


def check_location(metadata: TableMetadata, write: TableWrite) -> None:
    table_root = parse_location(metadata.location)
    location = parse_location(write.location)
    if not location.is_inside(table_root):
        raise InvalidPreCommit(
            f"table {write.table!r}: write location {write.location!r} is not inside the table location "
            f"{metadata.location!r}"
        )
    protected = {
        "data root": iceberg_data_root(metadata.location, metadata.properties),
        "metadata root": metadata.properties.get(_WRITE_METADATA_PATH, metadata.location.rstrip("/") + "/metadata"),
    }
    for what, root in protected.items():
        if location.is_at_or_above(parse_location(root)):
            raise InvalidPreCommit(
                f"table {write.table!r}: write location {write.location!r} is or contains the table's {what} "
                f"{root!r}; it must be a directory unique to the write (an abort deletes everything below it)"
            )


def _check_format(write: TableWrite, descriptor: DataFileDescriptor) -> None:
    path = descriptor.path
    # The text from the path's last dot: a known extension only when no "/" follows it.
    implied = _EXTENSIONS.get(path[path.rfind(".") :].lower())
    if implied is not None and implied != descriptor.format:
        raise InvalidPreCommit(
            f"table {write.table!r}: data file {descriptor.path!r} is declared {descriptor.format!r} "
            f"but its name says {implied!r}"
        )


def _check_named(write: TableWrite, named: set[str], known: set[str]) -> None:
    if known.issuperset(named):
        return  # one set test for the whole write; the loop below only runs to name the culprit
    for descriptor in write.data_files:
        for what, stats in (
            ("column sizes", descriptor.column_sizes),
            ("value counts", descriptor.value_counts),
            ("null counts", descriptor.null_value_counts),
            ("NaN counts", descriptor.nan_value_counts),
            ("lower bounds", descriptor.lower_bounds),
            ("upper bounds", descriptor.upper_bounds),
        ):
            if known.issuperset(stats):
                continue  # the common case, without building a set per file and statistic
            unknown = sorted(set(stats) - known)
            if unknown:
                raise SchemaMismatch(
                    f"table {write.table!r}: data file {descriptor.path!r} has {what} for column(s) "
                    f"{unknown}, which the table does not have"
                )


def check_target(metadata: TableMetadata, write: TableWrite, *, branch: str, owner: str) -> None:
    """Refuse a table the append would refuse whatever the write holds: a tag where the committer's
    branch should be, or a format version pyiceberg cannot write manifests for."""
    ref = metadata.refs.get(branch)
    if ref is not None and ref.snapshot_ref_type != SnapshotRefType.BRANCH:
        raise CommitRefused(
            f"{owner}: table {write.table!r}: {branch!r} is a {ref.snapshot_ref_type}, not a branch, and only "
            "a branch can receive commits; configure the sink with a branch, or remove the tag"
        )
    if metadata.format_version > _MAX_FORMAT_VERSION:
        raise CommitRefused(
            f"{owner}: table {write.table!r} has format version {metadata.format_version}; pyiceberg 0.12 "
            f"appends to format versions up to {_MAX_FORMAT_VERSION} only"
        )


def write_spec(metadata: TableMetadata, write: TableWrite, *, owner: str) -> PartitionSpec:
    """The spec the write's files were partitioned for; the table's default one for metadata that
    records none (written before the spec id was kept)."""
    if write.spec_id is None:
        return metadata.spec()
    specs = metadata.specs()
    spec = specs.get(write.spec_id)
    if spec is None:
        raise InvalidPreCommit(
            f"{owner}: table {write.table!r} has no partition spec {write.spec_id} (it has {sorted(specs)}), "
            f"yet the write's files were partitioned for it; {WRITE_AGAIN}"
        )
    return spec


def _partition_check(
    metadata: TableMetadata, write: TableWrite, *, owner: str
) -> tuple[PartitionSpec, Callable[[DataFileDescriptor], None]]:
    """The spec the write is committed under, once its fields are checked against the schema, and
    the check of one file's partition tuple against it."""
    spec = write_spec(metadata, write, owner=owner)
    schema = metadata.schema()
    unknown = [f.name for f in spec.fields if schema.find_column_name(f.source_id) is None]
    note = (
        ""
        if write.spec_id is not None
        else f" (the write records no partition spec, so the table's current spec {spec.spec_id} applies)"
    )
    if unknown:
        raise InvalidPreCommit(
            f"{owner}: table {write.table!r}: partition field(s) {unknown} of spec {spec.spec_id} are on columns "
            f"the table no longer has{note}; {WRITE_AGAIN}"
        )
    checked: set[tuple[tuple[str, object], ...]] = set()

    def check(descriptor: DataFileDescriptor) -> None:
        # As the writer ordered it: the files of one partition share the order, and a tuple met
        # again in another order is merely checked once more.
        key = tuple(descriptor.partition.items())
        if key in checked:  # an epoch's thousands of files share a handful of partitions
            return
        try:
            partition_record(descriptor, spec=spec, schema=schema, table=write.table)
        except InvalidPreCommit as exc:
            raise InvalidPreCommit(f"{owner}: {exc}{note}; {WRITE_AGAIN}") from None
        checked.add(key)

    return spec, check


def check_table_write(
    metadata: TableMetadata, write: TableWrite, *, branch: str, allow_schema_evolution: bool, owner: str
) -> list[ColumnToAdd]:
    """Refuse what cannot be committed into this table; return the columns the commit must add.

    ``owner`` (``PreCommit.describe()``) starts the refusals that name what to do about the epoch.
    """
    check_target(metadata, write, branch=branch, owner=owner)
    check_location(metadata, write)
    schema = metadata.schema()
    if _files_checked_at_persist(metadata, write):
        return check_columns(
            schema, write, allow_schema_evolution=allow_schema_evolution, last_column_id=metadata.last_column_id
        )
    named = _check_files(metadata, write, owner=owner)
    to_add = check_columns(
        schema, write, allow_schema_evolution=allow_schema_evolution, last_column_id=metadata.last_column_id
    )
    _check_named(write, named, column_names_after(schema, to_add))
    return to_add


def _files_checked_at_persist(metadata: TableMetadata, write: TableWrite) -> bool:
    """Whether every file passed the checks of each file against this schema and spec already.

    Persist prepares a write's manifests only after this check passed against the table's schema
    of that moment (``PreparedSnapshot.schema_id``) with no column to add; a schema and a spec never
    change under their ids. So while the table keeps that schema and the write's spec, the files'
    formats, partitions and statistics' columns need no second look, and the commit task does not
    parse the descriptors for one (``DataFiles``)."""
    prepared = write.prepared
    if prepared is None or prepared.schema_id != metadata.current_schema_id:
        return False
    spec_id = write.spec_id if write.spec_id is not None else metadata.default_spec_id
    return spec_id in metadata.specs() and all(m.spec_id == spec_id for m in prepared.manifests if m.added_files)


def _check_files(metadata: TableMetadata, write: TableWrite, *, owner: str) -> set[str]:
    """``check_formats`` and ``check_partitions`` in one pass over the files, which collects the
    columns their statistics name on the way: each pass over 10,000 descriptors costs milliseconds
    in memory reads alone. A fault is raised as the separate checks in turn would raise it: the
    first file of a wrong format, then a spec that does not fit, then the first wrong partition."""
    try:
        partition: Callable[[DataFileDescriptor], None] | None = _partition_check(metadata, write, owner=owner)[1]
        spec_fault: InvalidPreCommit | None = None
    except InvalidPreCommit as exc:
        partition, spec_fault = None, exc
    partition_fault: InvalidPreCommit | None = None
    named: set[str] = set()
    collect = named.update
    for descriptor in write.data_files:
        # A name that ends in its own format's extension cannot contradict it: the common case, in
        # half the time of finding the extension.
        if not descriptor.path.endswith(_SUFFIXES[descriptor.format]):
            _check_format(write, descriptor)
        if partition is not None:
            try:
                partition(descriptor)
            except InvalidPreCommit as exc:
                partition, partition_fault = None, exc
        collect(
            descriptor.column_sizes,
            descriptor.value_counts,
            descriptor.null_value_counts,
            descriptor.nan_value_counts,
            descriptor.lower_bounds,
            descriptor.upper_bounds,
        )
    if spec_fault is not None:
        raise spec_fault
    if partition_fault is not None:
        raise partition_fault
    return named


class CheckedWrites:
    """``check_table_write`` answered once per write and table version within a process.

    The check is a pure function of the write and the table's metadata, and a metadata location
    names one version of a table for good. A process that persists a write and then decides its
    commit (``eo-sink``, recovery, a test) would otherwise check its 10,000 descriptors twice against
    a table that did not change in between; any commit to the table in between makes a new version,
    and the write is checked afresh against it. Only successful checks are kept, for the very write
    object that passed (a look-alike write is checked itself), and only the latest few.
    """

    _CAPACITY = 8

    def __init__(self) -> None:
        self._passed: OrderedDict[tuple[str, str, str, bool], tuple[TableWrite, list[ColumnToAdd]]] = OrderedDict()
        self._lock = threading.Lock()

    def check(
        self,
        metadata: TableMetadata,
        metadata_location: str,
        write: TableWrite,
        *,
        branch: str,
        allow_schema_evolution: bool,
        owner: str,
    ) -> list[ColumnToAdd]:
        key = (write.table, metadata_location, branch, allow_schema_evolution)
        with self._lock:
            passed = self._passed.get(key)
        if passed is not None and passed[0] is write:
            return list(passed[1])
        to_add = check_table_write(
            metadata, write, branch=branch, allow_schema_evolution=allow_schema_evolution, owner=owner
        )
        with self._lock:
            self._passed[key] = (write, list(to_add))
            self._passed.move_to_end(key)
            while len(self._passed) > self._CAPACITY:
                self._passed.popitem(last=False)
        return to_add


# Whether the columns a write produced can go into a table, compared as Iceberg types: each
# written type parsed and held to the table's by ``type_mapping`` (``parse_type``, ``reads_as``).


@dataclass(frozen=True)
class ColumnToAdd:
    name: str
    type: IcebergType
    doc: str | None


def check_columns(
    schema: Schema, write: TableWrite, *, allow_schema_evolution: bool, last_column_id: int | None = None
) -> list[ColumnToAdd]:
    """Refuse a write whose columns do not fit the table; return the columns the commit must add.

    An added column that the table already holds with the same type is not added again: another
    writer of the same schema change got there first, and adding it twice would fail.
    """
    table = write.table
    by_name = {f.name: f for f in schema.fields}
    requested = {c.name: c for c in write.added_columns}
    to_add: list[ColumnToAdd] = []

    for column in write.added_columns:
        column_type = parse_type(column.type, table=table, column=column.name)
        existing = by_name.get(column.name)
        if existing is not None:
            problem = reads_as(column_type, existing.field_type, column.name)
            if problem:
                raise SchemaMismatch(f"table {table!r}: added column {column.name!r} already exists: {problem}")
            _check_field_id(table, column, existing.field_id)
            continue
        if not allow_schema_evolution:
            raise SchemaMismatch(
                f"table {table!r}: the write adds column {column.name!r} ({column.type}) but schema "
                "evolution is not allowed for this committer (allow_schema_evolution=False)"
            )
        if last_column_id is not None and column_type.is_primitive and all(c.type.is_primitive for c in to_add):
            # The commit's schema update gives primitive columns the ids after the table's last one,
            # in this order (nested ones are checked exactly once the update is staged).
            _check_field_id(table, column, last_column_id + 1 + len(to_add))
        to_add.append(ColumnToAdd(column.name, column_type, column.doc))

    for column in write.schema_written:
        # A written column absent from the table was refused above unless it is a planned addition.
        _check_written_column(table, column, by_name, requested)

    if write.schema_written:
        written_names = {c.name for c in write.schema_written}
        missing = [f.name for f in schema.fields if f.required and f.name not in written_names]
        if missing:
            raise SchemaMismatch(f"table {table!r}: required column(s) {missing} are not in the written schema")
    return to_add


def _check_written_column(
    table: str,
    column: WrittenColumn,
    by_name: dict[str, NestedField],
    requested: dict[str, WrittenColumn],
) -> None:
    written_type = parse_type(column.type, table=table, column=column.name)
    target = by_name.get(column.name)
    if target is None:
        if column.name not in requested:
            raise SchemaMismatch(
                f"table {table!r}: written column {column.name!r} ({column.type}) is not in the table "
                "and not listed in added_columns"
            )
        target = NestedField(
            1,
            column.name,
            parse_type(requested[column.name].type, table=table, column=column.name),
            required=False,
        )
    else:
        _check_field_id(table, column, target.field_id)
    written = NestedField(1, column.name, written_type, required=column.required)
    problem = field_reads_as(written, target, column.name)
    if problem:
        raise SchemaMismatch(f"table {table!r}: column {problem}")


def _check_field_id(table: str, column: WrittenColumn, table_field_id: int) -> None:
    if column.field_id is not None and column.field_id != table_field_id:
        raise SchemaMismatch(
            f"table {table!r}: column {column.name!r} has field id {column.field_id} in the written files but "
            f"{table_field_id} in the table: the table's schema changed since the write, so readers would "
            "not find the data under this column; write the epoch again"
        )


def check_added_field_ids(staged: Schema, write: TableWrite) -> None:
    """After the commit's schema update is staged: every added column got the id its files carry."""
    for column in write.added_columns:
        _check_field_id(write.table, column, staged.find_field(column.name).field_id)


def column_names_after(schema: Schema, to_add: list[ColumnToAdd]) -> set[str]:
    """Every (dotted) column name the table will have once ``to_add`` is applied."""
    names = set(schema.column_names)
    if to_add:
        counter = iter(range(1, 1_000_000))
        added = assign_fresh_schema_ids(
            Schema(*[NestedField(i + 1, c.name, c.type, required=False) for i, c in enumerate(to_add)]),
            lambda: next(counter),
        )
        names.update(added.column_names)
    return names
