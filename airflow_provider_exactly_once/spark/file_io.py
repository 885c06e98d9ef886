"""How the epoch writer reaches files and executors without Spark's Hadoop connectors or RDDs: object
stores through pyiceberg's FileIO and fsspec, and the driver's lists handed to Python tasks as a
DataFrame, the same on a classic session and on Spark Connect (design.md, 'Layers').
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

# How the epoch writer reaches object stores: pyiceberg's FileIO and fsspec, never Spark's Hadoop.
#
# Spark reaches ``s3://`` only through Hadoop's s3a connector, jars (hadoop-aws and an AWS SDK) that
# the pyspark package does not ship and that would have to come from Maven at submit time. The writer
# does not need them: every byte it reads or writes on an object store goes through pyiceberg's FileIO
# (pyarrow's native S3, GCS and Azure filesystems) on the executors, and through pyiceberg's fsspec
# FileIO on the driver for the few things FileIO has no call for (listing a landing directory,
# removing a failed write's folder). Both are configured from the same FileIO properties
# (``s3.endpoint``, ``s3.access-key-id``, ...), which is also how the committer reaches the table, so
# writer and committer cannot disagree about where a file is or who may read it.
#
# The properties travel to the executors inside the pickled task (``FileWrite``, the input
# readers' closures), never through Spark configuration, environment variables or the command line:
# an executor on another host gets them from the job spec and from nowhere else.

#: URL schemes read and written with pyiceberg's FileIO instead of Spark's own filesystems.
OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "oss"})
#: FileIO property families; everything else a catalog's properties hold (its URI, its OAuth
#: credential, table settings, auth manager objects) is not for the executors.
_STORAGE_PREFIXES = ("s3.", "gcs.", "adls.", "hdfs.", "oss.", "client.")
_STORAGE_KEYS = frozenset({"py-io-impl"})


def scheme_of(url: str) -> str:
    return urlparse(url).scheme.lower()


def is_object_store(url: str) -> bool:
    return scheme_of(url) in OBJECT_STORE_SCHEMES


def storage_properties(properties: Mapping[str, Any]) -> dict[str, str]:
    """The FileIO properties among a catalog's or table's: only what reaching the files takes.

    The executors need the storage credentials, not the catalog's: shipping only these keeps the
    catalog credential off every executor, and keeps non-string values (a REST catalog's loaded
    FileIO carries its auth manager object) out of the pickled task.
    """
    return {
        key: value
        for key, value in properties.items()
        if isinstance(value, str) and (key.startswith(_STORAGE_PREFIXES) or key in _STORAGE_KEYS)
    }


def driver_filesystem(url: str, io_properties: Mapping[str, str]) -> tuple[Any, str]:
    """An fsspec filesystem for ``url`` and the path on it, built by pyiceberg's fsspec FileIO from
    the same properties the executors' FileIO gets (credentials, endpoint, region)."""
    import fsspec

    if not is_object_store(url):
        fs, path = fsspec.core.url_to_fs(url)
        return fs, str(path)
    from pyiceberg.io.fsspec import FsspecFileIO

    parsed = urlparse(url)
    fs = FsspecFileIO(dict(io_properties)).get_fs(parsed.scheme, parsed.hostname)
    return fs, f"{parsed.netloc}{parsed.path}"


def remove_tree(url: str, io_properties: Mapping[str, str]) -> None:
    """Remove everything below ``url`` (a failed write's own folder); absent is fine."""
    fs, path = driver_filesystem(url, io_properties)
    fs.invalidate_cache()
    if fs.exists(path):
        fs.rm(path, recursive=True)


def put_small_file(url: str, data: bytes, io_properties: Mapping[str, str]) -> None:
    """Write ``data`` at ``url`` whole or not at all: one PUT through the FileIO the executors write
    with on an object store, a renamed temporary file on a file system (a reader never sees half)."""
    if is_object_store(url):
        from pyiceberg.io import load_file_io

        with load_file_io(dict(io_properties), url).new_output(url).create(overwrite=True) as stream:
            stream.write(data)
        return
    fs, path = driver_filesystem(url, io_properties)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    temporary = f"{path}.tmp"
    fs.pipe_file(temporary, data)
    fs.mv(temporary, path)


def read_small_file(url: str, io_properties: Mapping[str, str]) -> bytes | None:
    """The bytes at ``url``, read as ``put_small_file`` wrote them, or ``None`` when there is none."""
    if is_object_store(url):
        from pyiceberg.io import load_file_io

        try:
            with load_file_io(dict(io_properties), url).new_input(url).open() as stream:
                data: bytes = stream.read()
        except FileNotFoundError:
            return None
        return data
    fs, path = driver_filesystem(url, io_properties)
    fs.invalidate_cache()
    try:
        found: bytes = fs.cat_file(path)
    except FileNotFoundError:
        return None
    return found


# Lists the driver holds, handed to the executors as a DataFrame: the one way the epoch writer gives
# Python tasks their work, the same on a classic session and on Spark Connect (which has no RDDs and
# no ``sparkContext``).
#
# A range is the carrier: ``spark.range(n)`` is split into Spark's default parallelism without the
# driver having to know it (Connect cannot ask), and each task maps its ids to the values, which
# travel with the task's function. A local DataFrame (``createDataFrame(values)``) would not do: on
# Connect it becomes one partition, and every file would be read by one task.


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
