"""``eo-sink status`` names a run that will never finish and says how to fail it and what to run
after (issue 55), from a real Airflow metadata database (the session's, runs made through its ORM);
says "runs not checked" and still answers when Airflow's database cannot be reached; refuses a
threshold that is no duration, naming the option. The world is ``test_stale_runs``'s."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_eo_sink import EO_SINK, run_main
from tests.operations.helpers import SILVER_DAG
from tests.operations.test_stale_runs import E6, appends, stuck_world
from tests.recovery.helpers import E2, E5
from tests.support.airflow_world import World
from tests.support.builders import free_port


def test_status_warns_of_each_run_that_will_never_finish(
    world: World, airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.internal:8080")
    runs = stuck_world(world)
    url = world.pipeline.meta_url
    code, out, err = run_main("status", world.sink_id, "--url", url)
    assert code == 0, err
    warning = out.split("\n\n", 1)[1]
    assert warning.startswith(f"warning: sink {world.sink_id} epoch 2023-11-15T00:13:20Z ({E2}) (Reserved): ")
    assert f"run {runs.killed} of DAG {SILVER_DAG} is 'running' in Airflow with no live task, idle for 3h" in warning
    assert "the Airflow UI's 'Mark as failed' on the run" in warning
    quoted = runs.killed.replace(":", "%3A")
    assert (
        f'PATCH http://airflow.internal:8080/api/v2/dags/{SILVER_DAG}/dagRuns/{quoted} {{"state": "failed"}}' in warning
    )
    assert f"eo-sink abort {world.sink_id} {E2} --reason 'run {runs.killed} will never finish'" in warning
    assert "runs not checked" not in out

    code, out, err = run_main("status", "--url", url, "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["runs_not_checked"] is None and answer["threshold_minutes"] == 60
    ours = {(s["sink_id"], s["epoch"]): s for s in answer["stale_runs"] if s["sink_id"].startswith(world.sink_id)}
    assert sorted(ours) == sorted(
        [(world.sink_id, E2), (appends(world), E2), (appends(world), E5), (appends(world), E6)]
    )
    lost = ours[(appends(world), E5)]
    assert (lost["run_id"], lost["then"], lost["fail_run"]["body"]) == (runs.lost, None, {"state": "failed"})


def test_status_says_runs_not_checked_when_airflows_database_is_unreachable(world: World, airflow_home: Path) -> None:
    stuck_world(world)
    env = dict(os.environ)
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"postgresql+psycopg2://airflow@127.0.0.1:{free_port()}/airflow"
    done = subprocess.run(
        [str(EO_SINK), "status", world.sink_id, "--url", world.pipeline.meta_url],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2].startswith(world.sink_id)  # the sinks, answered
    assert "\nruns not checked: OperationalError: " in done.stdout and "warning:" not in done.stdout


def test_a_threshold_that_is_no_duration_is_refused_naming_the_option(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__STALE_RUN_MINUTES", "an hour")
    code, out, err = run_main("status", "--url", world.pipeline.meta_url)
    assert code == 1 and out == ""
    assert "[exactly_once] stale_run_minutes = 'an hour': give a number of minutes greater than 0" in err
