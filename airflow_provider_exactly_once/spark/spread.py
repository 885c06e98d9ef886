"""Lists the driver holds, handed to the executors as a DataFrame: the one way the epoch writer gives
Python tasks their work, the same on a classic session and on Spark Connect (which has no RDDs and
no ``sparkContext``).

A range is the carrier: ``spark.range(n)`` is split into Spark's default parallelism without the
driver having to know it (Connect cannot ask), and each task maps its ids to the values, which
travel with the task's function. A local DataFrame (``createDataFrame(values)``) would not do: on
Connect it becomes one partition, and every file would be read by one task.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession


def spread(spark: SparkSession, values: Sequence[str], column: str, slices: int | None = None) -> DataFrame:
    """``values`` as a DataFrame of one string ``column``, in order, over ``slices`` partitions of
    consecutive values (Spark's default parallelism without it; never more than the values)."""
    count = len(values)
    frame = spark.range(count) if slices is None else spark.range(0, count, 1, max(1, min(slices, count)))
    return frame.mapInArrow(functools.partial(_values_at, tuple(values), column), f"`{column}` string")


def _values_at(values: tuple[str, ...], column: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        chosen = [values[i] for i in batch.column("id").to_pylist()]
        yield pa.RecordBatch.from_arrays([pa.array(chosen, pa.string())], names=[column])
