"""Where each kind of sink keeps a write's files until the write is committed or given up, the
pre-commit file a finished write leaves there, and locations compared across their spellings.

The Spark writer, the committers and the orphan scan all ask this module, so they cannot disagree;
it imports nothing heavy at its top, so the Spark side needs no committer and a DAG parse no pyarrow.
The contract: design.md, "Layers" (write locations), and D17 for the pre-commit file.
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlparse

__all__ = [
    "FILE_STAGING_DIR",
    "ICEBERG_WRITE_DIR",
    "PRE_COMMIT_FILE",
    "file_write_location",
    "file_writes_folder",
    "iceberg_data_root",
    "iceberg_write_location",
    "iceberg_writes_folder",
    "is_inside",
    "parse_location",
    "pre_commit_from_file",
    "pre_commit_to_file",
]

#: Folder under an Iceberg table's data root that holds one folder per write.
ICEBERG_WRITE_DIR = "_eo"
#: Folder under a file sink's root that holds one folder per write's staged files.
FILE_STAGING_DIR = "_staging"
#: The pre-commit a finished write leaves in its first target's write location (its format:
#: ``pre_commit_to_file``); the leading underscore keeps file readers and the commit's moves away from it.
PRE_COMMIT_FILE = "_pre-commit.parquet"
#: Iceberg's table property for a data root outside ``<location>/data``.
_WRITE_DATA_PATH = "write.data.path"


def iceberg_data_root(table_location: str, properties: Mapping[str, str]) -> str:
    """The folder an Iceberg table's data files go under, without a trailing slash."""
    return properties.get(_WRITE_DATA_PATH, f"{table_location.rstrip('/')}/data").rstrip("/")


def iceberg_writes_folder(data_root: str) -> str:
    return f"{data_root.rstrip('/')}/{ICEBERG_WRITE_DIR}"


def iceberg_write_location(data_root: str, write_id: str) -> str:
    return f"{iceberg_writes_folder(data_root)}/{write_id}"


def file_writes_folder(root: str) -> str:
    return f"{root.rstrip('/')}/{FILE_STAGING_DIR}"


def file_write_location(root: str, write_id: str) -> str:
    return f"{file_writes_folder(root)}/{write_id}"


# Writers, catalogs and users spell the same local directory as ``/x``, ``file:/x`` or ``file:///x``;
# an abort deletes everything below a write location, so "is this inside the table, and not the table's
# own data or metadata root?" must be answered on normalised locations, never on raw string prefixes.

_LOCAL_SCHEMES = {"", "file"}


class Location(NamedTuple):
    scheme: str
    netloc: str
    path: str

    def is_inside(self, root: Location) -> bool:
        """Strictly below ``root`` (the same location does not count)."""
        if (self.scheme, self.netloc) != (root.scheme, root.netloc):
            return False
        prefix = root.path.rstrip("/") + "/"
        return self.path.startswith(prefix) and len(self.path) > len(prefix)

    def is_at_or_above(self, other: Location) -> bool:
        return self == other or other.is_inside(self)


def parse_location(location: str) -> Location:
    parsed = urlparse(location)
    scheme = parsed.scheme.lower()
    if scheme in _LOCAL_SCHEMES:
        return Location("file", "", posixpath.normpath(parsed.path if scheme else location))
    path = posixpath.normpath(parsed.path or "/")
    return Location(scheme, parsed.netloc, path)


def is_inside(child: str, root: str) -> bool:
    return parse_location(child).is_inside(parse_location(root))


# The pre-commit file is a Parquet file of one row and one column, the pre-commit's compact JSON, rather
# than a JSON file: an object store that serves a table bucket refuses other objects below a table's
# location (SeaweedFS's does, tested: ``.json`` and ``.txt`` are denied, ``.parquet`` and ``.avro``
# taken). No snapshot references it, so Iceberg readers never see it. pyarrow is imported where it is
# used: the file sink's config, imported at every DAG parse, reaches this module.

_COLUMN = "pre_commit"


def pre_commit_to_file(pre_commit_json: bytes) -> bytes:
    """The pre-commit file's bytes for a pre-commit's JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({_COLUMN: [pre_commit_json.decode()]}), buffer, compression="zstd")
    return buffer.getvalue()


def pre_commit_from_file(data: bytes) -> bytes:
    """The pre-commit JSON in a pre-commit file's bytes; an unreadable file (cut short, or not ours)
    gives empty bytes, which no pre-commit parses from."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
        value = table.column(_COLUMN)[0].as_py() if table.num_rows == 1 and _COLUMN in table.column_names else None
    except (pa.ArrowException, OSError):
        return b""
    return value.encode() if isinstance(value, str) else b""
