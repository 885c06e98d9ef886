"""The example DAGs: they import cleanly, and each runs end to end with real Spark (spark-submit,
``local[2]``), a real meta store, a real pyiceberg SQL catalog and real files, leaving every landed
row in the sink exactly once.

Each DAG runs in a child process with a world of its own (``tests/dags/run_example.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def example(tmp_path: Path, *args: str, timeout: int = 900) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_EXAMPLES", "EXACTLY_ONCE"))}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "tests.dags.run_example", str(tmp_path / "world"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT-JSON ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-6000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT-JSON "))
    return result


def test_example_dags_import_cleanly_without_side_effects(tmp_path: Path) -> None:
    result = example(tmp_path, "parse", timeout=300)
    assert result.pop("written_by_import") == []
    assert {name: r["errors"] for name, r in result.items()} == {
        "hourly_events.py": {},
        "fan_out.py": {},
        "file_sink.py": {},
        "purchases_silver.py": {},
        "audited_orders.py": {},
    }
    # every task is the epoch group's, built from one call
    group = ["abort", "commit", "persist", "settled", "wait_for_checkpoint", "write"]
    assert result["hourly_events.py"]["dags"] == {
        "exactly_once_hourly_events": sorted(f"events.{t}" for t in ["create_table", *group])
    }
    assert result["fan_out.py"]["dags"] == {
        "exactly_once_fan_out": sorted(
            f"events.{t}" for t in ["create_events_by_day", "create_events_by_type", "create_purchases", *group]
        )
    }
    assert result["file_sink.py"]["dags"] == {"exactly_once_file_sink": sorted(f"events.{t}" for t in group)}
    audited = ["abort", "amounts_positive", "audit_checks", "audit_commit", "persist", "publish"]
    assert result["audited_orders.py"]["dags"] == {
        "audited_orders": sorted(
            [
                *(f"exactly_once_audited_orders.{t}" for t in audited if t != "amounts_positive"),
                "exactly_once_audited_orders.wait_for_checkpoint",
                "exactly_once_audited_orders.write",
            ]
        )
    }
    assert result["purchases_silver.py"]["dags"] == {
        "exactly_once_purchases_silver": sorted(
            f"purchases.{t}" for t in ["abort", "commit", "create_table", "persist", "wait_for_checkpoint", "write"]
        )
    }


@pytest.mark.spark
def test_hourly_events_lands_every_hour_once_and_a_rerun_replaces_its_hour(tmp_path: Path) -> None:
    result = example(tmp_path, "run", "hourly_events.py", "2", "rerun")
    assert [r["state"] for r in result["runs"]] == ["success"] * 3
    assert result["runs"][2]["tasks"]["events.commit"][0] == "success"  # the rerun wrote again...
    table = result["tables"]["examples.events"]
    landed = result["landed"]
    assert table["rows"] == table["distinct_ids"] == sum(landed.values())  # ...and replaced its hour
    assert table["by_hour"] == result["landed_by_hour"]
    rerun = max(landed)  # a newer generation of the last hour: one more snapshot, the revision's
    assert table["marker_snapshots"] == {hour: 2 if hour == rerun else 1 for hour in landed}
    assert table["snapshots"] == 3
    # one metadata file per commit after the table's first: the table task of each run left none
    assert table["metadata_files"] == table["snapshots"] + 1
    assert table["partition_fields"] == ["event_day"]
    assert result["epochs"] == dict.fromkeys(landed, "Committed")


@pytest.mark.spark
def test_fan_out_writes_every_table_in_one_job_and_commits_them_as_one_epoch(tmp_path: Path) -> None:
    result = example(tmp_path, "run", "fan_out.py", "1")
    assert [r["state"] for r in result["runs"]] == ["success"], result["runs"]
    assert result["runs"][0]["tasks"]["events.write"] == ["success", 1]  # every table by one try of one task
    ((epoch, landed),) = result["landed"].items()
    by_type = result["landed_ids_by_type"]
    every_id = sorted(i for ids in by_type.values() for i in ids)
    assert len(every_id) == landed and by_type["purchase"], by_type
    expected = {
        "examples.events_by_day": (every_id, ["event_day"]),
        "examples.events_by_type": (every_id, ["event_type"]),
        "examples.purchases": (by_type["purchase"], ["event_day"]),  # its select: purchases only
    }
    assert set(result["tables"]) == set(expected)
    for name, (ids, partition) in expected.items():
        table = result["tables"][name]
        assert table["ids"] == ids, name
        assert table["marker_snapshots"] == {epoch: 1} and table["snapshots"] == 1, name
        assert table["partition_fields"] == partition, name
    assert result["epochs"] == {epoch: "Committed"}


@pytest.mark.spark
def test_file_sink_moves_the_hour_to_final_names_once(tmp_path: Path) -> None:
    result = example(tmp_path, "run", "file_sink.py", "1")
    assert [r["state"] for r in result["runs"]] == ["success"]
    ((epoch, landed),) = result["landed"].items()
    files = result["files"]
    assert files["rows"] == files["distinct_ids"] == landed
    assert files["final_files"] and all(f.split("/")[-1].startswith(f"{epoch}-") for f in files["final_files"])
    assert {f.split("/")[0] for f in files["final_files"]} <= {f"event_type={t}" for t in ("view", "click", "purchase")}
    assert files["staging_left"] == []
    assert result["epochs"] == {epoch: "Committed"}


@pytest.mark.spark
def test_purchases_silver_reads_each_bronze_append_once(tmp_path: Path) -> None:
    """Bronze's first hour, the silver's run, bronze's second hour, the silver's next run: each
    silver epoch reads the bronze snapshots added since the last, every purchase lands once."""
    result = example(tmp_path, "silver")
    assert [r["state"] for r in result["runs"]] == ["success"] * 4, result["runs"]
    bronze, silver = result["bronze_purchases"], result["silver_purchases"]
    assert result["second_hour_purchases"] > 0 and len(bronze) > result["second_hour_purchases"]
    assert silver == bronze  # every purchase once
    assert result["silver_rows"] == len(silver)  # the select kept purchases only
    first, second = result["epochs"].values()
    assert first["status"] == second["status"] == "Committed"
    *_, hour_one, hour_two = result["bronze_snapshots"]
    assert (first["positions"]["after_snapshot_id"], first["positions"]["to_snapshot_id"]) == (None, hour_one)
    assert (second["positions"]["after_snapshot_id"], second["positions"]["to_snapshot_id"]) == (hour_one, hour_two)
    assert second["rows"] == result["second_hour_purchases"]
    assert result["silver_consumed_to"] == [str(hour_one), str(hour_two)]
