"""The fault-injection harness under the real Airflow scheduler (the CI version; docs/faults.md).

One cluster for the module: api-server, scheduler (LocalExecutor), dag-processor and triggerer as
subprocesses, Airflow's metadata DB on the PostgreSQL at 127.0.0.1:5432, the meta store on its own
PostgreSQL server. The named scenarios CI runs run once, at the same time, each on its own pipeline
(the fixed-seed random plan has a file and a cluster of its own, ``test_fault_harness_random.py``);
each table is judged from its input alone (an upsert pipeline's against the key model its
checkpointed hours' changes add up to). The Spark-write scenario
uses real spark-submit, the Connect ones the stack's Spark Connect server; the others the light
writer (real Parquet files written with pyarrow).
The reprocessing scenarios land committed hours anew and re-run them (CLI clear, reprocess
backfills, the REST API), so their epochs are replaced by revisions. Nothing is mocked.
"""

from __future__ import annotations

from typing import Any

import pytest

from fault_harness.cluster import Cluster
from fault_harness.runner import run_scenarios
from fault_harness.scenarios import AUDIT_POINTS, named_scenarios, scenarios_for
from tests.fault_harness.reports import failures

pytestmark = pytest.mark.postgres

#: The named scenarios CI runs, at once: those whose mechanism the fixed-seed random plan
#: (``test_fault_harness_random.py``) does not draw (a zombie committer, a foreign writer, a meta-store outage held across commits, a
#: failed checkpoint beside a completed one, a reprocess backfill, a revision given up, a compaction
#: between an upsert epoch's write and its commit, kills inside a fan-out's one database transaction
#: on the SQL catalog with a reader loading its tables throughout, an audited pipeline killed at each step
#: write, audit, publish adds with one hour failing its audit). Every named scenario is the long run:
#: ``uv run --frozen pytest -m long tests/fault_harness`` or ``scripts/faults --scenario all``.
CI_SCENARIOS = [
    "zombie",
    "other_writer",
    "meta_store_outage",
    "failed_checkpoint",
    "reprocess_completed",
    "revision_given_up",
    "upsert_compaction",
    "incremental_kills_short",
    "fan_out_kill_transaction",
    "audit_kill_points",
]


# The runs take minutes under a real scheduler (17 min for the named scenarios on a loaded
# 2-core machine before the reprocessing ones were added); the project's 600 s default per test
# would cut them off.
@pytest.mark.timeout(1800)
def test_the_ci_scenarios_end_with_no_anomaly(fault_cluster: Cluster) -> None:
    scenarios, skipped = scenarios_for("local", CI_SCENARIOS)
    assert not skipped and [s.name for s in scenarios] == CI_SCENARIOS
    check_named_results(run_scenarios(fault_cluster, scenarios, timeout=1500))


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_every_named_scenario_ends_with_no_anomaly(fault_cluster: Cluster) -> None:
    # The 50-epoch incremental_kills runs its epochs one after the other (about 25 s each): its own
    # long run (scripts/faults --scenario incremental_kills); its 6-epoch form runs here.
    scenarios, _production_only = scenarios_for("local", [n for n in named_scenarios() if n != "incremental_kills"])
    results = check_named_results(run_scenarios(fault_cluster, scenarios, timeout=2700))
    for name in (
        "kill_spark_write",
        "kill_connect_write",
        "upsert_kill_connect",
        "kill_sensor_wait",
        "kill_scheduler",
        "kill_triggerer",
    ):
        assert results[name]["actions"], f"{name}: no action was taken"


def check_named_results(report: dict[str, Any]) -> dict[str, Any]:
    """What every named scenario that ran must show: no anomaly, its faults done, its tables' counts
    (each checked only where the scenario ran). Returns the results by scenario."""
    assert report["recovery_run"] == "success", failures(report)
    assert report["anomalies"] == 0 and report["action_errors"] == 0, failures(report)
    results: dict[str, Any] = report["scenarios"]
    ran = results.keys()
    # The faults did happen: each action left its note, and the checked tables hold what they should.
    if "meta_store_outage" in ran:
        assert results["meta_store_outage"]["actions"], "meta_store_outage: no action was taken"
    if "zombie" in ran:
        assert any("second committer exited 0" in line for line in results["zombie"]["actions"]), results["zombie"]
    if "other_writer" in ran:
        assert results["other_writer"]["foreign_rows"] > 0
    if "failed_checkpoint" in ran:
        assert results["failed_checkpoint"]["hours"] == {"completed": 1, "failed": 1}
    # Reprocessing: each re-run of a committed epoch is one revision (a marked overwrite snapshot).
    revisions = {name: results[name]["revisions"] for name in results}
    expected_revisions = {
        "clear_successful": 2,
        "reprocess_completed": 2,
        "clear_via_api": 1,
        "kill_during_replacement": 6,
        "incremental_reprocess": 1,
    }
    for name, count in expected_revisions.items():
        if name in ran:
            assert revisions[name] == count, revisions
    for name, relanded in {"reprocess_completed": 2, "clear_via_api": 1}.items():
        if name in ran:
            assert results[name]["relanded_hours"] == relanded, results[name]
    if "kill_during_replacement" in ran:
        actions = results["kill_during_replacement"]["actions"]
        assert any("every armed fault fired (6)" in line for line in actions), actions
    for name, result in results.items():
        if len(result["tables"]) > 1:  # a fan-out: read throughout, its torn states judged (the SQL catalog)
            reads = result["fan_out_reads"]
            assert reads["judged"] and reads["reads"] > 0 and reads["torn_reads"] == 0, (name, reads)
            assert reads["marked_snapshots_read"] >= len(result["tables"]) * result["marked_snapshots"], (name, reads)
    if "fan_out_kill_transaction" in ran:
        actions = results["fan_out_kill_transaction"]["actions"]
        assert any("kills fired in 4 of 4 epochs" in line for line in actions), actions
    if "audit_kill_points" in ran:
        # Write, audit, publish (design.md D23): every passed epoch published once (one marker on
        # main each), the bad hour held on its audit branch with the only audit snapshot left; the
        # bad hour's run failed, the others succeeded.
        audited, points = results["audit_kill_points"], len(AUDIT_POINTS)
        assert any(f"kills fired in {points + 1} of {points + 1} epochs" in a for a in audited["actions"]), audited
        assert audited["marked_snapshots"] == points, audited
        assert audited["hours"] == {"completed": points, "audit_failed": 1}, audited
        audit = audited["audit"]
        assert (audit["published"], audit["held"], audit["audit_snapshots"]) == (points, 1, 1), audit
        assert sorted(audited["runs"].values()) == ["failed"] + ["success"] * points, audited["runs"]
    if "revision_given_up" in ran:
        # A revision given up leaves the first write (checked by the action) and no snapshot.
        given_up = results["revision_given_up"]
        assert (given_up["revisions"], given_up["marked_snapshots"], given_up["relanded_hours"]) == (1, 2, 1), given_up
        assert any("still shows the first write" in line for line in given_up["actions"]), given_up["actions"]
    if "reprocess_failed" in ran:
        # Only the failed epoch was re-opened: three first commits, no revision, every hour completed now.
        failed = results["reprocess_failed"]
        assert (failed["revisions"], failed["marked_snapshots"], failed["hours"]) == (0, 3, {"completed": 3}), failed
    # Upsert pipelines: one marked snapshot per checkpointed hour, the table equal to the key model
    # (the checker's verdict above); the compaction landed between hour 1's write and its commit.
    expected_upserts = {"upsert_kill_commit": 3, "upsert_failed_hour": 2, "upsert_compaction": 2}
    upserts = {name: r["marked_snapshots"] for name, r in results.items() if r["mode"] == "upsert"}
    assert upserts == {name: n for name, n in expected_upserts.items() if name in ran}, upserts
    if "upsert_compaction" in ran:
        compaction = results["upsert_compaction"]["actions"]
        assert any(line.split(" ", 1)[1].startswith("compaction: ") for line in compaction), compaction
    for name, result in results.items():
        if result["mode"] == "incremental":
            # Every upstream row in the sink once (the checker's verdict above), the producer ran,
            # ranges of several snapshots occurred, and each committed epoch's run succeeded.
            figures = result["incremental"]
            assert result["rows_expected"] > 0 and result["rows_visible"] == result["rows_expected"], name
            assert figures["producer"]["appends"] > 0 and max(figures["snapshots_per_committed_range"]) >= 2, figures
            committed = result["hours"].get("Committed", 0)
            assert sum(1 for s in result["runs"].values() if s == "success") == committed, (name, result["runs"])
            if name.startswith("incremental_kills"):
                assert any("kills fired in" in line for line in result["actions"]), result["actions"]
            continue
        completed = result["hours"].get("completed", 0)
        if result["mode"] == "upsert":
            assert result["rows_expected"] > 0, name  # the model's size, not 12 rows an hour
            assert result["runs"] and sum(1 for s in result["runs"].values() if s == "success") == completed, name
            continue
        assert result["rows_expected"] == 12 * completed or result["relanded_hours"], name
        assert result["rows_visible"] - result["foreign_rows"] == result["rows_expected"], name
        assert sum(1 for s in result["runs"].values() if s == "success") >= completed, (name, result["runs"])
    return results
