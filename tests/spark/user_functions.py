"""Input functions the epoch-writer tests name as ``module:function``."""

from __future__ import annotations

from typing import Any


def boom(spark: Any, context: Any) -> Any:
    raise RuntimeError(f"upstream table for epoch {context.epoch} is locked")


def not_a_frame(spark: Any, context: Any) -> Any:
    return [1, 2, 3]


def rows_with_extra(spark: Any, context: Any) -> Any:
    """Rows of the interval plus a column the table does not have yet (schema evolution)."""
    from pyspark.sql import functions as F

    start = context.data_interval_start
    frame = spark.range(0, 50).select(
        F.col("id"),
        F.concat(F.lit("n"), F.col("id").cast("string")).alias("name"),
        (F.lit(start) + F.make_interval(mins=F.col("id").cast("int"))).alias("ts"),
        (F.col("id") * 1.5).alias("amount"),
        (F.col("id") % 3).cast("int").alias("extra_col"),
    )
    return frame


def lazily_failing(spark: Any, context: Any) -> Any:
    """Fails only on the executors, inside the write job."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    @F.udf(returnType=LongType())
    def explode_on_seven(value: int) -> int:
        if value == 7:
            raise ValueError("row 7 cannot be parsed")
        return value

    return spark.range(0, 20).select(explode_on_seven(F.col("id")).alias("id"))


def random_amounts(spark: Any, context: Any) -> Any:
    """Rows whose ``amount`` is drawn anew each time Spark computes them: only one read of the
    input gives every table of a fan-out the same values."""
    import random

    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    draw = F.udf(lambda _: random.random(), DoubleType()).asNondeterministic()
    start = context.data_interval_start
    return spark.range(0, 200, numPartitions=2).select(
        F.col("id"),
        F.concat(F.lit("n"), F.col("id").cast("string")).alias("name"),
        (F.lit(start) + F.make_interval(mins=F.col("id").cast("int"))).alias("ts"),
        draw(F.col("id")).alias("amount"),
    )
