"""Whether the columns a write produced can go into a table, compared as Iceberg types: each
written type parsed and held to the table's by ``type_mapping`` (``parse_type``, ``reads_as``)."""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import IcebergType, NestedField

from airflow_provider_exactly_once.core.errors import SchemaMismatch
from airflow_provider_exactly_once.core.precommit import TableWrite, WrittenColumn
from airflow_provider_exactly_once.type_mapping import field_reads_as, parse_type, reads_as


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
