"""``eo-sink`` tells what went wrong with an epoch (issue 55): a failed task's event as its sentence
with its log in Airflow (linked where ``[api] base_url`` is configured, else its DAG, run, task and
try), a reserved epoch without a row listed and shown with its range and run, an aborted one with the
later epoch that read its range; epochs as dates with their ids beside. Real meta stores (SQLite and
PostgreSQL), the command in process (``main``), Airflow's configuration from the environment as a
deployment sets it."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, acting, run_failure
from tests.cli.test_eo_sink import run_main
from tests.operations.helpers import (
    SILVER_DAG,
    coordinator,
    fail,
    incremental,
    persist_range,
    reserve,
    task_actor,
)
from tests.recovery.helpers import E1, E2, E3
from tests.support.airflow_world import World

CAST_OVERFLOW = 'SparkArithmeticException: [CAST_OVERFLOW] The value 1.0E32D of the type "DOUBLE" cannot be cast'
AIRFLOW = "http://airflow.internal:8080"


def _run(epoch: int) -> str:
    return f"scheduled__{epoch}+00:00"


def _fields(out: str) -> dict[str, str]:
    """The ``field value`` table of ``show``."""
    lines = out.split("\n\n")[0].splitlines()[2:]
    return {line.split(None, 1)[0]: line.split(None, 1)[1].strip() for line in lines if len(line.split(None, 1)) == 2}


@pytest.fixture
def killed(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """An incremental sink: E1 committed, E2's range reserved by a run whose write failed on try 3
    (no row), Airflow's base URL not configured."""
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    incremental(world)
    store = world.pipeline.store
    persist_range(world, E1, reserve(world, E1, 100, _run(E1)), _run(E1))
    store.checkpoints.set_checkpoint(world.sink_id, E1, CheckpointStatus.COMPLETED)
    coordinator(world).commit(world.sink_id, E1)
    reserve(world, E2, 200, _run(E2))
    fail(world, E2, "exactly_once_silver.write", _run(E2), CAST_OVERFLOW, try_number=3)
    return world


def test_a_reserved_epoch_is_listed_and_shown_with_its_range_its_run_and_its_failure(killed: World) -> None:
    url, sink_id = killed.pipeline.meta_url, killed.sink_id
    code, out, err = run_main("epochs", sink_id, "--url", url)
    assert code == 0, err
    rows = [row for row in out.splitlines() if row.startswith(sink_id)]
    assert rows[0].split()[1:4] == ["2023-11-15T00:13:20Z", f"({E2})", "[2023-11-15T00:13:20Z,"]
    assert " Reserved " in rows[0] and _run(E2) in rows[0] and "write failed on try 3" in rows[0]

    code, out, err = run_main("show", sink_id, str(E2), "--url", url)
    assert code == 0, err
    fields = _fields(out)
    assert fields["epoch"] == f"2023-11-15T00:13:20Z ({E2})"
    assert (fields["status"], fields["dag_id"], fields["run_id"]) == ("Reserved", SILVER_DAG, _run(E2))
    assert fields["consumed"] == "bronze.orders: after snapshot 100 to snapshot 200"
    assert fields["reserved"].startswith(f"position 1 by run {_run(E2)} at ")
    assert fields["checkpoint"] == "COMPLETED (range reserved)"
    assert fields["error"] == f"write failed on try 3: {CAST_OVERFLOW}"
    assert fields["log"] == f"log in Airflow: DAG {SILVER_DAG}, run {_run(E2)}, task exactly_once_silver.write, try 3"

    code, out, err = run_main("epochs", sink_id, "--url", url, "--status", "reserved", "--json")
    assert code == 0, err
    [reserved] = json.loads(out)["epochs"]
    assert (reserved["epoch"], reserved["status"], reserved["reservation"]["position"]) == (E2, "Reserved", 1)
    code, out, err = run_main("status", sink_id, "--url", url, "--json")
    assert json.loads(out)["sinks"][0]["reserved"] == 1


def test_the_failed_tasks_log_is_linked_where_airflow_is_configured(
    killed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", AIRFLOW + "/")
    url, sink_id = killed.pipeline.meta_url, killed.sink_id
    log = f"{AIRFLOW}/dags/{SILVER_DAG}/runs/{quote(_run(E2))}/tasks/exactly_once_silver.write?try_number=3"
    code, out, err = run_main("show", sink_id, str(E2), "--url", url)
    assert code == 0, err
    assert _fields(out)["log"] == log
    code, out, err = run_main("show", sink_id, str(E2), "--url", url, "--json")
    assert json.loads(out)["epoch"]["cause"]["log_url"] == log

    code, out, err = run_main("history", sink_id, str(E2), "--url", url, "--json")
    assert code == 0, err
    [event] = json.loads(out)["history"]
    assert (event["event"], event["step"], event["task_id"]) == (
        "error",
        f"write failed on try 3: {CAST_OVERFLOW}",
        "exactly_once_silver.write",
    )
    assert event["log_url"] == log
    code, out, err = run_main("history", sink_id, str(E2), "--url", url)
    assert code == 0, err
    assert f"write failed on try 3: {CAST_OVERFLOW}" in out and log in out


def test_an_aborted_epoch_says_why_and_which_later_epoch_read_its_range(killed: World) -> None:
    """The run's abort composes its reason from the write's failure (design.md D22); the next
    epoch reads the range again and commits it."""
    url, sink_id, store = killed.pipeline.meta_url, killed.sink_id, killed.pipeline.store
    reason = run_failure(store.history.events(sink_id, E2), _run(E2))
    assert reason is not None
    with acting(task_actor("exactly_once_silver.abort", _run(E2))):
        coordinator(killed).abort(sink_id, E2, reason=reason, dag_id=SILVER_DAG)
    persist_range(killed, E3, reserve(killed, E3, 300, _run(E3)), _run(E3))
    store.checkpoints.set_checkpoint(sink_id, E3, CheckpointStatus.COMPLETED)
    coordinator(killed).commit(sink_id, E3)

    code, out, err = run_main("show", sink_id, str(E2), "--url", url)
    assert code == 0, err
    fields = _fields(out)
    assert (fields["status"], fields["error"]) == ("Aborted", f"write failed on try 3: {CAST_OVERFLOW}")
    assert fields["log"].endswith("task exactly_once_silver.write, try 3")
    assert fields["consumed"] == "bronze.orders: after snapshot 100 to snapshot 200"
    assert fields["range_read_again"] == f"read again by epoch {E3} (Committed)"

    code, out, err = run_main("history", sink_id, str(E2), "--url", url)
    assert code == 0, err
    assert "range read again" in out and f"epoch {E3} reserved its range" in out
    assert "an upstream step failed" not in out
