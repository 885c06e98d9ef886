"""Marker-file checkpoints: _SUCCESS / _FAILED at a templated path, local, memory:// and async."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_exactly_once.checkpoints import MarkerFileCheckpointSource
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig, SinkUnavailable
from airflow_provider_exactly_once.core.ports import CheckpointSource

from .helpers import touch

EPOCH = 1_700_000_000_000


def both(source: MarkerFileCheckpointSource, sink_id: str, epoch: int) -> CheckpointStatus:
    """The sync answer, after checking the async one agrees."""
    sync = source.status(sink_id, epoch)
    assert asyncio.run(source.astatus(sink_id, epoch)) is sync
    return sync


def test_is_a_checkpoint_source(tmp_path: Path) -> None:
    assert isinstance(MarkerFileCheckpointSource(f"{tmp_path}/{{sink_id}}/{{epoch}}"), CheckpointSource)


def test_pending_then_completed(tmp_path: Path) -> None:
    source = MarkerFileCheckpointSource(f"{tmp_path}/{{sink_id}}/{{epoch}}")
    assert both(source, "orders", EPOCH) is CheckpointStatus.PENDING
    touch(f"{tmp_path}/orders/{EPOCH}/_SUCCESS")
    assert both(source, "orders", EPOCH) is CheckpointStatus.COMPLETED
    assert both(source, "orders", EPOCH + 1) is CheckpointStatus.PENDING
    assert both(source, "customers", EPOCH) is CheckpointStatus.PENDING


def test_failed_beats_success(tmp_path: Path) -> None:
    source = MarkerFileCheckpointSource(f"{tmp_path}/{{sink_id}}/{{epoch}}")
    touch(f"{tmp_path}/orders/{EPOCH}/_FAILED")
    assert both(source, "orders", EPOCH) is CheckpointStatus.FAILED
    touch(f"{tmp_path}/orders/{EPOCH}/_SUCCESS")
    assert both(source, "orders", EPOCH) is CheckpointStatus.FAILED


def test_custom_marker_names(tmp_path: Path) -> None:
    source = MarkerFileCheckpointSource(f"{tmp_path}/{{epoch}}", success_marker="READY", failed_marker="REJECTED")
    touch(f"{tmp_path}/{EPOCH}/_SUCCESS")  # not the configured marker
    assert both(source, "s", EPOCH) is CheckpointStatus.PENDING
    touch(f"{tmp_path}/{EPOCH}/READY")
    assert both(source, "s", EPOCH) is CheckpointStatus.COMPLETED
    touch(f"{tmp_path}/{EPOCH}/REJECTED")
    assert both(source, "s", EPOCH) is CheckpointStatus.FAILED


def test_hourly_templated_paths(tmp_path: Path) -> None:
    source = MarkerFileCheckpointSource(f"file://{tmp_path}/landing/{{sink_id}}/{{start:%Y/%m/%d/%H}}/")
    seven = epoch_from_interval_start(datetime(2024, 3, 5, 7, tzinfo=UTC))
    eight = epoch_from_interval_start(datetime(2024, 3, 5, 8, tzinfo=UTC))
    assert source.location("orders", seven) == f"file://{tmp_path}/landing/orders/2024/03/05/07/"
    touch(f"{tmp_path}/landing/orders/2024/03/05/07/_SUCCESS")
    assert both(source, "orders", seven) is CheckpointStatus.COMPLETED
    assert both(source, "orders", eight) is CheckpointStatus.PENDING
    # the same instant given in another zone is the same epoch, so the same UTC folder
    cet = timezone(timedelta(hours=1))
    assert epoch_from_interval_start(datetime(2024, 3, 5, 8, tzinfo=cet)) == seven


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("/data/{sinkid}/{epoch}", r"unknown field \{sinkid\}"),
        ("/data/{sink_id}/{epoch}/{run_id}", r"unknown field \{run_id\}"),
        ("/data/{}/{epoch}", "positional field"),
        ("/data/{0}/{epoch}", "positional field"),
        ("/data/{epoch", "not a valid template"),
        ("/data/{epoch:%Y}", "cannot be rendered"),
        ("/data/{start.nosuch}", "cannot be rendered"),
        ("/data/{sink_id}", r"neither \{epoch\} nor \{start\}"),
        ("", "non-empty"),
        ("nosuchprotocol://b/{epoch}", "cannot open its filesystem"),
    ],
)
def test_template_validation(template: str, match: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=match):
        MarkerFileCheckpointSource(template)


def test_template_attribute_access_is_allowed(tmp_path: Path) -> None:
    source = MarkerFileCheckpointSource(f"{tmp_path}/{{start.year}}/{{epoch}}")
    touch(f"{tmp_path}/2023/{EPOCH}/_SUCCESS")
    assert both(source, "s", EPOCH) is CheckpointStatus.COMPLETED


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"success_marker": ""}, "success_marker"),
        ({"failed_marker": "a/b"}, "failed_marker"),
        ({"success_marker": "X", "failed_marker": "X"}, "both 'X'"),
    ],
)
def test_marker_name_validation(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=match):
        MarkerFileCheckpointSource(f"{tmp_path}/{{epoch}}", **kwargs)


def test_bad_epoch(tmp_path: Path) -> None:
    source = MarkerFileCheckpointSource(f"{tmp_path}/{{sink_id}}/{{epoch}}")
    with pytest.raises(InvalidPreCommit, match="negative"):
        source.status("s", -1)


def test_memory_filesystem(memory_base: str) -> None:
    source = MarkerFileCheckpointSource(f"{memory_base}/{{sink_id}}/{{start:%Y-%m-%d}}")
    day = epoch_from_interval_start(datetime(2024, 1, 2, tzinfo=UTC))
    assert both(source, "s", day) is CheckpointStatus.PENDING
    touch(f"{memory_base}/s/2024-01-02/_SUCCESS")
    assert both(source, "s", day) is CheckpointStatus.COMPLETED
    touch(f"{memory_base}/s/2024-01-02/_FAILED")
    assert both(source, "s", day) is CheckpointStatus.FAILED


def test_native_async_filesystem_is_awaited_not_threaded(async_fs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    source = MarkerFileCheckpointSource("eoasync://bucket/{sink_id}/{epoch}", storage_options={})
    touch(f"eoasync://bucket/s/{EPOCH}/_SUCCESS")

    async def no_threads(*args: object, **kwargs: object) -> None:
        raise AssertionError("astatus used a worker thread although the filesystem is async")

    monkeypatch.setattr(asyncio, "to_thread", no_threads)
    async_fs.coroutine_threads.clear()
    assert asyncio.run(source.astatus("s", EPOCH)) is CheckpointStatus.COMPLETED
    assert asyncio.run(source.astatus("s", EPOCH + 1)) is CheckpointStatus.PENDING
    assert async_fs.coroutine_threads and set(async_fs.coroutine_threads) == {"fsspecIO"}
    touch(f"eoasync://bucket/s/{EPOCH}/_FAILED")
    assert asyncio.run(source.astatus("s", EPOCH)) is CheckpointStatus.FAILED
    assert source.status("s", EPOCH) is CheckpointStatus.FAILED


def test_unreachable_store_is_an_error_not_a_missing_marker(async_fs: Any) -> None:
    source = MarkerFileCheckpointSource("eoasync://bucket/{sink_id}/{epoch}")
    async_fs.fail_with = ConnectionError("connection reset")
    with pytest.raises(SinkUnavailable, match="connection reset"):
        source.status("s", EPOCH)
    with pytest.raises(SinkUnavailable, match="connection reset"):
        asyncio.run(source.astatus("s", EPOCH))
