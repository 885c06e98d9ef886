"""Marker and Structured Streaming checkpoints on a real S3 (SeaweedFS), credentials from an ``aws``
connection: the sync reads a sensor makes, the async reads the trigger makes (s3fs's own coroutines,
the filesystem made inside the running loop), and an outage that must never read as "absent"."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint, StreamingCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import SinkUnavailable
from airflow_provider_exactly_once.core.ports import CheckpointSource
from airflow_provider_exactly_once.hooks.storage import aresolved_storage_options, resolved_storage_options
from demo.servers import SeaweedFS
from tests.hooks.s3_connection import S3Place, SeaweedDown, s3_place  # noqa: F401

HOUR = datetime(2024, 3, 1, 13, tzinfo=UTC)
EPOCH = epoch_from_interval_start(HOUR)


def both(config: MarkerFileCheckpoint | StreamingCheckpoint, sink_id: str, epoch: int) -> CheckpointStatus:
    """The sensor's answer (connection read synchronously), after checking the trigger's agrees:
    connection read asynchronously, filesystem made and awaited inside the running loop."""
    sync = config.source(storage_options=resolved_storage_options(config)).status(sink_id, epoch)

    async def in_the_triggerer() -> CheckpointStatus:
        source: CheckpointSource = config.source(storage_options=await aresolved_storage_options(config))
        assert source._lookup.is_async  # type: ignore[attr-defined]  # s3fs's own coroutines, no thread
        return await source.astatus(sink_id, epoch)

    assert asyncio.run(in_the_triggerer()) is sync
    return sync


def markers(place: S3Place) -> MarkerFileCheckpoint:
    return MarkerFileCheckpoint(place.url("landing/{sink_id}/{start:%Y/%m/%d/%H}"), storage_conn_id=place.conn_id)


def test_markers_on_s3_pending_completed_then_failed_wins(s3_place: S3Place) -> None:  # noqa: F811
    config = markers(s3_place)
    assert both(config, "orders", EPOCH) is CheckpointStatus.PENDING
    s3_place.touch("landing", "orders", "2024/03/01/13", "_SUCCESS")
    assert both(config, "orders", EPOCH) is CheckpointStatus.COMPLETED
    assert both(config, "orders", EPOCH + 3_600_000) is CheckpointStatus.PENDING  # the next hour
    assert both(config, "customers", EPOCH) is CheckpointStatus.PENDING
    s3_place.touch("landing", "orders", "2024/03/01/13", "_FAILED")
    assert both(config, "orders", EPOCH) is CheckpointStatus.FAILED


def test_the_folder_alone_is_not_a_marker(s3_place: S3Place) -> None:  # noqa: F811
    """S3 has no folders: other objects under the epoch's prefix must not read as a marker."""
    config = markers(s3_place)
    s3_place.touch("landing", "orders", "2024/03/01/13", "part-00000.parquet")
    s3_place.touch("landing", "orders", "2024/03/01/13", "_SUCCESS.tmp")
    s3_place.touch("landing", "orders", "2024/03/01/13", "_SUCCESS", "nested")
    assert both(config, "orders", EPOCH) is CheckpointStatus.PENDING


def test_streaming_checkpoint_on_s3(s3_place: S3Place) -> None:  # noqa: F811
    config = StreamingCheckpoint(s3_place.url("_checkpoints/{sink_id}"), storage_conn_id=s3_place.conn_id)
    assert both(config, "orders", 3) is CheckpointStatus.PENDING
    s3_place.touch("_checkpoints", "orders", "offsets", "3")
    assert both(config, "orders", 3) is CheckpointStatus.PENDING  # planned, not committed
    s3_place.touch("_checkpoints", "orders", "commits", "3")
    assert both(config, "orders", 3) is CheckpointStatus.COMPLETED
    s3_place.fs.rm_file(f"{s3_place.prefix}/_checkpoints/orders/commits/3")  # purged by Spark ...
    s3_place.touch("_checkpoints", "orders", "commits", "5")  # ... after later batches committed
    assert both(config, "orders", 3) is CheckpointStatus.COMPLETED
    assert both(config, "orders", 6) is CheckpointStatus.PENDING


@pytest.mark.parametrize("kind", ["markers", "streaming"])
def test_an_s3_outage_is_an_error_never_absent(s3_place: S3Place, seaweed: SeaweedFS, kind: str) -> None:  # noqa: F811
    if kind == "markers":
        config: MarkerFileCheckpoint | StreamingCheckpoint = markers(s3_place)
        s3_place.touch("landing", "orders", "2024/03/01/13", "_SUCCESS")
        epoch, expected = EPOCH, CheckpointStatus.COMPLETED
    else:
        config = StreamingCheckpoint(s3_place.url("_checkpoints/{sink_id}"), storage_conn_id=s3_place.conn_id)
        epoch, expected = 3, CheckpointStatus.PENDING
    source = config.source(storage_options=resolved_storage_options(config))
    assert source.status("orders", epoch) is expected  # a filesystem (and its caches) from before the outage

    async def in_the_triggerer() -> CheckpointStatus:
        fresh = config.source(storage_options=await aresolved_storage_options(config))
        return await fresh.astatus("orders", epoch)

    with SeaweedDown(seaweed):
        with pytest.raises(SinkUnavailable, match="cannot look up") as raised:
            source.status("orders", epoch)
        assert raised.value.retryable
        with pytest.raises(SinkUnavailable, match="cannot look up"):
            asyncio.run(source.astatus("orders", epoch))
        with pytest.raises(SinkUnavailable, match="cannot look up"):
            asyncio.run(in_the_triggerer())
    assert source.status("orders", epoch) is expected
    assert asyncio.run(in_the_triggerer()) is expected
