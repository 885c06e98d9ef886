"""The pre-commit a finished write leaves in its write location (``layout.PRE_COMMIT_FILE``), as a file.

A Parquet file of one row and one column, the pre-commit's compact JSON, rather than a JSON file:
an object store that serves a table bucket refuses other objects below a table's location
(SeaweedFS's does, tested: ``.json`` and ``.txt`` are denied, ``.parquet`` and ``.avro`` taken). The leading
underscore of its name keeps Spark's and other file readers of the folder away from it, and no
snapshot references it, so Iceberg readers never see it.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

_COLUMN = "pre_commit"


def encode(pre_commit_json: bytes) -> bytes:
    """The file's bytes for a pre-commit's JSON."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({_COLUMN: [pre_commit_json.decode()]}), buffer, compression="zstd")
    return buffer.getvalue()


def decode(data: bytes) -> bytes:
    """The pre-commit JSON in the file's bytes; an unreadable file (cut short, or not ours) gives
    empty bytes, which no pre-commit parses from."""
    try:
        table = pq.read_table(io.BytesIO(data))
        value = table.column(_COLUMN)[0].as_py() if table.num_rows == 1 and _COLUMN in table.column_names else None
    except (pa.ArrowException, OSError):
        return b""
    return value.encode() if isinstance(value, str) else b""
