"""Where each kind of sink keeps a write's files until the write is committed or given up.

Three parties must agree on it: the Spark writer puts the files there, the committer commits or
deletes them, and the orphan scan (``write_locations.py``) lists the folders to find writes nobody
answers for. They all ask this module, which imports nothing heavy, so the Spark side needs no committer.

- Iceberg: ``<data root>/_eo/<write_id>/``, inside the table's data root (``write.data.path``, else
  ``<table location>/data``). Committed files stay where they were written; the table's manifests
  point at them.
- File sink: ``<root>/_staging/<write_id>/``; the commit moves the files out to their final names.
  The leading underscore keeps Spark, Hive and Trino readers of the directory out of it.

A finished write leaves its pre-commit in its first target's location (``PRE_COMMIT_FILE``): where
the write task returned none (a Spark operator that is not ours, a driver whose local files the
task cannot see), persist takes it from there (``core/left_writes.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "FILE_STAGING_DIR",
    "ICEBERG_WRITE_DIR",
    "PRE_COMMIT_FILE",
    "file_write_location",
    "file_writes_folder",
    "iceberg_data_root",
    "iceberg_write_location",
    "iceberg_writes_folder",
]

#: Folder under an Iceberg table's data root that holds one folder per write.
ICEBERG_WRITE_DIR = "_eo"
#: Folder under a file sink's root that holds one folder per write's staged files.
FILE_STAGING_DIR = "_staging"
#: The pre-commit a finished write leaves in its first target's write location (its format:
#: ``pre_commit_file``); the leading underscore keeps file readers and the commit's moves away from it.
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
