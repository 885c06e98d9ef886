"""``eo-sink epochs`` and ``show`` name each epoch's day: its data interval, and the run that wrote it
with that run's logical date, which is what ``airflow tasks clear -s``/``-e`` selects a run by."""

from __future__ import annotations

import io

from airflow_provider_exactly_once.cli.main import EXIT_OK, main
from tests.operations.test_run_dates import (
    BACKFILLED_2,
    E_DAY_1,
    E_DAY_2,
    TESTED_1,
    TESTED_2,
    _persist,
)
from tests.support.airflow_world import World


def run_main(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    assert code == EXIT_OK, err.getvalue()
    return out.getvalue()


def test_epochs_lists_each_days_interval_beside_its_run_and_logical_date(world: World) -> None:
    _persist(world, E_DAY_1, "manual__day1", TESTED_1)
    _persist(world, E_DAY_2, "manual__day2", TESTED_2)
    out = run_main("epochs", world.sink_id, "--url", world.pipeline.meta_url)
    header, _, *rows = out.splitlines()
    assert header.split()[:4] == ["sink", "epoch", "data", "interval"] and "logical date" in header
    by_epoch = {int(row.split()[2].strip("()")): row for row in rows if row.startswith(world.sink_id)}
    assert by_epoch[E_DAY_2].split()[1] == "2024-06-01T00:00Z"  # the epoch as its day, its id beside
    assert "[2024-06-01T00:00Z, 2024-06-02T00:00Z)" in by_epoch[E_DAY_2]
    assert "manual__day2" in by_epoch[E_DAY_2] and by_epoch[E_DAY_2].split()[-1] == "2024-06-02T00:00Z"
    assert "[2024-05-31T00:00Z, 2024-06-01T00:00Z)" in by_epoch[E_DAY_1]
    assert by_epoch[E_DAY_1].split()[-1] == "2024-06-01T00:00Z"


def test_show_gives_the_interval_the_logical_date_and_each_revisions_own(world: World) -> None:
    _persist(world, E_DAY_2, "manual__day2", TESTED_2, generation="2026-01-01T00:00:00.000000Z/0000000000")
    _persist(world, E_DAY_2, "backfill__day2", BACKFILLED_2, generation="2026-01-02T00:00:00.000000Z/0000000001")
    out = run_main("show", world.sink_id, str(E_DAY_2), "--url", world.pipeline.meta_url)
    fields = dict(line.split(None, 1) for line in out.split("\n\n")[0].splitlines()[2:] if len(line.split()) > 1)
    assert fields["data_interval"] == "[2024-06-01T00:00Z, 2024-06-02T00:00Z)"
    assert (fields["run_id"], fields["logical_date"]) == ("backfill__day2", "2024-06-01T00:00Z")
    revisions = out.split("\n\n")[-1].splitlines()
    assert "logical date" in revisions[0]
    [replaced] = [line for line in revisions if line.startswith("0 ")]
    [current] = [line for line in revisions if line.startswith("1 ")]
    assert "manual__day2" in replaced and "2024-06-02T00:00Z" in replaced
    assert "backfill__day2" in current and "2024-06-01T00:00Z" in current


def test_without_a_record_the_interval_end_is_unknown_and_said_so(world: World) -> None:
    _persist(world, E_DAY_2, "scheduled__old", None)
    out = run_main("epochs", world.sink_id, "--url", world.pipeline.meta_url)
    assert "[2024-06-01T00:00Z, ...)" in out
