"""An upsert epoch's input as changes: operation and order read, bad rows refused, one change per key.

Everything here refuses before a single file is written, naming the sink, the epoch, the table, the
column and example rows, because a change set with a null key or an unknown operation cannot be
applied "mostly": the table would hold a state no input ever described.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from airflow_provider_exactly_once.core.errors import InvalidChanges, InvalidSinkConfig
from airflow_provider_exactly_once.core.upserts import UpsertSpec
from airflow_provider_exactly_once.spark.writers import quote

#: Columns the upsert adds to the change rows; never written.
OP, ORDER = "__eo_op", "__eo_order"
UPSERT, DELETE = "upsert", "delete"
#: Example rows an error shows.
EXAMPLES = 5


@dataclass(frozen=True)
class Owner:
    """Who the changes belong to, for every message."""

    sink_id: str
    epoch: int
    table: str

    def __str__(self) -> str:
        return f"sink {self.sink_id!r} epoch {self.epoch} table {self.table!r}"


def read_changes(frame: DataFrame, upsert: UpsertSpec, owner: Owner) -> DataFrame:
    """The input with ``OP`` and ``ORDER`` added (``one_change_per_key`` next, then ``row_columns``)."""
    present = set(frame.columns)
    missing = [name for name in upsert.key if name not in present]
    if missing:
        raise InvalidSinkConfig(
            f"{owner}: key column(s) {missing} are not in the epoch's input (columns: {sorted(present)}); "
            "every change row must carry the whole key"
        )
    for what, name in (("op_column", upsert.op_column), ("order_by", upsert.order_by)):
        if name is not None and name not in present:
            raise InvalidSinkConfig(
                f"{owner}: {what} {name!r} is not in the epoch's input (columns: {sorted(present)})"
            )
    if upsert.op_column is None:
        op: Column = F.lit(UPSERT)
    else:
        text = F.col(quote(upsert.op_column)).cast("string")
        op = (
            F.when(text.isin(list(upsert.delete_values)), F.lit(DELETE))
            .when(text.isin(list(upsert.upsert_values)), F.lit(UPSERT))
            .otherwise(F.lit(None))
        )
    order = F.col(quote(upsert.order_by)) if upsert.order_by is not None else F.lit(None)
    return frame.withColumn(OP, op).withColumn(ORDER, order)


def row_columns(changes: DataFrame, upsert: UpsertSpec, table_columns: set[str]) -> DataFrame:
    """The changes without the operation and order columns, unless the table has columns of those
    names (then they are data as well)."""
    dropped = [name for name in upsert.change_columns() if name not in table_columns]
    return changes.drop(*dropped) if dropped else changes


#: Columns the checks read, added per key in the pass that picks its last change: whether any of
#: the key's changes has an unknown operation, and how many share its last order value. Never written.
UNKNOWN_OP, TIED = "__eo_unknown_op", "__eo_tied"
CHECKED = (UNKNOWN_OP, TIED)


def one_change_per_key(changes: DataFrame, upsert: UpsertSpec) -> DataFrame:
    """One change per key: the only one, or the greatest by ``order_by``; with ``CHECKED``.

    The columns that find an unknown operation or a tie at the last change are windows over the
    partitioning of the pick itself, so the checks cost no pass of their own: ``refuse_faults``
    reads them, and the keys, from the rows the write brings to the driver anyway."""
    unknown = F.col(OP).isNull()
    if upsert.order_by is None:
        return changes.withColumn(UNKNOWN_OP, unknown).withColumn(TIED, F.lit(1))
    keys = [F.col(quote(k)) for k in upsert.key]
    last_first = Window.partitionBy(*keys).orderBy(F.col(ORDER).desc_nulls_last())
    return (
        changes.withColumn(UNKNOWN_OP, F.max(unknown).over(Window.partitionBy(*keys)))
        .withColumn(TIED, F.count(F.lit(1)).over(Window.partitionBy(*keys, F.col(ORDER))))
        .withColumn("__eo_rank", F.row_number().over(last_first))
        .where(F.col("__eo_rank") == 1)
        .drop("__eo_rank")
    )


def refuse_faults(changed: pa.Table, changes: DataFrame, upsert: UpsertSpec, owner: Owner) -> None:
    """Refuse null keys, unknown operations and (per the order rule) two changes of one key.

    ``changed``: the keys and ``CHECKED`` of ``one_change_per_key``'s rows, on the driver;
    ``changes``: the input (``read_changes``), queried for counts and examples only when there is
    a fault to show.
    """
    keys = [F.col(quote(k)) for k in upsert.key]
    null_key = F.lit(False)
    for key in keys:
        null_key = null_key | key.isNull()
    if any(changed.column(k).null_count for k in upsert.key):
        null_keys = changes.where(null_key).count()
        shown = [row.asDict() for row in changes.where(null_key).drop(OP, ORDER).limit(EXAMPLES).collect()]
        nulls = [k for k in upsert.key if changes.where(F.col(quote(k)).isNull()).limit(1).count()]
        raise InvalidChanges(
            f"{owner}: {null_keys} change row(s) have a null in key column(s) {nulls}, e.g. {shown}; "
            "a key identifies one row of the table and may not be null. Nothing was written."
        )
    if pc.any(changed.column(UNKNOWN_OP)).as_py():
        unknown_ops = changes.where(F.col(OP).isNull()).count()
        column = F.col(quote(str(upsert.op_column))).cast("string")
        unknown = changes.where(F.col(OP).isNull()).select(column).distinct().limit(EXAMPLES)
        values = [row[0] for row in unknown.collect()]
        raise InvalidChanges(
            f"{owner}: {unknown_ops} change row(s) have an operation in column {upsert.op_column!r} that is none of "
            f"{list(upsert.known_values)}: {values}; name the values with insert_values, update_values and "
            "delete_values. Nothing was written."
        )
    per_key = changes.groupBy(*keys).agg(F.count(F.lit(1)).alias("changes"), F.max(ORDER).alias("last"))
    if upsert.order_by is None:
        if changed.select(list(upsert.key)).group_by(list(upsert.key)).aggregate([]).num_rows == changed.num_rows:
            return  # one change per key
        repeated = per_key.where(F.col("changes") > 1)
        examples = [row.asDict() for row in repeated.limit(EXAMPLES).collect()]
        raise InvalidChanges(
            f"{owner}: {repeated.count()} key(s) change more than once in the epoch, e.g. {examples}; give the "
            "sink order_by (a column ordering the changes, greatest wins) or send one change per key. "
            "Nothing was written."
        )
    if (pc.max(changed.column(TIED)).as_py() or 0) <= 1:
        return  # no key has two changes at its last order value
    ties = (
        changes.join(per_key.where(F.col("changes") > 1), on=list(upsert.key))
        .where(F.col(ORDER).eqNullSafe(F.col("last")))
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("changes_at_last"))
        .where(F.col("changes_at_last") > 1)
    )
    examples = [row.asDict() for row in ties.limit(EXAMPLES).collect()]
    raise InvalidChanges(
        f"{owner}: {ties.count()} key(s) have two or more last changes with the same {upsert.order_by!r}, e.g. "
        f"{examples}; which one wins would depend on how Spark split the input. Nothing was written."
    )
