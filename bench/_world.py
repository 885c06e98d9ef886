"""A throwaway world for benchmarks: meta store, SQL catalog and warehouse, on SQLite or PostgreSQL.

Benchmarks are run by hand (``uv run python -m bench.<name>``), write JSON and a PNG into
``bench/results/``, and compare as ratios measured in the same run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
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
    catalog: SqlCatalog
    checkpoints: MetaStoreCheckpointSource

    def table(self, name: str) -> Table:
        self.catalog.create_namespace_if_not_exists("bench")
        return self.catalog.create_table(f"bench.{name}", schema=SCHEMA)

    def coordinator(self, sink_id: str, **committer_options: Any) -> TwoPhaseCommitCoordinator:
        committer = IcebergSinkCommitter(self.catalog, **committer_options)
        return TwoPhaseCommitCoordinator(self.store, {sink_id: committer}, self.checkpoints)


@contextmanager
def world(backend: str) -> Iterator[World]:
    with tempfile.TemporaryDirectory(prefix="eo-bench-") as tmp:
        root = Path(tmp)
        (root / "warehouse").mkdir()
        database = None
        if backend == "postgres":
            database = f"eo_bench_{uuid.uuid4().hex[:10]}"
            admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
            url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database
            meta_url = catalog_url = url
        else:
            meta_url, catalog_url = f"sqlite:///{root / 'meta.db'}", f"sqlite:///{root / 'catalog.db'}"
        store = SqlSinkStateStore(meta_url)
        catalog = SqlCatalog("bench", uri=catalog_url, warehouse=f"file://{root / 'warehouse'}")
        try:
            yield World(backend, root, store, catalog, MetaStoreCheckpointSource(store.checkpoints))
        finally:
            store.dispose()
            catalog.engine.dispose()
            if database:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
                admin.dispose()


def write_files(
    table: Table, location: str, count: int, rows_per_file: int = 10, *, epoch: int = 0
) -> list[DataFileDescriptor]:
    """``count`` small Parquet files under ``location`` (every row in ``epoch``), described as the
    Spark writer would."""
    local = location.removeprefix("file://")
    Path(local).mkdir(parents=True, exist_ok=True)
    arrow_schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), pa.field("epoch", pa.int64()), pa.field("payload", pa.string())]
    )
    descriptors = []
    for n in range(count):
        ids = list(range(n * rows_per_file, (n + 1) * rows_per_file))
        data = pa.table({"id": ids, "epoch": [epoch] * len(ids), "payload": ["x" * 16] * len(ids)}, schema=arrow_schema)
        path = f"{location}/part-{n:06d}.parquet"
        pq.write_table(data, f"{local}/part-{n:06d}.parquet")
        descriptors.append(describe_parquet_file(path, table_schema=table.schema(), partition={}, writer=str(n)))
    return descriptors


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


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
