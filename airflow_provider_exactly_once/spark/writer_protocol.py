"""What the epoch writer asks of a writer of data files, whichever of the two writes them.

Spark's own Parquet writer (``parquet_writer``) and the pyarrow writer on the executors
(``file_writer``) both take one table's rows, aligned to its write schema, write them below the
write's own location, and describe each file they wrote; both refuse a null in a required column
Spark could not prove non-null. ``epoch_writer.choose_writer`` is the one place that says which of
them writes a table's files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    FloatType,
    IcebergType,
    IntegerType,
    StringType,
    StructType,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_exactly_once.core.precommit import DataFileDescriptor

DEFAULT_TARGET_FILE_SIZE = 512 * 1024 * 1024


class RequiredColumnHasNulls(ValueError):
    """A required column received a null: the write fails, and its location is removed with it."""


def required_nulls_message(name: str, count: int) -> str:
    return f"required column {name!r} holds {count} null value(s); the table refuses them (filter or fill them in the input)"


@dataclass(frozen=True)
class FileWrite:
    """One table's write: everything a writer needs, pickled to the executors once per job."""

    location: str
    write_schema: Schema
    spec: PartitionSpec
    #: ``iceberg``: partition values in Iceberg's internal representation, keyed by partition field
    #: name; ``hive``: a file sink's identity partitions as readers of ``k=v`` directories expect.
    partition_style: Literal["iceberg", "hive"]
    table_properties: dict[str, str] = field(default_factory=dict)
    io_properties: dict[str, str] = field(default_factory=dict)
    checked_required: tuple[str, ...] = ()
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    #: Tasks to write with, rows distributed by partition value; ``None``: the writer's own choice.
    writers: int | None = None

    @property
    def row_group_rows(self) -> int:
        return int(
            self.table_properties.get(
                TableProperties.PARQUET_ROW_GROUP_LIMIT, str(TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT)
            )
        )


class DataFileWriter(Protocol):
    """A writer of one table's data files."""

    def write(self, frame: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        """Write ``frame`` (aligned to the write schema) below ``write.location``; one descriptor a file."""
        ...


def rows_per_file(target_file_size: int, write_schema: Schema) -> int:
    """How many rows fill a file of the target size: the target over Spark's estimate of a row's
    uncompressed size. Spark's writer rolls files by rows alone, and an upsert sizes its write tasks
    by it before the pyarrow writer, which rolls on uncompressed bytes, writes them."""
    return max(1, target_file_size // _row_size(write_schema.as_struct()))


def _row_size(iceberg: IcebergType) -> int:
    """Spark's estimate of a value's uncompressed size (``DataType.defaultSize``): 20 bytes a string,
    100 a binary, the width of everything else."""
    if isinstance(iceberg, StructType):
        return max(1, sum(_row_size(f.field_type) for f in iceberg.fields))
    if isinstance(iceberg, StringType):
        return 20
    if isinstance(iceberg, BinaryType):
        return 100
    if isinstance(iceberg, DecimalType):
        return 8 if iceberg.precision <= 18 else 16
    if isinstance(iceberg, BooleanType):
        return 1
    return 4 if isinstance(iceberg, IntegerType | DateType | FloatType) else 8
