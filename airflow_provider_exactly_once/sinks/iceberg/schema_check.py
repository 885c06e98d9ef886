"""Whether the columns a write produced can go into a table, compared as Iceberg types.

Types are parsed with pyiceberg's own model (the spelling of ``decimal(10,2)`` vs ``decimal(10, 2)``
must not matter) and compared structurally: a Parquet file carries no Iceberg field ids, so nested
fields match by name. The only widenings allowed are the ones Iceberg readers apply without rewriting
data: ``int -> long`` and ``float -> double``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
)

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, SchemaMismatch
from airflow_provider_exactly_once.core.precommit import TableWrite, WrittenColumn


@dataclass(frozen=True)
class ColumnToAdd:
    name: str
    type: IcebergType
    doc: str | None


def parse_type(text: str, *, table: str, column: str) -> IcebergType:
    """An Iceberg type from its name (``long``) or, for nested types, its JSON form."""
    raw: Any = text
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError:
            raise InvalidPreCommit(f"table {table!r}: column {column!r} has a type that is not valid JSON") from None
    try:
        field = NestedField.model_validate({"id": 1, "name": column, "type": raw, "required": False})
    except ValidationError:
        raise InvalidPreCommit(f"table {table!r}: column {column!r} has an unknown Iceberg type {text!r}") from None
    return field.field_type


def _describe_difference(written: IcebergType, target: IcebergType, where: str) -> str | None:
    """``None`` when ``written`` data can be read as ``target``; otherwise what is wrong, and where."""
    if isinstance(target, StructType):
        if not isinstance(written, StructType):
            return f"{where}: {written} cannot be written into {target}"
        written_fields = {f.name: f for f in written.fields}
        for target_field in target.fields:
            sub = f"{where}.{target_field.name}"
            written_field = written_fields.pop(target_field.name, None)
            if written_field is None:
                if target_field.required:
                    return f"{sub}: required in the table but not written"
                continue
            problem = _describe_field(written_field, target_field, sub)
            if problem:
                return problem
        if written_fields:
            return f"{where}: fields {sorted(written_fields)} are not in the table"
        return None
    if isinstance(target, ListType):
        if not isinstance(written, ListType):
            return f"{where}: {written} cannot be written into {target}"
        return _describe_field(written.element_field, target.element_field, f"{where}.element")
    if isinstance(target, MapType):
        if not isinstance(written, MapType):
            return f"{where}: {written} cannot be written into {target}"
        return _describe_field(written.key_field, target.key_field, f"{where}.key") or _describe_field(
            written.value_field, target.value_field, f"{where}.value"
        )
    if written == target:
        return None
    if isinstance(written, IntegerType) and isinstance(target, LongType):
        return None
    if isinstance(written, FloatType) and isinstance(target, DoubleType):
        return None
    return f"{where}: written as {written}, the table has {target}"


def _describe_field(written: NestedField, target: NestedField, where: str) -> str | None:
    if target.required and not written.required:
        return f"{where}: written as optional (may hold nulls), required in the table"
    return _describe_difference(written.field_type, target.field_type, where)


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
            problem = _describe_difference(column_type, existing.field_type, column.name)
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
    problem = _describe_field(written, target, column.name)
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
