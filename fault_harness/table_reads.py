"""What the table of a fault run holds, read without our own code's help: the data files its
history references, the snapshots carrying the sink's marker, the files in its data directory
(local disk, or S3 through s3fs), and its rows by pyiceberg and by an independent reader (DuckDB's
iceberg extension, with its httpfs extension for tables on S3); and, while a fan-out's runs go,
what a reader loading its tables one after the other sees (``FanOutReader``).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from airflow_provider_exactly_once.sinks.iceberg.markers import (
    AUDIT_BRANCH_KEY,
    EPOCH_KEY,
    REVISION_KEY,
    SINK_ID_KEY,
    WRITE_ID_KEY,
    marker_of,
)
from airflow_provider_exactly_once.sinks.layout import PRE_COMMIT_FILE
from fault_harness.landed import COLUMNS, Row


def local_path(path: str) -> str:
    return path.removeprefix("file://")


class Storage:
    """Where a table's files lie, as the checker looks at them: local disk by ``os``, S3 by s3fs
    (fsspec) with the storage options given (``SeaweedFS.s3fs_options()``), never by the table's
    own FileIO, which is what the committer used."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self._options = dict(options or {})
        self._s3: Any = None

    def _fs(self) -> Any:
        if self._s3 is None:
            import s3fs

            self._s3 = s3fs.S3FileSystem(**self._options, skip_instance_cache=True)
        return self._s3

    def files(self, directory: str) -> dict[str, float]:
        """Every ``*.parquet`` data file under ``directory`` (a table location's ``data``), with its
        mtime; a write's pre-commit (``PRE_COMMIT_FILE``, Parquet too) is no data file."""
        if not directory.startswith("s3://"):
            found = {}
            for root, _dirs, names in os.walk(directory):
                for name in names:
                    if name.endswith(".parquet") and name != PRE_COMMIT_FILE:
                        path = os.path.join(root, name)
                        found[path] = os.stat(path).st_mtime
            return found
        listing = self._fs().find(directory.removeprefix("s3://"), detail=True)
        return {
            f"s3://{key}": info["LastModified"].timestamp()
            for key, info in listing.items()
            if key.endswith(".parquet") and not key.endswith(f"/{PRE_COMMIT_FILE}")
        }

    def exists(self, path: str) -> bool:
        if not path.startswith("s3://"):
            return os.path.exists(path)
        return bool(self._fs().exists(path.removeprefix("s3://")))


def referenced_files(table: Table) -> set[str]:
    """Every data file any snapshot of the table's history references (added or still live), and
    every manifest (an append's lies below its write location, written at persist)."""
    io = table.io
    paths: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            paths.add(local_path(manifest.manifest_path))
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                paths.add(local_path(entry.data_file.file_path))
    return paths


@dataclass(frozen=True)
class Marked:
    """A snapshot carrying the sink's marker: which epoch and write it committed, as which revision."""

    order: int
    snapshot: Snapshot
    epoch: int
    write_id: str
    revision: int
    #: The data files the snapshot added (the write's files).
    added: frozenset[str]

    @property
    def snapshot_id(self) -> int:
        return self.snapshot.snapshot_id


def main_ancestry(table: Table) -> set[int]:
    """The snapshot ids of ``main``'s history: its head, its parent, and so on."""
    ids: set[int] = set()
    snapshot = table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id not in ids:
        ids.add(snapshot.snapshot_id)
        snapshot = None if snapshot.parent_snapshot_id is None else table.snapshot_by_id(snapshot.parent_snapshot_id)
    return ids


def _in_commit_order(table: Table) -> list[Snapshot]:
    indexed = list(enumerate(table.metadata.snapshots))
    indexed.sort(key=lambda p: (p[1].sequence_number or 0, p[0]))
    return [s for _, s in indexed]


def added_files(table: Table, snapshot: Snapshot) -> frozenset[str]:
    paths: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status == ManifestEntryStatus.ADDED:
                paths.add(local_path(entry.data_file.file_path))
    return frozenset(paths)


def marked_snapshots(table: Table, sink_id: str, *, audits: bool = False) -> list[Marked]:
    """The snapshots carrying ``sink_id``'s marker, in commit order: the commits to the sink's branch,
    or with ``audits`` an audited sink's commits to its audit branches (``AUDIT_BRANCH_KEY``,
    design.md D23) instead."""
    found = []
    for order, snapshot in enumerate(_in_commit_order(table)):
        marker = marker_of(snapshot)
        if marker is None or marker[SINK_ID_KEY] != sink_id:
            continue
        if (AUDIT_BRANCH_KEY in marker) != audits:
            continue
        try:
            revision = int(marker.get(REVISION_KEY, "0"))
        except ValueError:
            revision = -1
        found.append(
            Marked(
                order,
                snapshot,
                int(marker[EPOCH_KEY]),
                marker.get(WRITE_ID_KEY, ""),
                revision,
                added_files(table, snapshot),
            )
        )
    return found


#: A marked write as a table shows it: (epoch, write id, revision).
MarkedWrite = tuple[int, str, int]


def marked_writes(table: Table, sink_id: str) -> set[MarkedWrite]:
    """The writes the table's snapshots carry ``sink_id``'s marker of, from their summaries alone."""
    found = set()
    for snapshot in table.metadata.snapshots:
        marker = marker_of(snapshot)
        if marker is not None and marker[SINK_ID_KEY] == sink_id:
            found.add((int(marker[EPOCH_KEY]), marker.get(WRITE_ID_KEY, ""), int(marker.get(REVISION_KEY, "0") or 0)))
    return found


@dataclass
class FanOutReads:
    """What a ``FanOutReader`` saw: per (table, marked write) it found, how many reads showed it,
    and per (table, marked write, table loaded after it that did not show it), how many times."""

    samples: int = 0
    errors: int = 0
    shown: Counter[tuple[str, MarkedWrite]] = field(default_factory=Counter)
    torn: Counter[tuple[str, MarkedWrite, str]] = field(default_factory=Counter)


class FanOutReader(threading.Thread):
    """Loads a fan-out's tables one after the other through a catalog of its own, again and again
    while the runs go, each read in the other order than the one before. Where every epoch (and
    revision) reaches all the tables at once, whatever marked write one load shows every later load
    shows too; one that a later load does not show is a torn state, counted per marked snapshot
    (``checker.check_fan_out`` judges them). A failed read (a table not created yet, the catalog's
    database restarting) is counted and skipped."""

    def __init__(
        self, open_catalog: Callable[[], Catalog], tables: Sequence[str], sink_id: str, pause_s: float = 0.05
    ) -> None:
        super().__init__(daemon=True, name=f"fan-out reader of {sink_id}")
        self._open_catalog = open_catalog
        self._tables = list(tables)
        self._sink_id = sink_id
        self._pause_s = pause_s
        self.reads = FanOutReads()
        self.stop = threading.Event()

    def run(self) -> None:
        catalog = self._open_catalog()
        try:
            while not self.stop.is_set():
                order = self._tables if self.reads.samples % 2 == 0 else self._tables[::-1]
                try:
                    shown = [(name, marked_writes(catalog.load_table(name), self._sink_id)) for name in order]
                except Exception:
                    self.reads.errors += 1
                else:
                    self._count(shown)
                time.sleep(self._pause_s)
        finally:
            engine = getattr(catalog, "engine", None)
            if engine is not None:
                engine.dispose()

    def _count(self, shown: list[tuple[str, set[MarkedWrite]]]) -> None:
        reads = self.reads
        reads.samples += 1
        for n, (name, writes) in enumerate(shown):
            for write in writes:
                reads.shown[name, write] += 1
                for later, later_writes in shown[n + 1 :]:
                    if write not in later_writes:
                        reads.torn[name, write, later] += 1


def _rows_of_arrow(data: pa.Table) -> list[Row]:
    data = data.select(list(COLUMNS))
    columns = [data.column(name) for name in COLUMNS]
    columns[3] = columns[3].cast(pa.int64())  # timestamp[us, UTC] -> microseconds
    return [(str(e), u, t, at, a) for e, u, t, at, a in zip(*(c.to_pylist() for c in columns), strict=True)]


def pyiceberg_rows(table: Table, snapshot_id: int | None = None) -> list[Row]:
    if snapshot_id is None and table.metadata.current_snapshot_id is None:
        return []
    return _rows_of_arrow(table.scan(snapshot_id=snapshot_id, selected_fields=COLUMNS).to_arrow())


class IndependentReader:
    """DuckDB's iceberg extension, loaded from its PyPI packages (never the network), as in
    ``tests/support/independent_reader.py``: a bug shared by the commit path and pyiceberg's scan
    cannot hide from it. ``None`` from ``open`` when DuckDB is not installed (the dev group)."""

    name = "duckdb"

    def __init__(self, connection: Any) -> None:
        self._con = connection

    @classmethod
    def open(cls, s3: Mapping[str, Any] | None = None) -> IndependentReader | None:
        """``s3``: s3fs's options for the tables' S3 (``SeaweedFS.s3fs_options()``), for tables there."""
        try:
            import duckdb
            import duckdb_extension_avro  # type: ignore[import-untyped]
            import duckdb_extension_httpfs  # type: ignore[import-untyped]
            import duckdb_extension_iceberg  # type: ignore[import-untyped]
        except ImportError:
            return None

        def extension(package: Any, name: str) -> str:
            found = sorted(Path(package.__path__[0]).glob(f"extensions/*/{name}.duckdb_extension"))
            if not found:
                raise RuntimeError(f"{package.__name__} ships no {name}.duckdb_extension")
            return str(found[-1])

        con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
        con.execute(f"LOAD '{extension(duckdb_extension_avro, 'avro')}'")
        con.execute(f"LOAD '{extension(duckdb_extension_iceberg, 'iceberg')}'")
        if s3 is not None:
            con.execute(f"LOAD '{extension(duckdb_extension_httpfs, 'httpfs')}'")
            client = s3.get("client_kwargs", {})
            endpoint = urllib.parse.urlsplit(client["endpoint_url"])
            con.execute(
                f"CREATE SECRET (TYPE S3, KEY_ID {_literal(s3['key'])}, SECRET {_literal(s3['secret'])}, "
                f"ENDPOINT {_literal(endpoint.netloc)}, URL_STYLE 'path', USE_SSL {endpoint.scheme == 'https'}, "
                f"REGION {_literal(client.get('region_name', 'us-east-1'))})"
            )
        return cls(con)

    def rows(self, table: Table, snapshot_id: int) -> list[Row]:
        query = (
            "SELECT event_id, user_id, event_type, epoch_us(event_time), amount "
            f"FROM iceberg_scan(?, snapshot_from_id => {int(snapshot_id)})"
        )
        return [
            (str(e), u, t, at, a)
            for e, u, t, at, a in self._con.execute(query, [local_path(table.metadata_location)]).fetchall()
        ]

    def close(self) -> None:
        self._con.close()


def _literal(value: str) -> str:
    """A SQL string literal: DuckDB's ``CREATE SECRET`` takes no parameters."""
    return "'" + str(value).replace("'", "''") + "'"
