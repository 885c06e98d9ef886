"""Structured Streaming checkpoints: commits/<batchId> means completed; one test against real Spark."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_exactly_once.checkpoints import StructuredStreamingCheckpointSource
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, SinkUnavailable
from airflow_provider_exactly_once.core.ports import CheckpointSource

from .helpers import touch

HOUR_MS = 3_600_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00Z


def both(source: StructuredStreamingCheckpointSource, sink_id: str, epoch: int) -> CheckpointStatus:
    sync = source.status(sink_id, epoch)
    assert asyncio.run(source.astatus(sink_id, epoch)) is sync
    return sync


def lay_out(location: str, *, offsets: range, commits: range) -> None:
    """What Spark leaves behind: metadata, offsets/N and commits/N, with checksum and temp files."""
    touch(f"{location}/metadata", b'{"id":"0d3c5e1a-5b7e-4f0e-9a55-0f4a6c1e2b3d"}')
    for batch in offsets:
        touch(f"{location}/offsets/{batch}", b"v1\n{}\n{}")
        touch(f"{location}/offsets/.{batch}.crc")
    for batch in commits:
        touch(f"{location}/commits/{batch}", b'v1\n{"nextBatchWatermarkMs":0}')
        touch(f"{location}/commits/.{batch}.crc")
    touch(f"{location}/commits/.{commits.stop}.5b1c0f3e.tmp")  # a commit being written


def test_is_a_checkpoint_source(tmp_path: Path) -> None:
    assert isinstance(StructuredStreamingCheckpointSource(str(tmp_path)), CheckpointSource)


def test_commits_mean_completed_offsets_alone_do_not(tmp_path: Path) -> None:
    lay_out(str(tmp_path), offsets=range(3), commits=range(2))
    source = StructuredStreamingCheckpointSource(str(tmp_path))
    assert both(source, "s", 0) is CheckpointStatus.COMPLETED
    assert both(source, "s", 1) is CheckpointStatus.COMPLETED
    assert both(source, "s", 2) is CheckpointStatus.PENDING  # planned, not committed
    assert both(source, "s", 3) is CheckpointStatus.PENDING
    touch(f"{tmp_path}/commits/2")
    assert both(source, "s", 2) is CheckpointStatus.COMPLETED


def test_no_checkpoint_yet_is_pending(tmp_path: Path) -> None:
    source = StructuredStreamingCheckpointSource(str(tmp_path / "not-started"))
    assert both(source, "s", 0) is CheckpointStatus.PENDING


def test_purged_commit_stays_completed(tmp_path: Path) -> None:
    """minBatchesToRetain purges old entries; a later commit proves the earlier batch committed."""
    lay_out(str(tmp_path), offsets=range(5, 8), commits=range(5, 7))
    source = StructuredStreamingCheckpointSource(str(tmp_path))
    assert both(source, "s", 3) is CheckpointStatus.COMPLETED
    assert both(source, "s", 6) is CheckpointStatus.COMPLETED
    assert both(source, "s", 7) is CheckpointStatus.PENDING


def test_hourly_batch_id_mapping(tmp_path: Path) -> None:
    lay_out(str(tmp_path), offsets=range(3), commits=range(2))
    source = StructuredStreamingCheckpointSource(str(tmp_path), batch_id=lambda _, epoch: (epoch - T0) // HOUR_MS)
    assert source.batch_id("s", T0 + HOUR_MS) == 1
    assert both(source, "s", T0) is CheckpointStatus.COMPLETED
    assert both(source, "s", T0 + HOUR_MS) is CheckpointStatus.COMPLETED
    assert both(source, "s", T0 + 2 * HOUR_MS) is CheckpointStatus.PENDING


@pytest.mark.parametrize("result", [-1, "3", 2.0, True, None])
def test_batch_id_mapping_must_give_a_batch_id(tmp_path: Path, result: object) -> None:
    def mapping(sink_id: str, epoch: int) -> Any:
        return result

    source = StructuredStreamingCheckpointSource(str(tmp_path), batch_id=mapping)
    with pytest.raises(InvalidSinkConfig, match=r"batch_id mapping 'mapping' returned .* integer >= 0"):
        source.status("s", 1)


def test_location_per_sink(tmp_path: Path) -> None:
    lay_out(f"{tmp_path}/orders", offsets=range(1), commits=range(1))
    source = StructuredStreamingCheckpointSource(f"{tmp_path}/{{sink_id}}")
    assert both(source, "orders", 0) is CheckpointStatus.COMPLETED
    assert both(source, "customers", 0) is CheckpointStatus.PENDING


@pytest.mark.parametrize(
    ("location", "match"),
    [
        ("/ckpt/{epoch}", r"unknown field \{epoch\}"),
        ("", "non-empty"),
        ("nosuchprotocol://b/c", "cannot open its filesystem"),
    ],
)
def test_location_validation(location: str, match: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=match):
        StructuredStreamingCheckpointSource(location)


def test_batch_id_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(InvalidSinkConfig, match="callable"):
        StructuredStreamingCheckpointSource(str(tmp_path), batch_id=3)  # type: ignore[arg-type]


def test_memory_filesystem(memory_base: str) -> None:
    lay_out(f"{memory_base}/ckpt", offsets=range(2), commits=range(1))
    source = StructuredStreamingCheckpointSource(f"{memory_base}/ckpt")
    assert both(source, "s", 0) is CheckpointStatus.COMPLETED
    assert both(source, "s", 1) is CheckpointStatus.PENDING


def test_native_async_filesystem(async_fs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lay_out("eoasync://bucket/ckpt", offsets=range(9, 11), commits=range(9, 10))
    source = StructuredStreamingCheckpointSource("eoasync://bucket/ckpt")

    async def no_threads(*args: object, **kwargs: object) -> None:
        raise AssertionError("astatus used a worker thread although the filesystem is async")

    monkeypatch.setattr(asyncio, "to_thread", no_threads)
    assert asyncio.run(source.astatus("s", 9)) is CheckpointStatus.COMPLETED
    assert asyncio.run(source.astatus("s", 4)) is CheckpointStatus.COMPLETED  # purged, 9 is later
    assert asyncio.run(source.astatus("s", 10)) is CheckpointStatus.PENDING
    async_fs.fail_with = ConnectionError("timed out")
    with pytest.raises(SinkUnavailable, match="timed out"):
        asyncio.run(source.astatus("s", 10))
    with pytest.raises(SinkUnavailable, match="timed out"):
        source.status("s", 10)


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_against_a_real_spark_checkpoint(tmp_path: Path) -> None:
    """Two micro-batches of a file source with availableNow; then a batch planned but not committed."""
    pyspark_sql = pytest.importorskip("pyspark.sql")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java for Spark")
    source_dir = tmp_path / "input"
    source_dir.mkdir()
    for i in range(2):
        (source_dir / f"part-{i}.json").write_text(f'{{"id": {i}}}\n')
    checkpoint = tmp_path / "checkpoint"

    # A session another test of this process left running (tests/spark's) is used and left running:
    # stopping it would fail every later test of the process that holds it.
    shared = pyspark_sql.SparkSession.getActiveSession()
    spark = shared or (
        pyspark_sql.SparkSession.builder.master("local[1]")
        .appName("eo-checkpoint-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    try:
        stream = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(source_dir))
        query = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "the availableNow query did not finish"
        assert query.exception() is None
    finally:
        if shared is None:
            spark.stop()

    assert sorted(p.name for p in (checkpoint / "commits").iterdir() if not p.name.startswith(".")) == [
        "0",
        "1",
    ]
    source = StructuredStreamingCheckpointSource(f"file://{checkpoint}")
    assert both(source, "s", 0) is CheckpointStatus.COMPLETED
    assert both(source, "s", 1) is CheckpointStatus.COMPLETED
    assert both(source, "s", 2) is CheckpointStatus.PENDING

    # a crash mid-batch: batch 2 planned (offsets written) but its commit never written
    shutil.copy(checkpoint / "offsets" / "1", checkpoint / "offsets" / "2")
    assert both(source, "s", 2) is CheckpointStatus.PENDING
    (checkpoint / "commits" / "1").unlink()  # as if batch 1 were the one in flight
    assert both(source, "s", 1) is CheckpointStatus.PENDING
    assert both(source, "s", 0) is CheckpointStatus.COMPLETED
