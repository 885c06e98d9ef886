"""A throwaway world for benchmarks: meta store, catalog and warehouse, on SQLite, on PostgreSQL, or
on a REST catalog and S3 (SeaweedFS's ``weed mini``, started here; the meta store on SQLite).

Benchmarks are run by hand (``uv run python -m bench.<name>``), write JSON and a PNG into
``bench/results/``, and compare as ratios measured in the same run.
"""

from __future__ import annotations

import io
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from airflow_provider_exactly_once.checkpoints import MetaStoreCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.store import SqlSinkStateStore

RESULTS = Path(__file__).parent / "results"
BACKENDS = ("sqlite", "postgres", "rest")
PG_ADMIN_URL = os.environ.get("EO_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "epoch", LongType(), required=False),
    NestedField(3, "payload", StringType(), required=False),
)


@dataclass
class World:
    backend: str
    root: Path
    store: SqlSinkStateStore
    catalog: Catalog
    checkpoints: MetaStoreCheckpointSource

    def table(self, name: str) -> Table:
        self.catalog.create_namespace_if_not_exists("bench")
        return self.catalog.create_table(f"bench.{name}", schema=SCHEMA)

    def coordinator(self, sink_id: str, **committer_options: Any) -> TwoPhaseCommitCoordinator:
        committer = IcebergSinkCommitter(self.catalog, **committer_options)
        return TwoPhaseCommitCoordinator(self.store, {sink_id: committer}, self.checkpoints)


@contextmanager
def world(backend: str) -> Iterator[World]:
    """``backend``: one of ``BACKENDS``. On ``rest`` every catalog call is an HTTP round trip and every
    manifest and existence check an S3 request, which the SQL catalogs on local files cannot show."""
    with tempfile.TemporaryDirectory(prefix="eo-bench-") as tmp:
        root = Path(tmp)
        (root / "warehouse").mkdir()
        database = None
        server = None
        if backend == "postgres":
            database = f"eo_bench_{uuid.uuid4().hex[:10]}"
            admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
            url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database
            meta_url, catalog_url = url, url
        else:
            meta_url, catalog_url = f"sqlite:///{root / 'meta.db'}", f"sqlite:///{root / 'catalog.db'}"
        catalog: Catalog
        if backend == "rest":
            from demo.servers import SeaweedFS

            server = SeaweedFS(root / "weed").start()
            catalog = load_catalog("bench", **server.catalog_properties())
        else:
            catalog = SqlCatalog("bench", uri=catalog_url, warehouse=f"file://{root / 'warehouse'}")
        store = SqlSinkStateStore(meta_url)
        try:
            yield World(backend, root, store, catalog, MetaStoreCheckpointSource(store.checkpoints))
        finally:
            store.dispose()
            if isinstance(catalog, SqlCatalog):
                catalog.engine.dispose()
            if server is not None:
                server.stop()
            if database:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
                admin.dispose()


ARROW_SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), pa.field("epoch", pa.int64()), pa.field("payload", pa.string())]
)


def parquet_bytes(first_id: int, rows: int, epoch: int = 0) -> bytes:
    """One small Parquet file of ``SCHEMA``'s rows ``first_id`` onwards, every row in ``epoch``."""
    ids = list(range(first_id, first_id + rows))
    data = pa.table({"id": ids, "epoch": [epoch] * rows, "payload": ["x" * 16] * rows}, schema=ARROW_SCHEMA)
    buffer = io.BytesIO()
    pq.write_table(data, buffer)
    return buffer.getvalue()


def put_files(table: Table, location: str, payloads: Sequence[bytes]) -> list[DataFileDescriptor]:
    """Each payload stored as ``location/part-NNNNNN.parquet`` through the table's FileIO (local or
    S3: requests in flight side by side), described from its footer as the Spark writer does."""

    def put(n: int) -> DataFileDescriptor:
        path, payload = f"{location}/part-{n:06d}.parquet", payloads[n]
        with table.io.new_output(path).create(overwrite=True) as stream:
            stream.write(payload)
        return describe_parquet_file(
            path,
            table_schema=table.schema(),
            partition={},
            writer=str(n),
            parquet_metadata=pq.read_metadata(io.BytesIO(payload)),
            file_size_in_bytes=len(payload),
        )

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(put, range(len(payloads))))


def write_files(
    table: Table, location: str, count: int, rows_per_file: int = 10, *, epoch: int = 0
) -> list[DataFileDescriptor]:
    """``count`` small Parquet files under ``location`` (every row in ``epoch``), described as the
    Spark writer would."""
    return put_files(table, location, [parquet_bytes(n * rows_per_file, rows_per_file, epoch) for n in range(count)])


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def tree_named(tree: Path) -> str:
    """A checkout as a result names it: its commit, and whether it held uncommitted changes; never
    its path, which says nothing on another machine."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "not a git checkout"
    return f"{commit} with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else commit


def save(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "benchmark": name,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **payload,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


#: One plotted series: legend label, a value per size, matplotlib line style.
Series = tuple[str, list[float], str]


def plot_cost(
    name: str,
    title: str,
    files: list[int],
    costs: list[Series],
    ratios: list[Series],
    *,
    ratio_label: str,
    lines: Sequence[tuple[float, str, str | None]] = (),
) -> Path:
    """Seconds per size on log-log axes beside the ratios that matter; ``lines``: (y, colour, label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, values, style in costs:
        left.loglog(files, values, style, label=label)
    left.set_xlabel("data files in the epoch")
    left.set_ylabel("seconds (median)")
    left.legend()
    left.set_title(title)
    for label, values, style in ratios:
        right.semilogx(files, values, style, label=label)
    for y, colour, label in lines:
        right.axhline(y, color=colour, linestyle=":", label=label)
    right.set_xlabel("data files in the epoch")
    right.set_ylabel(ratio_label)
    right.legend()
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=100)
    return path
