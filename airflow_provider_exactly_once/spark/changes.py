"""An upsert epoch's input as changes: operation and order read, bad rows refused, one change per key.

Everything here refuses before a single file is written, naming the sink, the epoch, the table, the
column and example rows, because a change set with a null key or an unknown operation cannot be
applied "mostly": the table would hold a state no input ever described.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from airflow_provider_exactly_once.core.errors import InvalidChanges, InvalidSinkConfig
from airflow_provider_exactly_once.core.upserts import UpsertSpec

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


def quote(name: str) -> str:
    """A top-level column reference; a dot in ``name`` is part of the name."""
    return "`" + name.replace("`", "``") + "`"


def read_changes(frame: DataFrame, upsert: UpsertSpec, owner: Owner) -> DataFrame:
    """The input with ``OP`` and ``ORDER`` added (``check_changes`` next, then ``row_columns``)."""
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


def check_changes(changes: DataFrame, upsert: UpsertSpec, owner: Owner) -> None:
    """Refuse null keys, unknown operations and (per the order rule) two changes of one key.

    One aggregation over the input finds every fault: an epoch without faults costs one Spark
    action here. A key changed twice shows as fewer distinct keys than rows, a tie
    as fewer distinct (key, order) pairs; only then does a second query look for examples.
    """
    keys = [F.col(quote(k)) for k in upsert.key]
    null_key = F.lit(False)
    for key in keys:
        null_key = null_key | key.isNull()
    distinct = [F.count_distinct(F.struct(*keys)).alias("keys")]
    if upsert.order_by is not None:
        distinct.append(F.count_distinct(F.struct(*keys, F.col(ORDER))).alias("keyed_orders"))
    counted = changes.agg(
        F.sum(F.when(null_key, 1).otherwise(0)).alias("null_keys"),
        F.sum(F.when(F.col(OP).isNull(), 1).otherwise(0)).alias("unknown_ops"),
        F.count(F.lit(1)).alias("rows"),
        *distinct,
    ).first()
    assert counted is not None  # an aggregation without grouping has one row, even over no rows
    null_keys, unknown_ops, rows = (int(counted[name] or 0) for name in ("null_keys", "unknown_ops", "rows"))
    if null_keys:
        shown = [row.asDict() for row in changes.where(null_key).drop(OP, ORDER).limit(EXAMPLES).collect()]
        nulls = [k for k in upsert.key if changes.where(F.col(quote(k)).isNull()).limit(1).count()]
        raise InvalidChanges(
            f"{owner}: {null_keys} change row(s) have a null in key column(s) {nulls}, e.g. {shown}; "
            "a key identifies one row of the table and may not be null. Nothing was written."
        )
    if unknown_ops:
        column = F.col(quote(str(upsert.op_column))).cast("string")
        unknown = changes.where(F.col(OP).isNull()).select(column).distinct().limit(EXAMPLES)
        values = [row[0] for row in unknown.collect()]
        raise InvalidChanges(
            f"{owner}: {unknown_ops} change row(s) have an operation in column {upsert.op_column!r} that is none of "
            f"{list(upsert.known_values)}: {values}; name the values with insert_values, update_values and "
            "delete_values. Nothing was written."
        )
    if int(counted["keys"]) == rows:
        return  # one change per key
    per_key = changes.groupBy(*keys).agg(F.count(F.lit(1)).alias("changes"), F.max(ORDER).alias("last"))
    if upsert.order_by is None:
        repeated = per_key.where(F.col("changes") > 1)
        examples = [row.asDict() for row in repeated.limit(EXAMPLES).collect()]
        raise InvalidChanges(
            f"{owner}: {repeated.count()} key(s) change more than once in the epoch, e.g. {examples}; give the "
            "sink order_by (a column ordering the changes, greatest wins) or send one change per key. "
            "Nothing was written."
        )
    if int(counted["keyed_orders"]) == rows:
        return  # no two changes of a key share an order value, so no tie at the last
    ties = (
        changes.join(per_key.where(F.col("changes") > 1), on=list(upsert.key))
        .where(F.col(ORDER).eqNullSafe(F.col("last")))
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("changes_at_last"))
        .where(F.col("changes_at_last") > 1)
    )
    examples = [row.asDict() for row in ties.limit(EXAMPLES).collect()]
    if examples:
        raise InvalidChanges(
            f"{owner}: {ties.count()} key(s) have two or more last changes with the same {upsert.order_by!r}, e.g. "
            f"{examples}; which one wins would depend on how Spark split the input. Nothing was written."
        )


def last_change_per_key(changes: DataFrame, upsert: UpsertSpec) -> DataFrame:
    """One change per key: the only one, or the greatest by ``order_by`` (ties refused earlier)."""
    if upsert.order_by is None:
        return changes
    window = Window.partitionBy(*[F.col(quote(k)) for k in upsert.key]).orderBy(F.col(ORDER).desc_nulls_last())
    return changes.withColumn("__eo_rank", F.row_number().over(window)).where(F.col("__eo_rank") == 1).drop("__eo_rank")
