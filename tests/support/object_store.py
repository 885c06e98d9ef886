"""The Iceberg tests' world on object storage: tables behind a real catalog, files on S3.

``Lake`` is one catalog with its S3 (the REST catalog of SeaweedFS, or AWS Glue on moto), each test
under its own namespace and prefix because the servers are shared by the session. ``S3Pipeline`` is
``tests.support.pipeline.Pipeline`` with that catalog, writing its Parquet files to ``s3://`` as the
Spark writer does (described from the writer's own footer, never read back), so every coordinator
test helper built on ``Pipeline`` runs unchanged against it.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.schema import Schema

from airflow_provider_exactly_once.checkpoints import MetaStoreCheckpointSource
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.store import SqlSinkStateStore
from demo.servers import MotoServer, SeaweedFS
from tests.support.pipeline import ARROW_SCHEMA, Pipeline

#: The catalogs every object-storage test runs against; ``rest-fsspec`` is the REST catalog with
#: pyiceberg's fsspec FileIO (s3fs) in place of its default pyarrow one, so both storage paths run.
LAKES = ["rest", "glue", "rest-fsspec"]
FSSPEC_IO = {"py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"}


@dataclass(frozen=True)
class Lake:
    """One catalog and its S3, as a deployment's Iceberg connection would describe them."""

    kind: str
    catalog_properties: dict[str, str]
    s3fs_options: dict[str, Any]
    s3_endpoint: str
    #: Namespace (REST) or warehouse prefix (Glue) of this test alone.
    namespace: str

    @property
    def file_io(self) -> str:
        """The FileIO class pyiceberg gives this lake's tables."""
        return (
            "FsspecFileIO" if self.catalog_properties.get("py-io-impl") == FSSPEC_IO["py-io-impl"] else "PyArrowFileIO"
        )

    def catalog(self, name: str | None = None, **overrides: str) -> Catalog:
        return load_catalog(name or f"{self.kind}_{uuid.uuid4().hex[:6]}", **{**self.catalog_properties, **overrides})

    def filesystem(self) -> s3fs.S3FileSystem:
        # No instance cache: a test that stops S3 must not get a client with another test's listing cache.
        return s3fs.S3FileSystem(**self.s3fs_options, skip_instance_cache=True)


def seaweed_lake(server: SeaweedFS, namespace: str, **overrides: str) -> Lake:
    return Lake(
        "rest",
        {**server.catalog_properties(), **overrides},
        server.s3fs_options(),
        overrides.get("s3.endpoint", server.s3_endpoint),
        namespace,
    )


def glue_lake(server: MotoServer, namespace: str) -> Lake:
    return Lake(
        "glue",
        server.glue_catalog_properties(f"s3://eo-lake/{namespace}"),
        server.s3fs_options(),
        server.endpoint,
        namespace,
    )


@pytest.fixture(params=LAKES)
def lake(request: pytest.FixtureRequest, unique: str) -> Lake:
    """The REST catalog on SeaweedFS, Glue on moto; a namespace of the test's own on each."""
    namespace = f"eo_{unique}"
    if request.param == "glue":
        return glue_lake(request.getfixturevalue("moto"), namespace)
    overrides = FSSPEC_IO if request.param == "rest-fsspec" else {}
    return seaweed_lake(request.getfixturevalue("seaweed"), namespace, **overrides)


@dataclass
class S3Pipeline(Pipeline):
    """``Pipeline`` on a ``Lake``: the meta store stays SQLite, tables and files are on S3."""

    lake: Lake | None = None
    fs: s3fs.S3FileSystem = field(init=False)

    def __post_init__(self) -> None:
        assert self.lake is not None, "S3Pipeline needs a lake"
        self.store = SqlSinkStateStore(self.meta_url)
        self.catalog = self.lake.catalog(self.catalog_name)  # type: ignore[assignment]
        self.checkpoints = MetaStoreCheckpointSource(self.store.checkpoints)
        self.fs = self.lake.filesystem()

    def _parquet_files(
        self,
        location: str,
        schema: Schema,
        epoch: int,
        write_id: str,
        rows: int,
        files: int,
        partition: dict[str, int] | None = None,
    ) -> list[DataFileDescriptor]:
        descriptors = []
        per_file = -(-rows // files) if rows else 0
        for n, start in enumerate(range(0, rows, per_file or 1)):
            ids = list(range(epoch * 1_000_000 + start, epoch * 1_000_000 + min(rows, start + per_file)))
            data = pa.table(
                {"id": ids, "epoch": [epoch] * len(ids), "write_id": [write_id] * len(ids)}, schema=ARROW_SCHEMA
            )
            path = f"{location}/part-{n:05d}.parquet"
            descriptors.append(self.put_parquet(path, data, schema, partition or {}, writer=str(n)))
        return descriptors

    def put_parquet(
        self, path: str, data: pa.Table, schema: Schema, partition: dict[str, Any], *, writer: str = "0"
    ) -> DataFileDescriptor:
        """One object, described from the footer the writer produced (what the Spark writer hands back)."""
        buffer = io.BytesIO()
        pq.write_table(data, buffer)
        payload = buffer.getvalue()
        self.fs.pipe_file(path, payload)
        return describe_parquet_file(
            path,
            table_schema=schema,
            partition=partition,
            writer=writer,
            parquet_metadata=pq.read_metadata(io.BytesIO(payload)),
            file_size_in_bytes=len(payload),
        )

    def objects(self, location: str) -> list[str]:
        """Every object below ``location`` (a prefix listing: folders do not exist on S3)."""
        self.fs.invalidate_cache()
        try:
            return sorted(self.fs.find(location))
        except FileNotFoundError:
            return []

    def write_exists(self, pre: PreCommit) -> bool:
        return any(self.objects(t.location) for t in pre.tables)

    def expected_rows(self, writes: list[PreCommit], table: str) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        for pre in writes:
            for data_file in pre.table(table).data_files:
                with self.fs.open(data_file.path, "rb") as stream:
                    rows = pq.read_table(stream).to_pylist()
                out.extend((r["id"], r["epoch"], r["write_id"]) for r in rows)
        return sorted(out)


def s3_pipeline(lake: Lake, tmp_path: Path, **options: Any) -> S3Pipeline:
    return S3Pipeline(
        meta_url=f"sqlite:///{tmp_path / f'meta-{uuid.uuid4().hex[:6]}.db'}",
        catalog_url=lake.catalog_properties.get("uri", lake.s3_endpoint),
        warehouse=tmp_path,
        catalog_name=f"{lake.kind}_{uuid.uuid4().hex[:6]}",
        namespace=lake.namespace,
        lake=lake,
        **options,
    )


@pytest.fixture
def pipeline_s3(lake: Lake, tmp_path: Path) -> Iterator[S3Pipeline]:
    pipeline = s3_pipeline(lake, tmp_path)
    yield pipeline
    pipeline.dispose()
