"""``CheckpointSensor`` on S3 markers in real DAG runs (``dag.test()``), poke and deferrable, with the
credentials in an ``aws`` connection; and the trigger through an S3 outage."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start
from airflow_provider_exactly_once.sensors import CheckpointSensor
from airflow_provider_exactly_once.triggers.checkpoint import CheckpointTrigger
from demo.servers import SECRET_KEY, SeaweedFS
from tests.hooks.s3_connection import S3Place, SeaweedDown, s3_place  # noqa: F401
from tests.support.airflow_world import run, ti_states

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
EPOCH = epoch_from_interval_start(DAY)
SINK = "landing-orders"


def markers(place: S3Place) -> MarkerFileCheckpoint:
    return MarkerFileCheckpoint(place.url("landing/{sink_id}/{epoch}"), storage_conn_id=place.conn_id)


def sensor_dag(place: S3Place, **sensor: Any) -> DAG:
    with DAG(
        f"eo_s3_sensor_{uuid.uuid4().hex[:10]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
    ) as dag:
        CheckpointSensor(
            task_id="wait",
            sink_id=SINK,
            checkpoint=markers(place),
            poke_interval=0.2,
            timeout=60,
            retries=0,
            **sensor,
        )
    return dag


def later(seconds: float, action: Any) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_poke_mode_reads_the_marker_on_s3(airflow_home: Path, s3_place: S3Place) -> None:  # noqa: F811
    dag = sensor_dag(s3_place)
    timer = later(1.0, lambda: s3_place.touch("landing", SINK, str(EPOCH), "_SUCCESS"))
    dr = run(dag, DAY)
    timer.join()
    assert dr.state == "success"
    assert ti_states(dag.dag_id, dr.run_id)["wait"] == ("success", 1)


def test_poke_mode_fails_at_once_on_a_failed_marker(airflow_home: Path, s3_place: S3Place) -> None:  # noqa: F811
    s3_place.touch("landing", SINK, str(EPOCH), "_SUCCESS")
    s3_place.touch("landing", SINK, str(EPOCH), "_FAILED")
    dag = sensor_dag(s3_place)
    dr = run(dag, DAY)
    assert dr.state == "failed"
    assert ti_states(dag.dag_id, dr.run_id)["wait"] == ("failed", 1)


def test_poke_mode_waits_through_an_s3_outage_instead_of_reading_absent(
    airflow_home: Path,
    s3_place: S3Place,  # noqa: F811
    seaweed: SeaweedFS,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The store is down when the sensor starts: each poke is "unreadable this time", not "no
    _FAILED", not a failure; once the store is back, the marker that was there all along counts."""
    s3_place.touch("landing", SINK, str(EPOCH), "_FAILED")
    pokes: list[bool] = []
    real_poke = CheckpointSensor.poke

    def observed_poke(self: CheckpointSensor, context: Any) -> bool:
        answer = real_poke(self, context)
        pokes.append(answer)
        return answer

    monkeypatch.setattr(CheckpointSensor, "poke", observed_poke)

    def restart_after_two_pokes() -> None:  # the outage lasts until the sensor has met it twice
        deadline = time.monotonic() + 60
        while len(pokes) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        seaweed.start()

    dag = sensor_dag(s3_place)
    seaweed.stop()
    restart = threading.Thread(target=restart_after_two_pokes, daemon=True)
    restart.start()
    try:
        dr = run(dag, DAY)
    finally:
        restart.join(90)
        if not seaweed.running:
            seaweed.start()
    assert pokes[:2] == [False, False]  # "not known yet" while the store was down, never a decision
    assert dr.state == "failed"  # the _FAILED marker, read once the store answered again
    # Airflow's task loggers write through structlog to stdout.
    assert "unreadable this time" in capsys.readouterr().out


def test_deferrable_sensor_waits_in_the_trigger_for_the_marker_on_s3(
    airflow_home: Path,
    s3_place: S3Place,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[dict[str, Any]] = []
    real_run = CheckpointTrigger.run

    async def observed_run(self: CheckpointTrigger) -> Any:
        started.append(self.serialize()[1])
        async for event in real_run(self):
            yield event

    monkeypatch.setattr(CheckpointTrigger, "run", observed_run)

    def upstream() -> None:  # writes the marker only once the sensor has deferred
        deadline = time.monotonic() + 60
        while not started and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        s3_place.touch("landing", SINK, str(EPOCH), "_SUCCESS")

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    dag = sensor_dag(s3_place, deferrable=True)
    dr = run(dag, DAY)
    thread.join(5)

    assert dr.state == "success"
    assert ti_states(dag.dag_id, dr.run_id)["wait"] == ("success", 1)
    [kwargs] = started
    # What the triggerer is handed (and Airflow stores in its trigger table) names the connection only.
    assert kwargs["checkpoint"]["storage_conn_id"] == s3_place.conn_id
    assert SECRET_KEY not in json.dumps(kwargs)


async def first_event(trigger: CheckpointTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("no event")


def test_the_trigger_reports_an_s3_outage_as_a_retryable_error(s3_place: S3Place, seaweed: SeaweedFS) -> None:  # noqa: F811
    s3_place.touch("landing", SINK, str(EPOCH), "_SUCCESS")
    trigger = CheckpointTrigger(
        sink_id=SINK,
        epoch=EPOCH,
        checkpoint=markers(s3_place).model_dump(mode="json"),
        poll_interval=0.1,
        retryable_errors_fail_after=2,
        timeout_at=time.time() + 120,
    )
    with SeaweedDown(seaweed):
        event = asyncio.run(first_event(trigger))
    assert event["status"] == "ERROR" and event["retryable"] is True, event
    assert "SinkUnavailable" in event["error"] and SECRET_KEY not in event["error"]
    # Back up: the same trigger, rebuilt, reads the marker that was there all along.
    assert asyncio.run(first_event(trigger))["status"] == "COMPLETED"


def test_the_trigger_polls_on_through_a_short_outage(s3_place: S3Place, seaweed: SeaweedFS) -> None:  # noqa: F811
    s3_place.touch("landing", SINK, str(EPOCH), "_FAILED")
    trigger = CheckpointTrigger(
        sink_id=SINK,
        epoch=EPOCH,
        checkpoint=markers(s3_place).model_dump(mode="json"),
        poll_interval=0.2,
        timeout_at=time.time() + 120,
    )
    seaweed.stop()
    restart = later(2.0, seaweed.start)
    try:
        event = asyncio.run(first_event(trigger))
    finally:
        restart.join()
        if not seaweed.running:
            seaweed.start()
    assert event["status"] == "FAILED", event
