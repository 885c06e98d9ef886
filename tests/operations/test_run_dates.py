"""Each epoch's data interval and the logical date of the run that wrote it, as the views show them:
what an operator selects a run by (``airflow tasks clear -s``, ``backfill create --from-date``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.operations import SinkOperations
from airflow_provider_exactly_once.store.registry import RunDates
from tests.operations.helpers import write
from tests.support.airflow_world import World

DAG = "orders"
DAY_1 = datetime(2024, 5, 31, tzinfo=UTC)
DAY_2 = DAY_1 + timedelta(days=1)
E_DAY_1, E_DAY_2 = (int(d.timestamp() * 1000) for d in (DAY_1, DAY_2))
#: ``dags test orders 2024-06-01`` and ``2024-06-02``: each logical date is the interval's end.
TESTED_1 = RunDates(DAY_2, DAY_1, DAY_2)
TESTED_2 = RunDates(DAY_2 + timedelta(days=1), DAY_2, DAY_2 + timedelta(days=1))
#: A backfill of the day 2024-06-01: its logical date is the interval's start.
BACKFILLED_2 = RunDates(DAY_2, DAY_2, DAY_2 + timedelta(days=1))


def _persist(world: World, epoch: int, run_id: str, dates: RunDates | None, generation: str | None = None) -> None:
    store = world.pipeline.store
    if dates is not None:
        store.runs.record(DAG, run_id, dates)
    pre = write(world, epoch).model_copy(update={"generation": generation})
    coordinator = world.pipeline.coordinator(
        world.sink_id, world.pipeline.iceberg_committer(), on_reprocess={world.sink_id: "replace"}
    )
    coordinator.persist(pre, run_id=run_id, try_number=1, dag_id=DAG)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    coordinator.commit(world.sink_id, epoch)


def test_every_epoch_shows_its_interval_and_the_logical_date_of_its_run(world: World) -> None:
    _persist(world, E_DAY_1, "manual__1", TESTED_1)
    _persist(world, E_DAY_2, "manual__2", TESTED_2)
    views = {v.epoch: v for v in SinkOperations(world.pipeline.store).epochs(sink_id=world.sink_id)}
    # The day 2024-06-01 was run with the logical date 2024-06-02: the date that selects its run.
    assert (views[E_DAY_2].interval_start, views[E_DAY_2].interval_end) == (DAY_2, DAY_2 + timedelta(days=1))
    assert views[E_DAY_2].logical_date == DAY_2 + timedelta(days=1)
    assert (views[E_DAY_1].interval_start, views[E_DAY_1].interval_end, views[E_DAY_1].logical_date) == (
        DAY_1,
        DAY_2,
        DAY_2,
    )
    shown = views[E_DAY_2].model_dump(mode="json")
    assert (shown["interval_start"], shown["interval_end"], shown["logical_date"]) == (
        "2024-06-01T00:00:00+00:00",
        "2024-06-02T00:00:00+00:00",
        "2024-06-02T00:00:00+00:00",
    )


def test_each_revision_shows_the_logical_date_of_its_own_run(world: World) -> None:
    _persist(world, E_DAY_2, "manual__2", TESTED_2, generation="2026-01-01T00:00:00.000000Z/0000000000")
    _persist(world, E_DAY_2, "backfill__2", BACKFILLED_2, generation="2026-01-02T00:00:00.000000Z/0000000001")
    view = SinkOperations(world.pipeline.store).epoch(world.sink_id, E_DAY_2)
    assert (view.revision, view.run_id, view.logical_date) == (1, "backfill__2", DAY_2)
    assert [(r.revision, r.status, r.run_id, r.logical_date) for r in view.revisions] == [
        (0, "Replaced", "manual__2", DAY_2 + timedelta(days=1)),
        (1, "Committed", "backfill__2", DAY_2),
    ]
    assert view.model_dump(mode="json")["revisions"][0]["logical_date"] == "2024-06-02T00:00:00+00:00"


def test_without_a_record_of_the_run_the_interval_start_is_the_epochs_and_the_rest_unknown(world: World) -> None:
    """Rows persisted before migration 0008, or outside a DAG run."""
    _persist(world, E_DAY_2, "scheduled__old", None)
    view = SinkOperations(world.pipeline.store).epoch(world.sink_id, E_DAY_2)
    assert (view.interval_start, view.interval_end, view.logical_date) == (DAY_2, None, None)
    assert [r.logical_date for r in view.revisions] == [None] * len(view.revisions)


def test_a_run_without_a_data_interval_shows_none_rather_than_the_epoch_as_a_date(world: World) -> None:
    """An allocated epoch is a number, not an instant: the recorded run says it had no interval."""
    triggered = RunDates(None, None, None)
    _persist(world, 42, "manual__no_interval", triggered)
    [view] = SinkOperations(world.pipeline.store).epochs(sink_id=world.sink_id)
    assert (view.epoch, view.interval_start, view.interval_end, view.logical_date) == (42, None, None, None)
