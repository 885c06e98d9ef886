"""An Iceberg reader that is not pyiceberg: DuckDB's iceberg extension, loaded from its PyPI package.

Tests judge a table by what another engine reads from its metadata file, so a bug shared by our
commit path and pyiceberg's scan cannot hide. The extensions come from the installed
``duckdb-extension-iceberg``, ``duckdb-extension-avro`` and (for ``s3://`` tables)
``duckdb-extension-httpfs`` packages, never from the network.

A table on S3 is read with the storage settings of the table's own FileIO (``s3.endpoint``,
``s3.access-key-id``, ...), the ones the catalog handed to pyiceberg: the reader reaches the same
bucket without being told anything else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_avro
import duckdb_extension_httpfs
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


def _configure_s3(con: duckdb.DuckDBPyConnection, properties: dict[str, Any]) -> None:
    """Load httpfs and one S3 secret for the endpoint the table's FileIO uses."""
    con.execute(f"LOAD '{_extension(duckdb_extension_httpfs, 'httpfs')}'")
    endpoint = str(properties.get("s3.endpoint", ""))
    options = {
        "KEY_ID": properties.get("s3.access-key-id"),
        "SECRET": properties.get("s3.secret-access-key"),
        "SESSION_TOKEN": properties.get("s3.session-token"),
        "REGION": properties.get("s3.region") or properties.get("client.region"),
    }
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options["ENDPOINT"] = host.rstrip("/") if host else scheme
        options["URL_STYLE"] = "path"
        options["USE_SSL"] = "true" if scheme == "https" else "false"
    clauses = ", ".join(
        f"{key} {value}" if key == "USE_SSL" else f"{key} '{value}'"
        for key, value in options.items()
        if value is not None
    )
    con.execute(f"CREATE SECRET (TYPE S3, {clauses})")


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
        if metadata.startswith(("s3://", "s3a://")):
            _configure_s3(con, dict(table.io.properties))
        query = f"SELECT {columns} FROM iceberg_scan(?, snapshot_from_id => {int(snapshot_id)})"
        return sorted(con.execute(query, [metadata]).fetchall())
    finally:
        con.close()


def read_branch(table: Table, branch: str, columns: str = "*") -> list[tuple[Any, ...]]:
    """The rows the head of ``branch`` shows; none while the branch does not exist."""
    ref = table.metadata.refs.get(branch)
    return [] if ref is None else read_rows(table, columns, snapshot_id=ref.snapshot_id)
