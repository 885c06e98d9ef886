"""The demo end to end on a small configuration (four hours: one per scenario), in its own process:
real ``dag.test()`` runs, real spark-submit (``local[2]``), real SQLite meta store and catalog."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_exactly_once.demo import run, world

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.spark
@pytest.mark.slow
def test_demo_agrees_with_the_landed_input(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_EXAMPLES", "EXACTLY_ONCE"))}
    done = subprocess.run(
        [sys.executable, "-m", "airflow_provider_exactly_once.demo", "--root", str(tmp_path / "demo"), "--hours", "4"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-4000:]
    assert "RESULT: OK" in out
    rows = {
        m["scenario"].strip(): (int(m["landed"]), int(m["in_table"]), int(m["snapshots"]), m["after"].strip(), m["now"])
        for m in re.finditer(
            r"^2024-05-01 \d\d:00 (?P<scenario>.{24}) +(?P<landed>\d+) +(?P<in_table>\d+) +(?P<snapshots>\d+)  "
            r"(?P<after>.{26}) (?P<now>\w+)$",
            out,
            re.MULTILINE,
        )
    }
    assert set(rows) == set(run.SCENARIOS), out
    for scenario, (landed, in_table, snapshots, _after, now) in rows.items():
        if scenario == "failed checkpoint":
            assert (in_table, snapshots, now) == (0, 0, "Aborted")
        else:
            assert (in_table, snapshots, now) == (landed, 1, "Committed"), scenario
    # The crash really happened between the Iceberg commit and the mark, and recovery finished it.
    assert rows["crash at commit.visible"][3] == "Pending (commit decided)"
    assert "transform=success(try 2)" in out
    assert (tmp_path / "demo" / "demo.log").stat().st_size > 0


def test_a_scenario_that_did_not_happen_is_reported() -> None:
    """The summary's checks can fail: a crash run whose commit succeeded proves nothing."""
    hour = run.Hour(dt.datetime(2024, 5, 1, 3, tzinfo=dt.UTC), "crash at commit.visible", 10)
    hour.run = world.RunResult("r", "success", {"events.commit": ("success", 1)}, hour.start)
    hour.status_after_run = "Committed"
    assert run.scenario_problems(hour)
    hour.run = world.RunResult("r", "failed", {"events.commit": ("failed", 2)}, hour.start)
    hour.status_after_run = "Pending (commit decided)"
    assert run.scenario_problems(hour) == []

    retried = run.Hour(hour.start, "retried write", 10)
    retried.run = world.RunResult("r", "success", {"transform": ("success", 1)}, hour.start)
    assert run.scenario_problems(retried)


def test_the_demo_refuses_to_wipe_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not made by the demo"):
        run.prepare_root(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    fresh = run.prepare_root(tmp_path / "demo")
    (fresh / "left-over").write_text("x")
    assert list(run.prepare_root(fresh).iterdir()) == [fresh / run.STAMP]
