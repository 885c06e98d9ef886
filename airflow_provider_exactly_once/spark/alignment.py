"""Fitting a DataFrame to an Iceberg table's schema before a single byte is written.

Everything here decides from the two schemas alone (a Spark ``StructType`` and a pyiceberg
``Schema``), so a refusal costs no Spark job and the rules are testable without a session; every
fault is reported at once, naming its column. The rules: design.md, "Layers" (column types).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from pyiceberg.schema import Schema
from pyiceberg.types import NestedField
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import SchemaMismatch
from airflow_provider_exactly_once.core.precommit import WrittenColumn
from airflow_provider_exactly_once.type_mapping import (
    casts_to,
    iceberg_to_spark,
    refuse_duplicates,
    spark_to_iceberg,
    type_text,
)


@dataclass(frozen=True)
class ColumnPlan:
    """One column of the aligned DataFrame: where it comes from and what it is cast to."""

    source: str
    target: str
    cast_to: st.DataType | None


@dataclass
class AlignmentPlan:
    #: Columns the aligned DataFrame selects, in the file's order (missing optional columns are
    #: absent here: the executors fill them with typed nulls, which also covers types Spark lacks).
    columns: list[ColumnPlan]
    #: The schema the files are written with: the table's, then the added columns.
    write_schema: Schema
    added_columns: list[WrittenColumn] = field(default_factory=list)
    #: Top-level required columns Spark calls nullable: checked for nulls on the executors.
    checked_required: list[str] = field(default_factory=list)

    def written_columns(self) -> list[WrittenColumn]:
        return [
            WrittenColumn(
                name=f.name, type=type_text(f.field_type), required=f.required, doc=f.doc, field_id=f.field_id
            )
            for f in self.write_schema.fields
        ]


def plan_alignment(
    frame: st.StructType,
    table_schema: Schema,
    *,
    table: str,
    last_column_id: int,
    allow_schema_evolution: bool,
) -> AlignmentPlan:
    """Decide how ``frame`` goes into ``table_schema``, or raise ``SchemaMismatch`` naming every fault."""
    faults: list[str] = []
    names = [f.name for f in frame.fields]
    try:
        refuse_duplicates(names)
    except SchemaMismatch as exc:
        faults.append(str(exc))
    by_name = {f.name: f for f in frame.fields}
    table_names = {f.name for f in table_schema.fields}
    columns: list[ColumnPlan] = []
    checked_required: list[str] = []

    for target in table_schema.fields:
        source = by_name.get(target.name)
        if source is None:
            near = [n for n in names if n.lower() == target.name.lower()]
            if near:
                faults.append(
                    f"table column {target.name!r} is missing; input column {near[0]!r} matches it only "
                    "ignoring case (Iceberg names are case-sensitive): rename it"
                )
            elif target.required:
                faults.append(f"required table column {target.name!r} ({target.field_type}) is missing from the input")
            continue
        column_faults: list[str] = []
        needs_cast = casts_to(source.dataType, target.field_type, target.name, column_faults)
        if target.required and isinstance(source.dataType, st.NullType):
            column_faults.append(f"column {target.name!r} is required but the input holds only nulls")
        faults.extend(column_faults)
        if column_faults:
            continue
        cast_to = iceberg_to_spark(target.field_type) if needs_cast else None
        columns.append(ColumnPlan(source=source.name, target=target.name, cast_to=cast_to))
        if target.required and source.nullable:
            checked_required.append(target.name)

    extra = [
        f for f in frame.fields if f.name not in table_names and f.name.lower() not in {n.lower() for n in table_names}
    ]
    added: list[NestedField] = []
    if extra and not allow_schema_evolution:
        faults.append(
            f"input column(s) {[f.name for f in extra]} are not in table {table!r}; "
            "drop them, or allow schema evolution to add them"
        )
    elif extra:
        counter = itertools.count(last_column_id + 1)
        for f in extra:
            try:
                iceberg = spark_to_iceberg(f.dataType, f.name)
            except SchemaMismatch as exc:
                faults.append(str(exc))
                continue
            if not iceberg.is_primitive:
                faults.append(
                    f"input column {f.name!r} ({f.dataType.simpleString()}) would be added to {table!r}, "
                    "but only primitive columns can be added by a write; add it to the table first"
                )
                continue
            added.append(NestedField(next(counter), f.name, iceberg, required=False))
            columns.append(ColumnPlan(source=f.name, target=f.name, cast_to=iceberg_to_spark(iceberg)))

    if faults:
        raise SchemaMismatch(f"input does not fit table {table!r}: " + "; ".join(faults))
    write_schema = Schema(
        *table_schema.fields,
        *added,
        schema_id=table_schema.schema_id,
        identifier_field_ids=table_schema.identifier_field_ids,
    )
    return AlignmentPlan(
        columns=columns,
        write_schema=write_schema,
        added_columns=[
            WrittenColumn(name=f.name, type=str(f.field_type), required=False, field_id=f.field_id) for f in added
        ],
        checked_required=checked_required,
    )
