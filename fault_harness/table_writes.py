"""How the harness's light writers put a data file into a table's storage, as a real writer would.

The file goes through the table's own FileIO (``table.io``), which carries the catalog's storage
properties, so it lands where the table lives, local disk or S3; its descriptor takes the footer
from the writer and the size from that FileIO: ``describe_parquet_file`` would otherwise read the
file back through a FileIO without the catalog's S3 credentials.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.precommit import DataFileDescriptor
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file


def write_data_file(table: Table, path: str, rows: pa.Table) -> DataFileDescriptor:
    """``rows`` (in the table's Arrow schema, with field ids) as one Parquet file at ``path``."""
    with table.io.new_output(path).create() as stream, pq.ParquetWriter(stream, rows.schema) as writer:
        writer.write_table(rows)
    return describe_parquet_file(
        path,
        table_schema=table.schema(),
        partition={},
        writer="0",
        parquet_metadata=writer.writer.metadata,
        file_size_in_bytes=len(table.io.new_input(path)),
    )
