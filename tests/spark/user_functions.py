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


def typed_rows_list() -> list[tuple[Any, ...]]:
    """Rows of every type Spark's Parquet writer takes, with values that trip partition encodings:
    instants before 1970 and at day and hour edges, the empty string beside null, characters Spark
    escapes in directory names, and a NaN."""
    import datetime as dt
    from decimal import Decimal

    utc = dt.UTC
    instants = [
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
        dt.datetime(1970, 1, 1, tzinfo=utc),
        dt.datetime(2024, 2, 29, 23, 30, tzinfo=utc),
        dt.datetime(1900, 3, 1, 1, tzinfo=utc),
        dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=utc),
        None,
    ]
    names = ["", None, "a/b", "x=y", "100%", "é t", "plain", "#{[^]}"]
    rows = []
    for i in range(48):
        instant = instants[i % len(instants)]
        rows.append(
            (
                i,
                names[i % len(names)],
                instant,
                instant.replace(tzinfo=None) + dt.timedelta(hours=i) if instant is not None else None,
                None if i % 7 == 3 else dt.date(1969, 12, 25) + dt.timedelta(days=i * 3),
                i % 3 == 0 if i % 5 else None,
                float("nan") if i % 9 == 4 else i / 4,
                Decimal(i * 101) / 100,
                None if i % 6 == 5 else (f"city-{i % 4}", i if i % 4 else None),
            )
        )
    return rows


def typed_rows(spark: Any, context: Any) -> Any:
    from pyspark.sql import types as st

    schema = st.StructType(
        [
            st.StructField("id", st.LongType(), nullable=False),
            st.StructField("name", st.StringType()),
            st.StructField("ts", st.TimestampType()),
            st.StructField("local", st.TimestampNTZType()),
            st.StructField("day", st.DateType()),
            st.StructField("flag", st.BooleanType()),
            st.StructField("ratio", st.DoubleType()),
            st.StructField("price", st.DecimalType(10, 2)),
            st.StructField(
                "addr",
                st.StructType([st.StructField("city", st.StringType()), st.StructField("zip", st.LongType())]),
            ),
        ]
    )
    return spark.createDataFrame(typed_rows_list(), schema, verifySchema=False).repartition(3)


def slow_rows(spark: Any, context: Any) -> Any:
    """The rows of ``rows_with_extra`` without the extra column, each taking a while on the executors
    (``options["seconds_per_row"]``): a write long enough for a test to kill its Spark under it."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    pause = float(context.options.get("seconds_per_row", 0.1))

    @F.udf(returnType=LongType())
    def slowly(value: int) -> int:
        import time

        time.sleep(pause)
        return value

    return rows_with_extra(spark, context).drop("extra_col").withColumn("id", slowly(F.col("id")))
