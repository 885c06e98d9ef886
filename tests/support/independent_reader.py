"""An Iceberg reader that is not pyiceberg: DuckDB's iceberg extension, loaded from its PyPI package.

Tests judge a table by what another engine reads from its metadata file, so a bug shared by our
commit path and pyiceberg's scan cannot hide. The extensions come from the installed
``duckdb-extension-iceberg`` and ``duckdb-extension-avro`` packages, never from the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
from pyiceberg.table import Table


def _extension(package: Any, name: str) -> str:
    found = sorted(Path(package.__path__[0]).glob(f"extensions/*/{name}.duckdb_extension"))
    if not found:
        raise RuntimeError(f"{package.__name__} ships no {name}.duckdb_extension")
    return str(found[-1])


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.execute(f"LOAD '{_extension(duckdb_extension_avro, 'avro')}'")
    con.execute(f"LOAD '{_extension(duckdb_extension_iceberg, 'iceberg')}'")
    return con


def read_rows(table: Table, columns: str = "*", *, snapshot_id: int | None = None) -> list[tuple[Any, ...]]:
    """Every row of ``table`` at ``snapshot_id`` (its current snapshot when ``None``), sorted.

    A table with no snapshot (or a branch not yet created) holds no rows; DuckDB is not asked.
    """
    if snapshot_id is None:
        current = table.metadata.current_snapshot_id
        if current is None:
            return []
        snapshot_id = current
    metadata = table.metadata_location.removeprefix("file://")
    con = connect()
    try:
        query = f"SELECT {columns} FROM iceberg_scan(?, snapshot_from_id => {int(snapshot_id)})"
        return sorted(con.execute(query, [metadata]).fetchall())
    finally:
        con.close()


def read_branch(table: Table, branch: str, columns: str = "*") -> list[tuple[Any, ...]]:
    """The rows the head of ``branch`` shows; none while the branch does not exist."""
    ref = table.metadata.refs.get(branch)
    return [] if ref is None else read_rows(table, columns, snapshot_id=ref.snapshot_id)
